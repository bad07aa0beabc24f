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
from pg2sink.configfile import PROCESS_OPTIONS

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
    each_pipeline = getattr(args, "each_pipeline", None)  # [pipeline.NAME] tables (cli.main)
    if each_pipeline is not None:
        return _pipelines(args, each_pipeline, stream_config)
    if args.config_action == "check":
        stream_args = parser.parse_args(["stream"])
        options.switches_from_env(stream_args)
        stream_config(stream_args)
        print(f"{args.file}: ok")
        return 0
    stream_config(args)
    print("\n".join(show_lines(args)))
    return 0


def _pipelines(
    args: argparse.Namespace,
    each_pipeline: Callable[..., dict[str, Any]],
    stream_config: Callable[[argparse.Namespace], StreamConfig],
) -> int:
    """`config check|show` of a file with pipelines: each checked as `pg2sink stream`
    would run it, and their names against each other; show prints each one's settings
    under its [pipeline.NAME]."""
    from pg2sink.pipelines import check_distinct

    def built(a: argparse.Namespace) -> tuple[StreamConfig, list[str]]:
        return stream_config(a), show_lines(a)

    check = args.config_action == "check"
    each = each_pipeline(built, ["stream"]) if check else each_pipeline(built)
    check_distinct({name: cfg for name, (cfg, _) in each.items()})
    if check:
        print(f"{args.file}: ok ({len(each)} pipelines: {', '.join(each)})")
        return 0
    # the settings of the whole process first (the same in every pipeline), as in a file
    process = {name.removeprefix("--").replace("-", "_") for name in PROCESS_OPTIONS}
    first = next(iter(each.values()))[1]
    out = [line for line in first if line.partition(" = ")[0] in process]
    for name, (_, lines) in each.items():
        out += ["", f"[pipeline.{name}]"]
        out += [line for line in lines if line.partition(" = ")[0] not in process]
    print("\n".join(out).strip("\n"))
    return 0


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.config_action == "convert":
        from pg2sink.commands.convert import convert

        return convert(args.file, args.output_dir)
    return config_command(args, parser, _stream_config)
