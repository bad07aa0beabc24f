"""Typed configuration of pg2sink: the single source of its command-line options.

Each field with `flag(...)` metadata is an option (options.py): its name, default,
help, `--help` group and PG2SINK_<NAME> variable come from the field. The CLI builds
these classes from flags and the environment; everything below the CLI receives them
ready-made.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pg2sink.errors import ConfigError
from pg2sink.options import (
    duration,
    factor,
    flag,
    format_duration,
    parse_duration_or_zero,
    parse_jvm_memory,
    positive_int,
)
from pg2sink.routing.config import GROUP as ROUTING_GROUP
from pg2sink.routing.config import RoutingConfig

# SecretDsn and Settings are re-exported: the rest of pg2sink imports them from here
from pg2sink.sensitive import SecretDsn as SecretDsn
from pg2sink.sensitive import Settings as Settings
from pg2sink.sinks import entries


class Group(StrEnum):
    """The `--help` groups, in the order `pg2sink stream --help` shows them."""

    SOURCE = "source"
    SINK = "sink"
    CHANGES = "what is streamed (docs/changes.md)"
    ROUTING = ROUTING_GROUP
    LARGE_TRANSACTIONS = "large transactions (docs/large-transactions.md)"
    TIMING = "timing"
    OBSERVABILITY = "observability"
    IMPORTS = "imports (docs/imports.md)"
    SPARK = "import runner (Spark)"
    LOGGING = "logging"
    CONFIG = "configuration file (docs/configuration.md)"


@dataclass(frozen=True)
class SourceConfig:
    """Where and what to replicate."""

    dsn: SecretDsn = flag(  # noqa: RUF009 (flag() is dataclasses.field())
        group=Group.SOURCE,
        help="libpq connection string or URI; without it the libpq variables "
        "PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD, PGSSLMODE... apply",
        names=("--source",),
        metavar="DSN",
        build=lambda text, _name: SecretDsn(text),
        secret=True,
    )
    """libpq DSN or URI; empty means the libpq environment (PGHOST, PGPORT...)."""
    primary: SecretDsn | None = flag(  # noqa: RUF009 (flag() is dataclasses.field())
        None,
        group=Group.SOURCE,
        help="when --source is a hot standby (PostgreSQL 16+): the primary's connection "
        "string, where pg2sink writes the publication, its internal schema and the import "
        "jobs; the slot, the stream and the imports' reads stay on the standby "
        "(docs/high-availability.md)",
        metavar="DSN",
        build=lambda text, _name: SecretDsn(text, "--primary"),
        secret=True,
    )
    """The primary's DSN, used only while --source is in recovery."""
    publication: str = flag("pg2sink", group=Group.SOURCE, help="publication pg2sink streams")
    publication_mode: str = flag(
        "auto",
        group=Group.SOURCE,
        choices=("auto", "manage", "use"),
        help="manage: pg2sink creates the publication and keeps its tables (-t, -T, --schema); "
        "use: streams what the publication publishes and never changes it; auto: manage a "
        "publication pg2sink created, use one made by others (docs/postgresql.md)",
    )
    slot: str = flag("pg2sink", group=Group.SOURCE, help="logical replication slot (pgoutput)")
    slot_failover: bool = flag(
        False,
        group=Group.SOURCE,
        help="make the slot a failover slot (PostgreSQL 17+): created with FAILOVER, or "
        "altered to it, so a standby with sync_replication_slots = on keeps a copy that "
        "pg2sink goes on from after a promotion (docs/high-availability.md)",
    )
    schemas: tuple[str, ...] = flag(
        ("public",),
        group=Group.SOURCE,
        help="schema whose tables are published; repeatable",
        names=("--schema",),
        metavar="NAME",
        repeat=True,
    )
    internal_schema: str = flag(
        "pg2sink",
        group=Group.SOURCE,
        help="pg2sink's own schema (import jobs; created by the migrations, never published)",
        metavar="NAME",
    )
    tables: tuple[str, ...] = flag(
        (),
        group=Group.SOURCE,
        help="only tables matching this psql pattern (e.g. 'public.user*'); repeatable",
        names=("-t", "--table"),
        metavar="PATTERN",
        repeat=True,
    )
    """psql-style patterns of tables to include (empty: every table)."""
    exclude_tables: tuple[str, ...] = flag(
        (),
        group=Group.SOURCE,
        help="never tables matching this psql pattern; wins over -t; repeatable",
        names=("-T", "--exclude-table"),
        metavar="PATTERN",
        repeat=True,
    )
    publish_via_partition_root: bool = flag(
        False,
        group=Group.CHANGES,
        help="changes of partitions arrive under their partitioned table's name "
        "(publication option publish_via_partition_root; changing it alters the publication)",
    )
    publish_generated_columns: bool = flag(
        False,
        group=Group.CHANGES,
        help="stored generated columns are in the schema, the changes and the imports "
        "(PostgreSQL 18+; publication option publish_generated_columns = stored, set when "
        "pg2sink creates the publication or altered to it)",
    )
    allow_no_replica_identity: bool = flag(
        False,
        group=Group.CHANGES,
        help="also publish tables with neither a primary key nor a replica identity "
        "(REPLICA IDENTITY NOTHING, or DEFAULT without a primary key); PostgreSQL then "
        "refuses every UPDATE and DELETE on them. Without it such tables are left out "
        "with a warning",
    )

    def __post_init__(self) -> None:
        check_names(self)


