"""Command line: `pg2sink [stream] [OPTIONS]` and the other commands: the parser of every
command (its options come from the config classes), then the command's run
(pg2sink/commands/: the table from a command's name to its function).

Every option can also come from the environment as PG2SINK_<NAME> (upper
case, dashes as underscores; repeatable options take a comma-separated
list). Flags win over the environment, and an environment value is checked
exactly like the flag's (choices, durations, numbers). A single-valued flag
given twice is an error, never "the last one wins". Errors the user can fix
print one line on stderr and exit with code 2; they never quote a connection
string or a client setting beyond its key names.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pg2sink import __version__, commands, configfile, logs, options
from pg2sink.changelog import _cmodule
from pg2sink.commands import configs
from pg2sink.commands import relay as relay_command
from pg2sink.config import Group, LogConfig, SourceConfig, StreamConfig
from pg2sink.errors import ConfigError, Pg2SinkError
from pg2sink.formats.config import FormatConfig
from pg2sink.routing.config import RoutingConfig
from pg2sink.sinks import entries

log = logging.getLogger(__name__)

T = TypeVar("T")

#: the PG2SINK_ variables read outside the options: the encoders' choice, where the
#: services and the Spark class archive are cached
_OTHER_VARIABLES = ("PG2SINK_IMPL", "PG2SINK_SERVICES_CACHE", "PG2SINK_SPARK_CLASS_CACHE")

COMMANDS = tuple(commands.COMMANDS)
EXIT_USAGE = 2

# kept under their old names: tests and main() read a parsed namespace through them
_switches_from_env = options.switches_from_env
_redact = options.redact
_stream_config = configs.stream_config


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # no abbreviated flags: `--sou=x` would be a second spelling of `--source` to
        # validate, and argparse's "ambiguous option" error echoes the value (a secret)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # one line, exit 2
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(_unexpected(extra))
        return parsed


def _unexpected(extra: list[str]) -> str:
    """argparse's "unrecognized arguments" without the words themselves: an unquoted
    DSN (`--source host=x password=a b`) leaves pieces of a password there."""
    flags = [a.partition("=")[0] for a in extra if a.startswith("-")]
    words = len(extra) - len(flags)
    parts = [f"unrecognized arguments: {' '.join(flags)}"] if flags else []
    if words:
        parts.append(
            f"{words} unexpected argument(s), not shown (a value holding spaces needs quotes)"
        )
    return "; ".join(parts)


#: the options of the commands other than stream: the source's own (no publication
#: options); `pg2sink import` and migrate take no -t/-T (import has its own --table)
_SOURCE = options.options_of(SourceConfig, groups=[Group.SOURCE])
_NAMED_SOURCE = options.options_of(
    SourceConfig, groups=[Group.SOURCE], omit=["tables", "exclude_tables"]
)
_LOGGING = options.options_of(LogConfig)
#: every sink's options, from its entry in sinks/entries.py (`pg2sink stream` and `pg2sink relay`)
_SINKS = [
    opt for e in entries.SINKS if e.config is not None for opt in options.options_of(e.config)
]
#: every option of `pg2sink stream`
_STREAM = [
    *options.options_of(SourceConfig),
    *options.options_of(StreamConfig),
    *options.options_of(RoutingConfig),
    *options.options_of(FormatConfig),
    *_SINKS,
    *_LOGGING,
]
#: `pg2sink stream --help`'s groups: the sinks' right after --sink's own
_SINK_GROUPS = [e.group for e in entries.SINKS if e.group is not None]
_STREAM_GROUPS = [
    g for group in Group for g in ([group, *_SINK_GROUPS] if group is Group.SINK else [group])
]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; its options come from the config classes."""
    parser = _Parser(
        prog="pg2sink",
        description="Stream committed PostgreSQL changes (logical replication, pgoutput) "
        "as Schema and Modification records to a sink. `pg2sink [OPTIONS]` is "
        "`pg2sink stream [OPTIONS]`; see `pg2sink stream --help` for its options.",
    )
    parser.add_argument("--version", action="version", version=f"pg2sink {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    stream = sub.add_parser(
        "stream",
        help="stream changes to a sink (the default command)",
        description="Create the publication and slot if missing, keep the publication's "
        "tables in line with --schema/-t/-T, and stream every committed change to the sink. "
        "An LSN is confirmed to PostgreSQL only after the sink durably holds everything "
        "before it; a restart resumes from the slot's confirmed position. The rows a table "
        "holds when it joins are imported (Spark) as IMPORT records, consistently with the "
        "stream (docs/imports.md; --no-imports to stream only).",
    )
    options.add_options(stream, _STREAM, _STREAM_GROUPS)
    replay = sub.add_parser(
        "replay",
        help="stream again from the slot, writing only the changes after --since",
        description="Stream as `pg2sink stream` does, from the slot's confirmed position, "
        "leaving out the changes before --since (a duration before now, or an LSN): with "
        "--wal-retain, the slot keeps that window (docs/replay.md). Stop the running "
        "stream first; replay goes on streaming, and leaves the slot where it was "
        "(--advance-slot: confirms as the stream does), so the window can be replayed again.",
    )
    replay.add_argument(
        "--advance-slot",
        action="store_true",
        help="confirm what the sink holds to the slot, as `pg2sink stream` does (with "
        "--wal-retain, the window behind it); default: the slot stays where it was",
    )
    replay.add_argument(
        "--since",
        required=True,
        metavar="DURATION|LSN",
        help="write the changes committed at most DURATION ago (10m, 1h), or at or after LSN",
    )
    options.add_options(replay, _STREAM, _STREAM_GROUPS)
    config = sub.add_parser(
        "config",
        help="check a configuration file, show the effective settings, or convert a "
        "psql-streamer or wal-listener file, then exit",
        description="`config check FILE`: read FILE (TOML) and check every setting as "
        "`pg2sink stream` would, without connecting. `config show [OPTIONS]`: print the "
        "settings `pg2sink stream` would run with (--config's file, PG2SINK_ variables, "
        "flags), secrets hidden. `config convert FILE`: print psql-streamer's TOML or "
        "wal-listener's config.yml as pg2sink configurations (docs/configuration.md).",
    )
    actions = config.add_subparsers(dest="config_action", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="check FILE without connecting")
    check.add_argument("file", metavar="FILE", help="the TOML file")
    options.add_options(check, _LOGGING, list(Group))
    show = actions.add_parser("show", help="print the effective settings, secrets hidden")
    options.add_options(show, _STREAM, _STREAM_GROUPS)
    convert = actions.add_parser(
        "convert",
        help="print psql-streamer's or wal-listener's FILE as pg2sink configurations",
    )
    convert.add_argument("file", metavar="FILE", help="psql-streamer's TOML or wal-listener's YAML")
    convert.add_argument(
        "--output-dir",
        metavar="DIR",
        help="write each configuration to DIR/NAME.toml (one per source and sink) instead",
    )
    options.add_options(convert, _LOGGING, list(Group))
    _add_source_commands(sub)
    relay_command.add_parser(sub, _SINKS, _SINK_GROUPS, _LOGGING)
    return parser


