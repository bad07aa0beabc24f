"""Command line: `pg2sink [stream] [OPTIONS]` and `pg2sink drop`.

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
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pg2sink import __version__, logs
from pg2sink.config import (
    KafkaConfig,
    SecretDsn,
    Settings,
    SourceConfig,
    StreamConfig,
    parse_duration,
    parse_topic_map,
)
from pg2sink.errors import ConfigError, Pg2SinkError

log = logging.getLogger(__name__)

COMMANDS = ("stream", "drop", "status", "migrate", "import")
EXIT_USAGE = 2

# Secrets registered for redaction: logs redact them (logs.add_secret), and so does the
# one error line main() prints itself, which does not pass through logging.
_SECRETS: set[str] = set()


def _add_secret(secret: str | None) -> None:
    if secret:
        _SECRETS.add(secret)
        logs.add_secret(secret)


def _redact(text: str) -> str:
    for secret in _SECRETS:
        text = text.replace(secret, logs.REDACTED)
    return text


def _env_name(flag: str) -> str:
    return "PG2SINK_" + flag.lstrip("-").upper().replace("-", "_")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name}={value!r} is not a boolean (use true or false)")


def _switches_from_env(args: argparse.Namespace) -> None:
    """Switch variables to booleans, each checked whether or not the command uses it.
    After parsing only switches still hold a _FromEnv: other options' pass their type."""
    for name, value in vars(args).items():
        if isinstance(value, _FromEnv):
            setattr(args, name, _bool(value.variable, value))


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


