"""`pg2sink config check FILE` and `pg2sink config show`: a configuration file checked
as `pg2sink stream` would check it, without connecting; the effective settings printed
as TOML with where each comes from, secrets hidden (docs/configuration.md).
`pg2sink config convert FILE` runs convert.py (a seed tool's file converted)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from pg2sink import options
from pg2sink.commands.configs import stream_config as _stream_config
from pg2sink.config import StreamConfig

__all__ = ["config_command", "run"]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(str(value))  # a TOML basic string is a JSON string


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
        value = "***" if opt.flag.secret else _toml(raw if not opt.switch else bool(raw))
        lines.append(f"{name.removeprefix('--').replace('-', '_')} = {value}  # {origin}")
    return lines


def config_command(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    stream_config: Callable[[argparse.Namespace], StreamConfig],
) -> int:
    """Run `config check` or `config show`; ConfigError (exit 2) for a bad setting."""
    if args.config_action == "check":
        stream_args = parser.parse_args(["stream"])
        options.switches_from_env(stream_args)
        stream_config(stream_args)
        print(f"{args.file}: ok")
        return 0
    stream_config(args)
    print("\n".join(show_lines(args)))
    return 0


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.config_action == "convert":
        from pg2sink.commands.convert import convert

        return convert(args.file, args.output_dir)
    return config_command(args, parser, _stream_config)