def _add_source_commands(sub: Any) -> None:
    """The commands that only read or change PostgreSQL: drop, status, migrate, import."""
    drop = sub.add_parser(
        "drop",
        help="drop the replication slot, the publication and the DDL trigger, then exit",
        description="Drop the replication slot and the publication pg2sink uses (when it "
        "manages it: --publication-mode), and the "
        "--capture-ddl event trigger when no other slot uses it, then exit. A slot of "
        "another database than --source's is refused. "
        "Unconfirmed changes in the slot are lost for pg2sink.",
    )
    options.add_options(drop, [*_SOURCE, *_LOGGING], list(Group))
    status = sub.add_parser(
        "status",
        help="show the slot, the publication's tables and the imports, then exit",
        description="Show the replication slot (active, confirmed LSN, lag and WAL retained "
        "on the server, health: wal_status, safe_wal_size, invalidated and why), the "
        "publication (kind, managed or used as it is, tables, actions it leaves out), the "
        "role and what it lacks, and the import jobs, read from PostgreSQL.",
    )
    options.add_options(status, _SOURCE, list(Group))
    # the stream's routing rules, so status can say which of them match nothing
    options.add_options(status, options.options_of(RoutingConfig), list(Group))
    status.add_argument("--json", action="store_true", help="print one JSON object")
    options.add_options(status, _LOGGING, list(Group))
    migrate = sub.add_parser(
        "migrate",
        help="create or upgrade pg2sink's internal schema, then exit",
        description="Apply the SQL migrations (yoyo-migrations) that create or upgrade the "
        "internal schema (--internal-schema). `pg2sink stream` also applies them at start.",
    )
    options.add_options(migrate, [*_NAMED_SOURCE, *_LOGGING], list(Group))
    imp = sub.add_parser(
        "import",
        help="re-import tables (or list the import jobs), then exit",
        description="Expire a table's current import job and create a new one; the running "
        "`pg2sink stream` picks it up (its rows are written as IMPORT records). With --list, "
        "show the import jobs instead.",
    )
    options.add_options(imp, _NAMED_SOURCE, list(Group))
    g = imp.add_argument_group("import")
    g.add_argument(
        "-t",
        "--table",
        dest="import_tables",
        action="append",
        metavar="SCHEMA.TABLE",
        help="table to import again; repeatable",
    )
    g.add_argument("--list", action="store_true", help="list the import jobs")
    g.add_argument("--all", action="store_true", help="with --list, expired jobs too")
    g.add_argument("--json", action="store_true", help="with --list, print JSON")
    options.add_options(imp, _LOGGING, list(Group))