class _Once(argparse.Action):
    """Stores a single-valued option, refusing a second occurrence: with "the last one
    wins", `--source a --source b` once sent pg2sink to the wrong database."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = namespace.__dict__.setdefault("_given", set())
        if self.dest in given:
            raise argparse.ArgumentError(self, "given more than once (it takes one value)")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


class _FromEnv(str):
    """A default read from PG2SINK_<NAME>: argparse converts string defaults with the
    option's type, and the type's error then names the variable."""

    variable = ""


def _checked(convert: Callable[[str], Any] | None, choices: Sequence[str] | None) -> Any:
    """The option's type, checking `choices` too: argparse checks choices only for
    command-line values, never for a default, so PG2SINK_FORMAT=xml passed unchecked."""

    def check(text: str) -> Any:
        try:
            if choices is not None and text not in choices:
                raise argparse.ArgumentTypeError(
                    f"invalid choice: {str(text)!r} (choose from {', '.join(choices)})"
                )
            return convert(str(text)) if convert is not None else str(text)
        except argparse.ArgumentTypeError as e:
            if isinstance(text, _FromEnv):
                raise argparse.ArgumentTypeError(f"{e} (from {text.variable})") from None
            raise

    check.__name__ = getattr(convert, "__name__", "value")  # argparse names it in errors
    return check


#: a comma that starts another KEY=VALUE client setting; any other comma belongs to the
#: value (`bootstrap.servers=a:1,b:2`, a password holding a comma)
_SETTING_START = re.compile(r",(?=\s*[A-Za-z0-9_.-]+=)")


def _split_list(raw: str) -> list[str]:
    return [v.strip() for v in raw.split(",") if v.strip()]


def _split_settings(raw: str) -> list[str]:
    return [v.strip() for v in _SETTING_START.split(raw) if v.strip()]


def _add(
    group: argparse._ArgumentGroup,
    *flags: str,
    help: str,
    default: Any = None,
    repeat: bool = False,
    split: Callable[[str], list[str]] = _split_list,
    **kwargs: Any,
) -> None:
    """An option whose default comes from PG2SINK_<NAME>, then `default`; `split` cuts
    the variable of a repeatable option into its values."""
    env = _env_name(flags[-1] if flags[-1].startswith("--") else flags[0])
    raw = os.environ.get(env)
    if repeat:
        value: Any = split(raw) if raw else None
        kwargs["action"] = "append"
    elif kwargs.get("action") == "store_const":
        # a switch: its variable becomes a boolean in _switches_from_env ('false' is off)
        value = default
        if raw is not None:
            value = _FromEnv(raw)
            value.variable = env
    else:
        kwargs["action"] = _Once
        kwargs["type"] = _checked(kwargs.get("type"), kwargs.get("choices"))
        value = default
        if raw is not None:
            value = _FromEnv(raw)
            value.variable = env
    shown = f" (default: {default})" if default not in (None, [], ()) else ""
    group.add_argument(*flags, default=value, help=f"{help}{shown} [env: {env}]", **kwargs)


def _add_source_options(p: argparse.ArgumentParser, *, patterns: bool = True) -> None:
    g = p.add_argument_group("source")
    _add(
        g,
        "--source",
        help="libpq connection string or URI; without it the libpq variables "
        "PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD, PGSSLMODE... apply",
        metavar="DSN",
    )
    _add(g, "--publication", default="pg2sink", help="publication pg2sink manages")
    _add(g, "--slot", default="pg2sink", help="logical replication slot (pgoutput)")
    _add(
        g,
        "--schema",
        repeat=True,
        help="schema whose tables are published; repeatable (default: public)",
        metavar="NAME",
    )
    _add(
        g,
        "--internal-schema",
        default="pg2sink",
        help="pg2sink's own schema (import jobs; created by the migrations, never published)",
        metavar="NAME",
    )
    if not patterns:  # `pg2sink import` has its own --table
        return
    _add(
        g,
        "-t",
        "--table",
        repeat=True,
        help="only tables matching this psql pattern (e.g. 'public.user*'); repeatable",
        metavar="PATTERN",
    )
    _add(
        g,
        "-T",
        "--exclude-table",
        repeat=True,
        help="never tables matching this psql pattern; wins over -t; repeatable",
        metavar="PATTERN",
    )


def _add_import_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("imports (docs/imports.md)")
    _add(
        g,
        "--no-imports",
        action="store_const",
        const=True,
        help="stream only: do not import the rows tables hold when they join the publication "
        "(no import jobs are created or run)",
    )
    _add(
        g,
        "--import-backoff-base",
        default="10s",
        type=_duration,
        help="wait before retrying a failed import",
        metavar="DURATION",
    )
    _add(
        g,
        "--import-backoff-factor",
        default="2",
        type=_factor,
        help="each further failure of an import multiplies the wait by this",
        metavar="FACTOR",
    )
    _add(
        g,
        "--import-backoff-max",
        default="10m",
        type=_duration,
        help="longest wait between two attempts of an import",
        metavar="DURATION",
    )


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid factor {text!r} (a number >= 1)") from None
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"factor {text!r} must be at least 1")
    return value


def _add_spark_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("import runner (Spark)")
    _add(
        g,
        "--spark-master",
        default="local[*]",
        help="Spark master URL imports run on: local[*] (in this process, every core) "
        "or a cluster's (spark://HOST:PORT, yarn, k8s://...)",
        metavar="URL",
    )
    _add(
        g,
        "--jdbc-driver",
        help="PostgreSQL JDBC driver jar Spark reads with (default: the one `make setup` "
        "downloads into ~/.cache/pg2sink-services/jdbc)",
        metavar="PATH",
    )


def _add_logging_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("logging")
    _add(
        g,
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level",
    )
    _add(g, "--log-format", default="text", choices=["text", "json"], help="log line format")


def _add_kafka_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kafka sink (--sink=kafka)")
    _add(
        g,
        "--kafka-bootstrap-servers",
        help="Kafka brokers, host:port[,host:port...]",
        metavar="SERVERS",
    )
    _add(
        g,
        "--kafka-config",
        repeat=True,
        split=_split_settings,
        help="librdkafka producer setting (security.protocol, sasl.*, ssl.*, linger.ms, "
        "compression.type...); repeatable",
        metavar="KEY=VALUE",
    )
    _add(
        g,
        "--schema-registry-url",
        help="schema registry, Confluent-compatible API (Apicurio: .../apis/ccompat/v7); "
        "needed for --format avro",
        metavar="URL",
    )
    _add(
        g,
        "--schema-registry-config",
        repeat=True,
        split=_split_settings,
        help="schema registry client setting (basic.auth.user.info, ssl.ca.location, "
        "timeout...); repeatable",
        metavar="KEY=VALUE",
    )
    _add(
        g,
        "--format",
        default="avro",
        choices=["avro", "json"],
        help="message format: Avro (Confluent wire format, registry) or JSON",
    )
    _add(
        g,
        "--topic-prefix",
        default="pg2sink",
        help="a table's topic is PREFIX.<schema>.<table>",
        metavar="PREFIX",
    )
    _add(
        g,
        "--topic-map",
        repeat=True,
        help="send a table's messages to TOPIC; repeatable",
        metavar="SCHEMA.TABLE=TOPIC",
    )
    _add(
        g,
        "--fallback-topic",
        help="topic of tables --topic-map does not name (without it such a table stops "
        "the stream with an error); without --topic-map, every table's topic",
        metavar="TOPIC",
    )
    _add(
        g,
        "--tombstones",
        action="store_const",
        const=True,
        help="follow each DELETE with a null-value message for its key (log compaction)",
    )
    _add(
        g,
        "--schema-topic",
        help="also publish Schema records as JSON to this topic, keyed by schema.table",
        metavar="TOPIC",
    )
    _add(
        g,
        "--message-topic",
        help="topic of Message records (--messages), JSON; default PREFIX.messages",
        metavar="TOPIC",
    )


def _add_change_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what is streamed (docs/changes.md)")
    _add(
        g,
        "--publish-via-partition-root",
        action="store_const",
        const=True,
        help="changes of partitions arrive under their partitioned table's name "
        "(publication option publish_via_partition_root; changing it alters the publication)",
    )
    _add(
        g,
        "--messages",
        action="store_const",
        const=True,
        help="forward pg_logical_emit_message() messages as Message records",
    )
    _add(
        g,
        "--message-prefix",
        repeat=True,
        help="with --messages, only messages with exactly this prefix; repeatable",
        metavar="PREFIX",
    )
    _add(
        g,
        "--capture-ddl",
        action="store_const",
        const=True,
        help="install an event trigger (superuser) that emits each DDL statement as a "
        "'pg2sink.ddl' message, forwarded as a Message record in commit order; the "
        "instances of a database share it, and it is dropped when no slot started with "
        "--capture-ddl is left (a start without the flag unregisters this slot)",
    )
    _add_identity_option(g)


def _add_identity_option(g: argparse._ArgumentGroup) -> None:
    _add(
        g,
        "--allow-no-replica-identity",
        action="store_const",
        const=True,
        help="also publish tables with neither a primary key nor a replica identity "
        "(REPLICA IDENTITY NOTHING, or DEFAULT without a primary key); PostgreSQL then "
        "refuses every UPDATE and DELETE on them. Without it such tables are left out "
        "with a warning",
    )


def _add_streaming_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("large transactions (docs/large-transactions.md)")
    _add(
        g,
        "--streaming",
        action="store_const",
        const=True,
        help="have PostgreSQL 14+ stream transactions larger than logical_decoding_work_mem "
        "while they run (protocol v2); pg2sink spills them to --spill-dir and writes them "
        "at commit, so a large transaction reaches the sink sooner after its COMMIT",
    )
    _add(
        g,
        "--spill-dir",
        help="with --streaming, directory for in-progress transactions; its *.spill files "
        "are deleted at start (default: <temp dir>/pg2sink-spill-<slot>)",
        metavar="DIR",
    )


def build_parser() -> argparse.ArgumentParser:
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
    _add_source_options(stream)
    g = stream.add_argument_group("sink")
    _add(g, "--sink", default="file", choices=["file", "kafka"], help="where records go")
    _add(
        g,
        "--file-path",
        default="-",
        help="file sink: JSON-lines file to append to; '-' is standard output",
        metavar="PATH",
    )
    _add(
        g,
        "--decode-only",
        action="store_const",
        const=True,
        help="print each decoded pgoutput message readably (to --file-path) and never "
        "advance the slot",
    )
    _add_kafka_options(stream)
    _add_change_options(stream)
    _add_streaming_options(stream)
    g = stream.add_argument_group("timing")
    _add(
        g,
        "--heartbeat-interval",
        default="10s",
        type=_duration,
        help="longest time between standby status updates to the server",
        metavar="DURATION",
    )
    _add(
        g,
        "--publication-poll-interval",
        default="10s",
        type=_duration,
        help="how often publication membership is reconciled (new tables join)",
        metavar="DURATION",
    )
    _add(
        g,
        "--flush-interval",
        default="1s",
        type=_duration,
        help="longest time between durable sink flushes (each confirms the flushed LSN) "
        "while changes keep coming; when pg2sink has caught up with the server it flushes "
        "at once, at most ten times per interval",
        metavar="DURATION",
    )
    _add(
        g,
        "--retry-initial",
        action="store_const",
        const=True,
        help="at start, wait and retry while the slot is active elsewhere or the server is "
        "unreachable (for standby instances)",
    )
    _add(
        g,
        "--retry-interval",
        default="5s",
        type=_duration,
        help="wait between --retry-initial attempts",
        metavar="DURATION",
    )
    g = stream.add_argument_group("observability")
    _add(
        g,
        "--metrics-address",
        default="127.0.0.1:9525",
        help="HOST:PORT serving /health, /status, /stats and Prometheus /metrics "
        "(port 0: any free port, logged at start; 'off': no listener)",
        metavar="HOST:PORT",
    )
    _add_import_options(stream)
    _add_spark_options(stream)
    _add_logging_options(stream)

    drop = sub.add_parser(
        "drop",
        help="drop the replication slot, the publication and the DDL trigger, then exit",
        description="Drop the replication slot and the publication pg2sink uses, and the "
        "--capture-ddl event trigger when no other slot uses it, then exit. A slot of "
        "another database than --source's is refused. "
        "Unconfirmed changes in the slot are lost for pg2sink.",
    )
    _add_source_options(drop)
    _add_logging_options(drop)

    status = sub.add_parser(
        "status",
        help="show the slot, the publication's tables and the imports, then exit",
        description="Show the replication slot (active, confirmed LSN, lag and WAL retained "
        "on the server), the publication's tables and the import jobs, read from PostgreSQL.",
    )
    _add_source_options(status)
    status.add_argument("--json", action="store_true", help="print one JSON object")
    _add_logging_options(status)

    migrate = sub.add_parser(
        "migrate",
        help="create or upgrade pg2sink's internal schema, then exit",
        description="Apply the SQL migrations (yoyo-migrations) that create or upgrade the "
        "internal schema (--internal-schema). `pg2sink stream` also applies them at start.",
    )
    _add_source_options(migrate, patterns=False)
    _add_logging_options(migrate)

    imp = sub.add_parser(
        "import",
        help="re-import tables (or list the import jobs), then exit",
        description="Expire a table's current import job and create a new one; the running "
        "`pg2sink stream` picks it up (its rows are written as IMPORT records). With --list, "
        "show the import jobs instead.",
    )
    _add_source_options(imp, patterns=False)
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
    _add_logging_options(imp)
    return parser


def _source_config(args: argparse.Namespace) -> SourceConfig:
    dsn = SecretDsn(args.source or "")
    for secret in dsn.secrets():
        _add_secret(secret)
    _add_secret(os.environ.get("PGPASSWORD"))
    return SourceConfig(
        dsn=dsn,
        publication=args.publication,
        slot=args.slot,
        schemas=tuple(args.schema or ["public"]),
        tables=tuple(getattr(args, "table", None) or ()),
        exclude_tables=tuple(getattr(args, "exclude_table", None) or ()),
        internal_schema=args.internal_schema,
        # `stream` options: drop and status do not have them
        publish_via_partition_root=bool(getattr(args, "publish_via_partition_root", False)),
        allow_no_replica_identity=bool(getattr(args, "allow_no_replica_identity", False)),
    )


def _kafka_config(args: argparse.Namespace) -> KafkaConfig:
    """The Kafka sink's settings; ConfigError for what can be checked without a broker."""
    # secrets first, so that no error below can show them
    producer = Settings.parse(args.kafka_config or (), "--kafka-config")
    registry = Settings.parse(args.schema_registry_config or (), "--schema-registry-config")
    cfg = KafkaConfig(
        bootstrap_servers=(args.kafka_bootstrap_servers or "").strip(),
        producer=producer,
        schema_registry_url=(args.schema_registry_url or "").strip(),
        registry=registry,
        format=args.format,
        topic_prefix=args.topic_prefix,
        topic_map=parse_topic_map(args.topic_map or ()),
        fallback_topic=args.fallback_topic or None,
        tombstones=bool(args.tombstones),
        schema_topic=args.schema_topic or None,
        message_topic=args.message_topic or None,
    )
    for secret in cfg.secrets():
        _add_secret(secret)
    if not cfg.bootstrap_servers and "bootstrap.servers" not in producer:
        raise ConfigError("--sink=kafka needs --kafka-bootstrap-servers")
    if cfg.format == "avro" and not cfg.schema_registry_url:
        raise ConfigError("--format avro needs --schema-registry-url (or use --format json)")
    return cfg


