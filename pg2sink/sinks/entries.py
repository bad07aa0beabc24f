"""The sinks pg2sink can write to, registered in one place.

A sink is a folder `pg2sink/sinks/<name>/`: its options (a config dataclass whose fields
carry `flag(...)` metadata, config.py), its Sink (sinks/base.py) and, when its tables'
rows can be imported, the ImportTarget its `import_target()` returns. Its entry below
is all the rest of pg2sink knows of it: `--sink` takes the entries' names, `pg2sink
stream --help` shows each entry's options under its group, the CLI builds the chosen
entry's config, the stream creates the sink from it, and imports write through the
entry's import target. The modules that need a
client library (confluent-kafka...) are imported only when their sink is chosen; a
missing one is a one-line error naming the extra to install.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pg2sink.errors import ConfigError
from pg2sink.formats.registry import ENCODED as MESSAGE_FORMATS
from pg2sink.sinks.bigquery.config import GROUP as BIGQUERY_GROUP
from pg2sink.sinks.bigquery.config import BigQueryConfig
from pg2sink.sinks.duckdb.config import GROUP as DUCKDB_GROUP
from pg2sink.sinks.duckdb.config import DuckDBConfig
from pg2sink.sinks.file.config import GROUP as FILE_GROUP
from pg2sink.sinks.file.config import FileConfig
from pg2sink.sinks.kafka.config import GROUP as KAFKA_GROUP
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kinesis.config import GROUP as KINESIS_GROUP
from pg2sink.sinks.kinesis.config import KinesisConfig
from pg2sink.sinks.nats.config import GROUP as NATS_GROUP
from pg2sink.sinks.nats.config import NatsConfig

if TYPE_CHECKING:
    from pg2sink.sinks.base import ImportTarget, Sink

__all__ = ["SINKS", "Checked", "SinkEntry", "entry", "names"]


@runtime_checkable
class Checked(Protocol):
    """A sink config with checks beyond each option's own (which need no server): the
    CLI calls `check()` after building it and exits 2 on its ConfigError."""

    def check(self) -> None: ...


@dataclass(frozen=True)
class SinkEntry:
    """One sink: its name, its options and how to make it."""

    name: str
    """--sink NAME"""
    help: str
    """What it is, in a few words (`--help`)."""
    factory: Callable[[Any], Sink]
    """Makes the sink (not opened) from its config (None for a sink without one);
    imports the client library on its first call."""
    config: type[Any] | None = None
    """The dataclass of its options; None: it takes none."""
    group: str | None = None
    """The `--help` group its options are shown under."""
    extra: str | None = None
    """The pip extra its client library comes with, named when it is missing."""
    imports: Callable[[Any], ImportTarget] | None = None
    """Where imports write, from its config (sinks/<name>/imports.py); None: its
    tables' existing rows cannot be imported (jobs stay pending, with a warning)."""
    formats: tuple[str, ...] = ()
    """The --format values it takes (formats/config.py), its default first; (): none."""

    def create(self, config: object | None) -> Sink:
        """The sink, from its config (built by the CLI); ConfigError when its library is
        missing."""
        try:
            return self.factory(config)
        except ImportError as e:
            raise ConfigError(
                f"--sink={self.name} needs the {self.extra} extra "
                f"(pip install 'pg2sink[{self.extra}]'): {e}"
            ) from None


def _duckdb(config: DuckDBConfig) -> Sink:
    # duckdb is the optional [duckdb] extra
    from pg2sink.sinks.duckdb.sink import DuckDBSink

    return DuckDBSink(config)


def _duckdb_imports(config: DuckDBConfig) -> ImportTarget:
    from pg2sink.sinks.duckdb.imports import DuckDBImportTarget

    return DuckDBImportTarget(config.duckdb_path)


def _bigquery(config: BigQueryConfig) -> Sink:
    # google-cloud-bigquery is the optional [bigquery] extra
    from pg2sink.sinks.bigquery.sink import BigQuerySink

    return BigQuerySink(config)


def _bigquery_imports(config: BigQueryConfig) -> ImportTarget:
    from pg2sink.sinks.bigquery.imports import BigQueryImportTarget

    return BigQueryImportTarget(config)


