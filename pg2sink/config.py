"""Typed configuration of pg2sink, with secret-safe handling of the source DSN.

The CLI (cli.py) fills these classes from flags and `PG2SINK_<NAME>`
environment variables; everything below the CLI receives them ready-made.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import psycopg.conninfo
from psycopg import pq

from pg2sink.errors import ConfigError

#: Settings of the replication session. pgoutput renders column values with
#: the walsender's output functions, so these GUCs fix the text forms the
#: value decoders parse: ISO dates, UTC offsets, round-trip floats, hex bytea.
#: https://www.postgresql.org/docs/current/runtime-config-client.html
REPLICATION_SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}


#: libpq settings whose value is a secret: the password, and the client key's passphrase
_SECRET_DSN_KEYS = ("password", "sslpassword")


class SecretDsn:
    """A libpq connection string whose password never leaks through str/repr."""

    __slots__ = ("_dsn",)

    def __init__(self, dsn: str) -> None:
        try:
            # Parsing validates both key=value DSNs and postgresql:// URIs.
            psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as e:
            raise ConfigError(f"invalid --source connection string: {_scrub(str(e))}") from None
        self._dsn = dsn

    def reveal(self) -> str:
        """The full DSN, for handing to libpq only."""
        return self._dsn

    @property
    def password(self) -> str | None:
        return _password_of(self._dsn)

    def secrets(self) -> list[str]:
        """The values that must never appear in output: password, sslpassword."""
        params = psycopg.conninfo.conninfo_to_dict(self._dsn)
        return [str(params[k]) for k in _SECRET_DSN_KEYS if params.get(k)]

    def redacted(self) -> str:
        """The DSN without its secrets, for messages and logs."""
        params = psycopg.conninfo.conninfo_to_dict(self._dsn)
        for key in _SECRET_DSN_KEYS:
            params.pop(key, None)
        return psycopg.conninfo.make_conninfo("", **params) or "(libpq environment)"

    def __repr__(self) -> str:
        return f"SecretDsn({self.redacted()!r})"

    __str__ = redacted


def _scrub(message: str) -> str:
    """libpq's complaint about a DSN it could not parse, without the DSN's text but its
    key names.

    libpq quotes what it could not parse (`missing "=" after "..."`, `invalid connection
    option "..."`, a whole URI), and what it could not parse is often a password: an
    unquoted space inside one, a `%` that is not percent-encoding. So every quoted part
    that is not a libpq keyword goes, and a hint says how to quote a value."""
    message = " ".join(message.split())
    keywords = _libpq_keywords()
    message = re.sub(r'"([^"]*)"', lambda m: _shown(m.group(1), keywords), message)
    message = re.sub(r"(password\s*=\s*)\S+", r"\1***", message)
    if "missing" in message and "after" in message:
        message += " (a value holding spaces goes in single quotes: password='a b')"
    return message


def _shown(quoted: str, keywords: frozenset[str]) -> str:
    """A part libpq quoted, if it is a key name or punctuation (`missing "=" after`)."""
    return f'"{quoted}"' if quoted in keywords or quoted in ("=", "]") else '"..."'


def _password_of(dsn: str) -> str | None:
    try:
        pw = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:
        return None
    return str(pw) if pw else None


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    """Every connection option libpq knows (host, sslmode...): names, never secrets."""
    return frozenset(d.keyword.decode() for d in pq.Conninfo.get_defaults())


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'10s', '500ms', '2m', '1h' or a bare number of seconds → seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"invalid duration {text!r} (examples: 10s, 500ms, 2m)")
    seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be greater than zero")
    return seconds


#: Parts of a client setting's name that mark its value as a secret (sasl.password,
#: ssl.key.password, sasl.jaas.config, basic.auth.user.info, bearer.auth.token, ssl.key.pem...).
_SECRET_KEY_PARTS = ("password", "secret", "user.info", "token", "jaas", ".pem", "credentials")


_SETTING_KEY = re.compile(r"[A-Za-z0-9_.-]+")


def is_secret_setting(key: str) -> bool:
    """Whether the value of client setting `key` must never be shown."""
    key = key.lower()
    return any(part in key for part in _SECRET_KEY_PARTS)


class Settings:
    """KEY=VALUE client settings (librdkafka, the registry client) whose secrets never leak.

    `reveal()` gives the values for handing to the client; str/repr mask every secret.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        self._items: dict[str, str] = dict(items or {})

    @classmethod
    def parse(cls, pairs: Iterable[str], flag: str) -> Settings:
        """Settings from `KEY=VALUE` strings; ConfigError naming `flag` for a bad one."""
        items: dict[str, str] = {}
        for number, pair in enumerate(pairs, 1):
            key, eq, value = pair.partition("=")
            key = key.strip()
            if not eq or not _SETTING_KEY.fullmatch(key):
                # never the text: without a well-formed key, it may be any part of a
                # secret (PG2SINK_KAFKA_CONFIG='sasl.password=a,b' once showed 'b')
                raise ConfigError(
                    f"invalid {flag} (setting {number}): expected KEY=VALUE with a key of "
                    "letters, digits, '.', '_' or '-' (the text is not shown: it may hold "
                    "a secret)"
                )
            items[key] = value
        return cls(items)

    def reveal(self) -> dict[str, str]:
        """The settings with their real values, for the client library only."""
        return dict(self._items)

    def secrets(self) -> list[str]:
        """The values that must never appear in output."""
        return [v for k, v in self._items.items() if v and is_secret_setting(k)]

    def get(self, key: str) -> str | None:
        return self._items.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __bool__(self) -> bool:
        return bool(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and other._items == self._items

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items.items())))

    def __repr__(self) -> str:
        shown = {k: "***" if is_secret_setting(k) else v for k, v in self._items.items()}
        return f"Settings({shown!r})"

    __str__ = __repr__