def _stream_config(args: argparse.Namespace) -> StreamConfig:
    messages = bool(args.messages)
    if args.message_prefix and not messages:
        raise ConfigError("--message-prefix filters --messages: add --messages")
    capture_ddl = bool(args.capture_ddl)
    prefixes = tuple(args.message_prefix or ())
    if capture_ddl and (prefixes or not messages):
        # the DDL messages are forwarded even without --messages (and only they, then)
        prefixes = (*prefixes, "pg2sink.ddl")
        messages = True
    return StreamConfig(
        source=_source_config(args),
        sink=args.sink,
        file_path=args.file_path,
        decode_only=bool(args.decode_only),
        heartbeat_interval=args.heartbeat_interval,
        publication_poll_interval=args.publication_poll_interval,
        flush_interval=args.flush_interval,
        retry_initial=bool(args.retry_initial),
        retry_interval=args.retry_interval,
        kafka=_kafka_config(args) if args.sink == "kafka" else None,
        metrics_address=args.metrics_address,
        spark_master=args.spark_master,
        jdbc_driver=args.jdbc_driver or None,
        messages=messages,
        message_prefixes=prefixes,
        capture_ddl=capture_ddl,
        streaming=bool(args.streaming),
        spill_dir=args.spill_dir or None,
        imports=not args.no_imports,
        import_backoff_base=args.import_backoff_base,
        import_backoff_factor=args.import_backoff_factor,
        import_backoff_max=args.import_backoff_max,
    )