def _file(config: FileConfig) -> Sink:
    from pg2sink.sinks.file.sink import FileSink, TransactionsFileSink

    if config.file_transactions:
        return TransactionsFileSink(config.file_path)
    return FileSink(config.file_path)


def _file_imports(config: FileConfig) -> ImportTarget:
    from pg2sink.sinks.file.imports import FileImportTarget

    return FileImportTarget(config.file_path)


def _kafka(config: KafkaConfig) -> Sink:
    # confluent-kafka and fastavro are the optional [kafka] extra
    from pg2sink.sinks.kafka.make import kafka_sink

    return kafka_sink(config)


def _kafka_imports(config: KafkaConfig) -> ImportTarget:
    from pg2sink.sinks.kafka.imports import KafkaImportTarget

    return KafkaImportTarget(config)


def _kinesis(config: KinesisConfig) -> Sink:
    # boto3 is the optional [kinesis] extra
    from pg2sink.sinks.kinesis.sink import KinesisSink

    return KinesisSink(config)


def _kinesis_imports(config: KinesisConfig) -> ImportTarget:
    from pg2sink.sinks.kinesis.imports import KinesisImportTarget

    return KinesisImportTarget(config)


def _nats(config: NatsConfig) -> Sink:
    # nats-py is the optional [nats] extra
    from pg2sink.sinks.nats.sink import NatsSink

    return NatsSink(config)


def _nats_imports(config: NatsConfig) -> ImportTarget:
    from pg2sink.sinks.nats.imports import NatsImportTarget

    return NatsImportTarget(config)


def _null(config: None) -> Sink:
    from pg2sink.sinks.null.sink import NullSink

    return NullSink()


def _null_imports(config: None) -> ImportTarget:
    from pg2sink.sinks.null.imports import NullImportTarget

    return NullImportTarget()


#: every sink, in the order `--help` shows them (the first is the default)
SINKS: tuple[SinkEntry, ...] = (
    SinkEntry(
        "file",
        "JSON lines to a file or standard output",
        _file,
        FileConfig,
        FILE_GROUP,
        imports=_file_imports,
    ),
    SinkEntry(
        "kafka",
        "Kafka topics, Avro (schema registry) or JSON",
        _kafka,
        KafkaConfig,
        KAFKA_GROUP,
        extra="kafka",
        imports=_kafka_imports,
        formats=("avro", *MESSAGE_FORMATS),
    ),
    SinkEntry(
        "kinesis",
        "an Amazon Kinesis data stream, JSON, keyed by primary key",
        _kinesis,
        KinesisConfig,
        KINESIS_GROUP,
        extra="kinesis",
        imports=_kinesis_imports,
        formats=MESSAGE_FORMATS,
    ),
    SinkEntry(
        "nats",
        "NATS JetStream subjects, JSON",
        _nats,
        NatsConfig,
        NATS_GROUP,
        extra="nats",
        imports=_nats_imports,
        formats=MESSAGE_FORMATS,
    ),
    SinkEntry(
        "duckdb",
        "an embedded DuckDB file: raw changelog tables and latest-state views",
        _duckdb,
        DuckDBConfig,
        DUCKDB_GROUP,
        extra="duckdb",
        imports=_duckdb_imports,
    ),
    SinkEntry(
        "bigquery",
        "Google BigQuery: raw changelog tables and latest-state views",
        _bigquery,
        BigQueryConfig,
        BIGQUERY_GROUP,
        extra="bigquery",
        imports=_bigquery_imports,
    ),
    SinkEntry(
        "null",
        "discards everything, acknowledged at once (measuring, dry runs)",
        _null,
        imports=_null_imports,
    ),
)


def names() -> tuple[str, ...]:
    """The --sink choices."""
    return tuple(e.name for e in SINKS)


def entry(name: str) -> SinkEntry:
    """The entry of sink `name`; ConfigError naming the choices for an unknown one."""
    for e in SINKS:
        if e.name == name:
            return e
    raise ConfigError(f"unknown --sink {name!r}: choose one of {', '.join(names())}")