@dataclass(frozen=True)
class KafkaConfig:
    """What `--sink=kafka` needs (README "Kafka")."""

    bootstrap_servers: str
    """Comma-separated host:port list of Kafka brokers."""
    producer: Settings = field(default_factory=Settings)
    """librdkafka settings from --kafka-config (SASL/SSL, linger.ms, compression...)."""
    schema_registry_url: str = field(default="", repr=False)
    """Confluent-compatible schema registry API; may hold user info, hence not in repr."""
    registry: Settings = field(default_factory=Settings)
    """Schema registry client settings from --schema-registry-config."""
    format: str = "avro"
    """Message format: 'avro' (Confluent wire format, registry) or 'json'."""
    topic_prefix: str = "pg2sink"
    """Default topic of a table: <prefix>.<schema>.<table>."""
    topic_map: tuple[tuple[str, str], ...] = ()
    """('schema.table', topic) pairs from --topic-map."""
    fallback_topic: str | None = None
    """Topic of tables that --topic-map does not name (without it they are an error)."""
    tombstones: bool = False
    """Follow each DELETE with a null-value message for its key (log compaction)."""
    schema_topic: str | None = None
    """Also publish Schema records, as JSON, to this topic keyed by 'schema.table'."""
    message_topic: str | None = None
    """Topic of Message records (--messages); None: '<topic_prefix>.messages'."""

    def secrets(self) -> list[str]:
        """Every secret value of this configuration (for log redaction)."""
        out = self.producer.secrets() + self.registry.secrets()
        password = _url_password(self.schema_registry_url)
        if password:
            out.append(password)
        return out


def _url_password(url: str) -> str | None:
    m = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@:]*:([^/@]*)@", url)
    return m.group(1) if m and m.group(1) else None