def _normalise_argv(argv: Sequence[str]) -> list[str]:
    """`pg2sink [OPTIONS]` means `pg2sink stream [OPTIONS]`."""
    args = list(argv)
    if not args or (args[0] not in COMMANDS and args[0] not in ("-h", "--help", "--version")):
        return ["stream", *args]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(_normalise_argv(sys.argv[1:] if argv is None else argv))
        _switches_from_env(args)
        logs.setup(args.log_level, args.log_format)
        if args.command == "status":
            from pg2sink import status as status_cmd

            result = status_cmd.collect(_source_config(args))
            if args.json:
                print(json.dumps(status_cmd.as_json(result), indent=2))
            else:
                print(status_cmd.render(result))
            return 0
        if args.command == "migrate":
            from pg2sink.imports.migrate import apply_migrations

            src = _source_config(args)
            applied = apply_migrations(src.dsn, src.internal_schema)
            print(
                f"applied {len(applied)} migration(s) to schema {src.internal_schema}"
                + (": " + ", ".join(applied) if applied else " (it was up to date)")
            )
            return 0
        if args.command == "import":
            from pg2sink import status as status_cmd

            src = _source_config(args)
            if args.list or not args.import_tables:
                if not args.list:
                    raise ConfigError("pg2sink import needs --table SCHEMA.TABLE or --list")
                found = status_cmd.import_jobs(src, include_expired=args.all)
                if args.json:
                    print(json.dumps([j.as_json() for j in found], indent=2))
                else:
                    print("\n".join(status_cmd.render_jobs(found)))
                return 0
            for line in status_cmd.request_imports(src, args.import_tables):
                print(line)
            return 0
        if args.command == "drop":
            from pg2sink.service import run_drop

            for line in run_drop(_source_config(args)):
                print(line)
            return 0
        from pg2sink.service import run_stream

        run_stream(_stream_config(args))
        return 0
    except Pg2SinkError as e:
        print(f"pg2sink: error: {_redact(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