#: PostgreSQL names are at most NAMEDATALEN - 1 bytes; a longer one is cut silently, and
#: the cut name then never matches the one pg2sink looks for
_MAX_NAME_BYTES = 63
#: what pg_create_logical_replication_slot accepts (ReplicationSlotValidateName)
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")


def _is_system_schema(name: str) -> bool:
    return name == "information_schema" or name.startswith("pg_")


def check_names(src: SourceConfig) -> None:
    """ConfigError for names PostgreSQL would refuse half way through a start (after the
    publication was created), or that would silently empty the publication."""
    if not _SLOT_NAME.fullmatch(src.slot):
        raise ConfigError(
            f"invalid --slot {src.slot!r}: a replication slot name is lower-case letters, "
            "digits and underscores, at most 63 characters"
        )
    for option, name in [
        ("--publication", src.publication),
        ("--internal-schema", src.internal_schema),
    ]:
        if not name or len(name.encode()) > _MAX_NAME_BYTES:
            raise ConfigError(f"invalid {option} {name!r}: a name of 1 to 63 bytes")
    for schema in src.schemas:
        if _is_system_schema(schema):
            raise ConfigError(f"--schema {schema}: system schema; its tables cannot be published")
    internal = src.internal_schema
    if _is_system_schema(internal):
        raise ConfigError(
            f"--internal-schema {internal}: system schema; pick a schema of pg2sink's own "
            "(default pg2sink)"
        )
    if internal in src.schemas:
        # the internal schema is never published: every table of it would leave
        raise ConfigError(
            f"--internal-schema {internal}: it must not be a published schema (--schema), "
            f"or every table of {internal} leaves the publication"
        )
    if internal == "public":
        raise ConfigError(
            "--internal-schema public: public holds user tables; pick a schema of pg2sink's "
            "own (default pg2sink)"
        )


