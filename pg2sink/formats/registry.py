"""The formats by name: what `--format NAME` makes (docs/formats.md)."""

from __future__ import annotations

from pg2sink.formats.base import Encoder, Origin
from pg2sink.formats.debezium import DebeziumEncoder
from pg2sink.formats.json import JsonEncoder
from pg2sink.formats.pg_kinesis import PgKinesisEncoder
from pg2sink.formats.psql_streamer import PsqlStreamerEncoder
from pg2sink.formats.wal_listener import WalListenerEncoder

__all__ = ["ENCODED", "encoder"]

#: the formats made here (avro is the Kafka sink's own, through its schema registry)
ENCODED = ("json", "pg-kinesis", "wal-listener", "psql-streamer", "debezium")


def encoder(name: str, origin: Origin, debezium_schemas: bool = False) -> Encoder:
    """The encoder of format `name` (one of ENCODED); KeyError for another."""
    if name == "json":
        return JsonEncoder()
    if name == "pg-kinesis":
        return PgKinesisEncoder()
    if name == "wal-listener":
        return WalListenerEncoder()
    if name == "psql-streamer":
        return PsqlStreamerEncoder(origin)
    if name == "debezium":
        return DebeziumEncoder(origin, debezium_schemas)
    raise KeyError(name)