def parse_topic_map(pairs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`schema.table=topic` strings → pairs; ConfigError for a malformed one."""
    out: dict[str, str] = {}
    for pair in pairs:
        table, eq, topic = pair.rpartition("=")
        if not eq or "." not in table.strip(".") or not topic.strip():
            raise ConfigError(f"invalid --topic-map {pair!r}: expected schema.table=topic")
        out[table] = topic.strip()
    return tuple(out.items())


@dataclass(frozen=True)
class SourceConfig:
    """Where and what to replicate."""

    dsn: SecretDsn
    """libpq DSN or URI; empty means the libpq environment (PGHOST, PGPORT...)."""
    publication: str = "pg2sink"
    """Publication whose table membership pg2sink manages."""
    slot: str = "pg2sink"
    """Logical replication slot (pgoutput) pg2sink streams from."""
    schemas: tuple[str, ...] = ("public",)
    """Schemas whose tables are candidates for the publication."""
    tables: tuple[str, ...] = ()
    """psql-style patterns of tables to include (empty: every table)."""
    exclude_tables: tuple[str, ...] = ()
    """psql-style patterns of tables to exclude; wins over `tables`."""
    internal_schema: str = "pg2sink"
    """pg2sink's own schema, never published."""
    publish_via_partition_root: bool = False
    """Publication option publish_via_partition_root: a partition's changes arrive under
    its partitioned root's name (--publish-via-partition-root)."""
    allow_no_replica_identity: bool = False
    """Also publish tables without a primary key or replica identity, whose UPDATE and
    DELETE PostgreSQL then refuses (--allow-no-replica-identity); by default they are
    left out with a warning."""

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
    for flag, name in [
        ("--publication", src.publication),
        ("--internal-schema", src.internal_schema),
    ]:
        if not name or len(name.encode()) > _MAX_NAME_BYTES:
            raise ConfigError(f"invalid {flag} {name!r}: a name of 1 to 63 bytes")
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
    sink: str = "file"
    """Sink name: file or kafka."""
    file_path: str = "-"
    """File sink target; '-' is standard output."""
    decode_only: bool = False
    """Print decoded pgoutput messages and never advance the slot."""
    heartbeat_interval: float = 10.0
    """Seconds between standby status updates to the server (at most)."""
    publication_poll_interval: float = 10.0
    """Seconds between publication membership reconciliations."""
    flush_interval: float = 1.0
    """Seconds between durable sink flushes (each flush may confirm an LSN)."""
    retry_initial: bool = False
    """Wait and retry while the slot is busy or the server unreachable at start."""
    retry_interval: float = 5.0
    """Seconds between retries with --retry-initial."""
    kafka: KafkaConfig | None = None
    """Kafka sink settings (set when sink is 'kafka')."""
    metrics_address: str = "127.0.0.1:9525"
    """HOST:PORT of the HTTP API and Prometheus /metrics; 'off' disables it."""
    spark_master: str = "local[*]"
    """Spark master URL the import runner uses (--spark-master): local[*] or a cluster's."""
    jdbc_driver: str | None = None
    """PostgreSQL JDBC driver jar of imports (--jdbc-driver); None: the one `make setup` fetched."""
    messages: bool = False
    """Forward pg_logical_emit_message() messages as Message records (--messages)."""
    message_prefixes: tuple[str, ...] = ()
    """Only messages with one of these prefixes (--message-prefix); empty: all."""
    streaming: bool = False
    """Have PostgreSQL 14+ stream large in-progress transactions (protocol v2), spilled
    to `spill_dir` until they commit (--streaming; docs/large-transactions.md)."""
    spill_dir: str | None = None
    """Where streamed transactions are spilled; None: <temp dir>/pg2sink-spill-<slot>."""
    capture_ddl: bool = False
    """An event trigger emits each DDL statement as a 'pg2sink.ddl' message (--capture-ddl)."""
    imports: bool = True
    """Import each table's existing rows when it joins the publication (docs/imports.md);
    False with --no-imports."""
    import_backoff_base: float = 10.0
    """Seconds before the first retry of a failed import."""
    import_backoff_factor: float = 2.0
    """Each further failure multiplies the delay by this."""
    import_backoff_max: float = 600.0
    """Longest delay between two attempts of an import."""
    secrets: tuple[str, ...] = field(default=(), repr=False)
    """Strings that must never appear in output (passwords)."""