@dataclass(frozen=True)
class StreamConfig:
    """Everything `pg2sink stream` needs."""

    source: SourceConfig
    sink: str = flag(
        entries.names()[0],
        group=Group.SINK,
        help="where records go: " + "; ".join(f"{e.name}: {e.help}" for e in entries.SINKS),
        choices=entries.names(),
    )
    decode_only: bool = flag(
        False,
        group=Group.SINK,
        help="print each decoded pgoutput message readably (to --file-path) and never "
        "advance the slot",
    )
    heartbeat_interval: float = duration(
        10.0, Group.TIMING, "longest time between standby status updates to the server"
    )
    """Seconds between standby status updates to the server (at most)."""
    publication_poll_interval: float = duration(
        10.0, Group.TIMING, "how often publication membership is reconciled (new tables join)"
    )
    """Seconds between publication membership reconciliations."""
    flush_interval: float = duration(
        1.0,
        Group.TIMING,
        "longest time between durable sink flushes (each confirms the flushed LSN) "
        "while changes keep coming; when pg2sink has caught up with the server it flushes "
        "at once, at most ten times per interval",
    )
    """Seconds between durable sink flushes (each flush may confirm an LSN)."""
    retry_initial: bool = flag(
        False,
        group=Group.TIMING,
        help="at start, wait and retry while the slot is active elsewhere or the server is "
        "unreachable (for standby instances)",
    )
    retry_interval: float = duration(5.0, Group.TIMING, "wait between --retry-initial attempts")
    """Seconds between retries with --retry-initial."""
    wal_retain: float = flag(
        0.0,
        group=Group.TIMING,
        help="keep the confirmed LSN this far (commit time) behind what the sink "
        "acknowledged, so the server keeps that much WAL for a replay; uses the server's "
        "disk (docs/replay.md); 0: off",
        parse=parse_duration_or_zero,
        show=format_duration,
        metavar="DURATION",
    )
    """Seconds of commit time the confirmed LSN stays behind the acknowledged one; 0: none
    (subscription/loop.py Retention)."""
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    """--only, --exclude-column, --mask-column (pg2sink/routing/, docs/routing.md)."""
    sink_config: Any = None
    """The chosen sink's own settings: an instance of its entry's config class
    (sinks/entries.py), None for a sink without options. With --decode-only, the file
    sink's (FileConfig: --file-path is where the messages are printed)."""
    metrics_address: str = flag(
        "127.0.0.1:9525",
        group=Group.OBSERVABILITY,
        help="HOST:PORT serving /health, /status, /stats and Prometheus /metrics "
        "(port 0: any free port, logged at start; 'off': no listener)",
        metavar="HOST:PORT",
    )
    http_token_file: str | None = flag(
        None,
        group=Group.OBSERVABILITY,
        help="a file holding a token the HTTP API then requires on every endpoint but "
        "/health (Authorization: Bearer TOKEN; /debug/on and /debug/off included)",
        metavar="FILE",
    )
    http_tls_cert: str | None = flag(
        None,
        group=Group.OBSERVABILITY,
        help="serve the HTTP API over TLS with this PEM certificate (chain); needs --http-tls-key",
        metavar="FILE",
    )
    http_tls_key: str | None = flag(
        None,
        group=Group.OBSERVABILITY,
        help="the PEM private key of --http-tls-cert",
        metavar="FILE",
    )
    spark_master: str = flag(
        "local[*]",
        group=Group.SPARK,
        help="Spark master URL imports run on: local[*] (in this process, every core) "
        "or a cluster's (spark://HOST:PORT, yarn, k8s://...)",
        metavar="URL",
    )
    jdbc_driver: str | None = flag(
        None,
        group=Group.SPARK,
        help="PostgreSQL JDBC driver jar Spark reads with (default: the one `make setup` "
        "downloads into ~/.cache/pg2sink-services/jdbc)",
        metavar="PATH",
    )
    """PostgreSQL JDBC driver jar of imports (--jdbc-driver); None: the one `make setup` fetched."""
    spark_class_cache: str | None = flag(
        None,
        group=Group.SPARK,
        help="directory of the Spark driver JVM's class archive: the first import's JVM "
        "writes it at pg2sink's exit (once, ~10 s), later starts map it (Spark starts ~2 s "
        "sooner); default: $XDG_CACHE_HOME/pg2sink/spark, else ~/.cache/pg2sink/spark; "
        "'off': none",
        metavar="DIR",
    )
    """The driver JVM's class archive directory (imports/class_archive.py); None: the
    default one, 'off': none."""
    spark_driver_memory: str | None = flag(
        None,
        group=Group.SPARK,
        help="heap of the Spark driver JVM (512m, 4g...), which with local[*] also runs the "
        "import's tasks; an OutOfMemoryError names this option; it also sizes the bytes "
        "each task reads and batches at once (default: a quarter of this machine's memory, "
        "1g to 2g)",
        parse=parse_jvm_memory,
        metavar="SIZE",
    )
    """spark.driver.memory (imports/spark.py driver_memory); None: from the machine's memory."""
    spark_session_failures: int = flag(
        3,
        group=Group.SPARK,
        help="an import attempt fails (and is retried after the backoff) once Spark's session "
        "died this many times in a row without a partition done, each time replaced by a new "
        "one (a dead driver JVM, a broken gateway, a lost cluster master)",
        parse=positive_int,
        metavar="N",
    )
    """Spark sessions an import attempt starts, one after the other, before it fails."""
    messages: bool = flag(
        False,
        group=Group.CHANGES,
        help="forward pg_logical_emit_message() messages as Message records",
    )
    message_prefixes: tuple[str, ...] = flag(
        (),
        group=Group.CHANGES,
        help="with --messages, only messages with exactly this prefix; repeatable",
        names=("--message-prefix",),
        metavar="PREFIX",
        repeat=True,
    )
    """Only messages with one of these prefixes (--message-prefix); empty: all."""
    streaming: bool = flag(
        False,
        group=Group.LARGE_TRANSACTIONS,
        help="have PostgreSQL 14+ stream transactions larger than logical_decoding_work_mem "
        "while they run (protocol v2); pg2sink spills them to --spill-dir and writes them "
        "at commit, so a large transaction reaches the sink sooner after its COMMIT",
    )
    spill_dir: str | None = flag(
        None,
        group=Group.LARGE_TRANSACTIONS,
        help="with --streaming, directory for in-progress transactions; its *.spill files "
        "are deleted at start (default: <temp dir>/pg2sink-spill-<slot>)",
        metavar="DIR",
    )
    """Where streamed transactions are spilled; None: <temp dir>/pg2sink-spill-<slot>."""
    capture_ddl: bool = flag(
        False,
        group=Group.CHANGES,
        help="install an event trigger (superuser) that emits each DDL statement as a "
        "'pg2sink.ddl' message, forwarded as a Message record in commit order; the "
        "instances of a database share it, and it is dropped when no slot started with "
        "--capture-ddl is left (a start without the flag unregisters this slot)",
    )
    imports: bool = flag(
        True,
        group=Group.IMPORTS,
        help="stream only: do not import the rows tables hold when they join the publication "
        "(no import jobs are created or run)",
        names=("--no-imports",),
        invert=True,
    )
    """Import each table's existing rows when it joins the publication (docs/imports.md);
    False with --no-imports."""
    import_backoff_base: float = duration(
        10.0, Group.IMPORTS, "wait before retrying a failed import"
    )
    """Seconds before the first retry of a failed import."""
    import_backoff_factor: float = flag(
        2.0,
        group=Group.IMPORTS,
        help="each further failure of an import multiplies the wait by this",
        metavar="FACTOR",
        parse=factor,
        show="{:g}".format,
    )
    import_backoff_max: float = duration(
        600.0, Group.IMPORTS, "longest wait between two attempts of an import"
    )
    """Longest delay between two attempts of an import."""
    secrets: tuple[str, ...] = field(default=(), repr=False)
    """Strings that must never appear in output (passwords)."""


@dataclass(frozen=True)
class LogConfig:
    """How pg2sink logs (every command)."""

    log_level: str = flag(
        "info",
        group=Group.LOGGING,
        help="log level",
        choices=("debug", "info", "warning", "error"),
    )
    log_format: str = flag(
        "text", group=Group.LOGGING, help="log line format", choices=("text", "json")
    )
    """'text' (one readable line) or 'json' (one JSON object per line)."""
    config: str | None = flag(
        None,
        group=Group.CONFIG,
        help='read settings from this TOML file (a key per option: slot = "s"); flags '
        "and PG2SINK_ variables win over it; its [pipeline.NAME] tables are pipelines "
        "`pg2sink stream` runs together in this process",
        metavar="FILE",
    )
    pipeline: str | None = flag(
        None,
        group=Group.CONFIG,
        help="with a --config file holding [pipeline.NAME] tables: only this pipeline "
        "(its settings over the file's top level); without it `pg2sink stream` runs them all",
        metavar="NAME",
    )
