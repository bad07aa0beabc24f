"""`pg2sink config check FILE` and `pg2sink config show`: a configuration file checked
as `pg2sink stream` would check it, without connecting; the effective settings printed
as TOML with where each comes from, secrets hidden (docs/configuration.md).
`pg2sink config convert FILE`: psql-streamer's or wal-listener's file as pg2sink
configurations (pg2sink/convert/)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from pg2sink import options
from pg2sink.commands.configs import stream_config as _stream_config
from pg2sink.config import StreamConfig
from pg2sink.convert import convert_file, render, render_all
from pg2sink.convert.model import toml_value
from pg2sink.errors import ConfigError

__all__ = ["config_command", "convert", "run"]


def show_lines(args: argparse.Namespace) -> list[str]:
    """`key = value  # origin` for every stream option set other than by default."""
    lines = []
    for name, opt in sorted(options.added_options().items()):
        if not hasattr(args, opt.field.name):
            continue
        raw = getattr(args, opt.field.name)
        if raw is None or raw == [] or (opt.switch and raw is False):
            continue
        origin = options.origin(opt, args)
        value = "***" if opt.flag.secret else toml_value(raw if not opt.switch else bool(raw))
        lines.append(f"{name.removeprefix('--').replace('-', '_')} = {value}  # {origin}")
    return lines


def config_command(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    stream_config: Callable[[argparse.Namespace], StreamConfig],
) -> int:
    """Run `config check`, `config show` or `config convert`; ConfigError (exit 2) for a
    bad setting."""
    if args.config_action == "convert":
        return convert(args.file, args.output_dir)
    if args.config_action == "check":
        stream_args = parser.parse_args(["stream"])
        options.switches_from_env(stream_args)
        stream_config(stream_args)
        print(f"{args.file}: ok")
        return 0
    stream_config(args)
    print("\n".join(show_lines(args)))
    return 0


def convert(path: str, output_dir: str | None) -> int:
    """Print the configurations converted from `path`, or write each to
    `output_dir/NAME.toml` and print the files' names."""
    conversion = convert_file(path)
    if output_dir is None:
        print(render_all(conversion), end="")
        return 0
    if not conversion.documents:
        raise ConfigError(f"{path}: nothing to convert: {'; '.join(conversion.notes)}")
    directory = Path(output_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for document in conversion.documents:
            target = directory / f"{document.name}.toml"
            target.write_text(render(conversion, document), encoding="utf-8")
            print(target)
    except OSError as e:
        raise ConfigError(f"--output-dir {output_dir}: {e.strerror}") from None
    return 0


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return config_command(args, parser, _stream_config)