def _normalise_argv(argv: Sequence[str]) -> list[str]:
    """`pg2sink [OPTIONS]` means `pg2sink stream [OPTIONS]`."""
    args = list(argv)
    if not args or (args[0] not in COMMANDS and args[0] not in ("-h", "--help", "--version")):
        return ["stream", *args]
    return args


def _file_values(
    values: Mapping[str, configfile.FileValue],
) -> dict[str, tuple[str | list[str], str]]:
    return {n: (v.text, v.where) for n, v in values.items()}


def _read_config_file(words: list[str]) -> configfile.SettingsFile | None:
    """--config FILE (or `config check FILE`): its values become the options' defaults
    for the parser built next; its secrets are redacted from then on. With --pipeline
    NAME, the values are that pipeline's (its table over the top level)."""
    path = configfile.config_path(words, os.environ)
    if words[:2] == ["config", "check"] and len(words) > 2:
        path = words[2]
    chosen = configfile.word_value(words, "--pipeline") or os.environ.get("PG2SINK_PIPELINE")
    if path is None:
        if chosen:
            raise ConfigError(f"--pipeline {chosen} chooses a [pipeline.NAME] of a --config file")
        return None
    build_parser()  # adds every option: the file's keys
    settings = configfile.load(path, options.file_keys())
    for secret in settings.secrets:
        options.add_secret(secret)
    if settings.password is not None and "PGPASSWORD" not in os.environ:
        os.environ["PGPASSWORD"] = settings.password  # libpq's and the imports' password
    if chosen:
        if chosen not in settings.pipelines:
            names = ", ".join(settings.pipelines) or "none"
            raise ConfigError(f"--pipeline {chosen}: {path} has no [pipeline.{chosen}] ({names})")
        settings = dataclasses.replace(settings, values=settings.merged(chosen), pipelines={})
    options.use_file_values(_file_values(settings.values))
    return settings


def _each_pipeline(
    settings: configfile.SettingsFile,
    words: list[str],
    build: Callable[[argparse.Namespace], T],
    parse: list[str] | None = None,
) -> dict[str, T]:
    """`build` of each [pipeline.NAME]'s arguments: `parse` (default: the command line)
    parsed with the pipeline's values as the file's; ConfigError naming the pipeline."""
    built: dict[str, T] = {}
    try:
        for name in settings.pipelines:
            options.use_file_values(_file_values(settings.merged(name)))
            args = build_parser().parse_args(words if parse is None else parse)
            _switches_from_env(args)
            try:
                built[name] = build(args)
            except ConfigError as e:
                raise ConfigError(f"pipeline {name}: {e}") from None
    finally:
        options.use_file_values(_file_values(settings.values))
    return built


#: the commands that run every pipeline of a file; the others act on one (--pipeline)
_ALL_PIPELINES = ("stream", "config")


def main(argv: Sequence[str] | None = None) -> int:
    words = _normalise_argv(sys.argv[1:] if argv is None else argv)
    try:
        settings = _read_config_file(words)
        parser = build_parser()
        args = parser.parse_args(words)
        if settings is not None and settings.pipelines:
            if args.command not in _ALL_PIPELINES:
                raise ConfigError(
                    f"{settings.path} holds pipelines ({', '.join(settings.pipelines)}): "
                    f"`pg2sink {args.command}` acts on one, choose it with --pipeline NAME"
                )
            # commands/stream.py and commands/config.py build each pipeline's settings
            args.each_pipeline = functools.partial(_each_pipeline, settings, words)
        _switches_from_env(args)
        _cmodule.check()  # PG2SINK_IMPL is checked like the flags' variables
        log_config: LogConfig = options.build(LogConfig, args)
        logs.setup(log_config.log_level, log_config.log_format)
        for line in options.unknown_variables(os.environ, _OTHER_VARIABLES):
            log.warning("%s", line)
        return commands.run(args, parser)
    except Pg2SinkError as e:
        print(f"pg2sink: error: {_redact(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
