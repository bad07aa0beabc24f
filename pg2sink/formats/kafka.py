"""Message keys and values of one table, in the formats of --format.

avro (default): Confluent wire format (magic byte 0, 4-byte schema id, Avro binary body).
  The value is the Modification envelope of formats.avro, the key the record of the key
  columns; both registered under TopicNameStrategy subjects when the table's Schema
  record arrives, so a new table shape registers new versions before its first change.
json: the value is the file sink's JSON line of the Modification (without the newline),
  the key the JSON object of the key columns; no registry involved.
pg-kinesis, wal-listener, psql-streamer, debezium: the value is the formats/ encoder's
  message (docs/formats.md), the key the JSON object of the key columns (Debezium's key
  struct for debezium); Schema records (--schema-topic) and messages stay pg2sink's JSON.
  Debezium's (formats.debezium.DebeziumFormat, and DebeziumAvroFormat with
  --debezium-avro) encode new rows from pgoutput's bytes as Avro does (row_encoder).

Tables without a key (no primary key, REPLICA IDENTITY FULL or NOTHING), and TRUNCATE
messages, have a null key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Protocol

from pg2sink.changelog.builder import TableShape
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.formats.avro import TableEncoder
from pg2sink.formats.avro_native import Encode, NativeRowEncoder
from pg2sink.formats.base import Encoder
from pg2sink.formats.base import TableEncoder as FormatTable
from pg2sink.formats.jsonenc import dumps
from pg2sink.formats.jsonlines import modification_object
from pg2sink.schema_registry import SchemaRegistry, key_subject, value_subject, wire_header

__all__ = [
    "AvroFormat",
    "EncoderFormat",
    "Format",
    "JsonFormat",
    "TableFormat",
    "key_row",
    "modification_json",
]


def key_row(m: Modification) -> Mapping[str, object] | None:
    """The image a change's key is taken from: the new row, the old one for DELETE."""
    if m.after is not None:
        return m.after
    if m.operation is Operation.DELETE:
        return m.before
    return None  # TRUNCATE


def modification_json(m: Modification) -> bytes:
    """The file sink's JSON line of `m`, without its newline (README "Records")."""
    return dumps(modification_object(m))


class TableFormat(Protocol):
    """Encodes one table's messages (one shape of it: rebuilt when the shape changes)."""

    def key(self, row: Mapping[str, object]) -> bytes | None:
        """The message key for a row image; None for a table without a key."""
        ...

    def value(self, m: Modification) -> bytes:
        """The message value of a change."""
        ...

    def row_encoder(self, shape: TableShape) -> Encode | None:
        """The encoder of the new rows of `shape` (the table's Relation, after this
        Schema record) from pgoutput's bytes to the same key and value; None: every
        change takes the record route."""
        ...


class Format(Protocol):
    """Makes a TableFormat from a table's Schema record and its topic."""

    def table(self, schema: Schema, topic: str) -> TableFormat: ...

    def close(self) -> None: ...


class _AvroTable:
    """A table's TableEncoder with its wire-format headers bound in.

    `key` and `value` are partials of the encoder's methods rather than methods that call
    them: one Python call less per message key and per message value. `native` encodes
    an Insert's or Update's new row from pgoutput's bytes straight to the key and value
    (formats.avro_native), when the extension is built and handles the table's types.
    """

    __slots__ = ("key", "native", "value")

    def __init__(self, encoder: TableEncoder, value_id: int, key_id: int | None) -> None:
        key_header = wire_header(key_id) if key_id is not None else b""
        value_header = wire_header(value_id)
        self.key: Callable[[Mapping[str, object]], bytes | None] = partial(
            encoder.encode_key, header=key_header
        )
        self.value: Callable[[Modification], bytes] = partial(
            encoder.encode_value, header=value_header
        )
        self.native = NativeRowEncoder.build(encoder, key_header, value_header)

    def row_encoder(self, shape: TableShape) -> Encode | None:
        return self.native.encode if self.native is not None else None


class AvroFormat:
    """--format avro: registers each table shape, then writes the wire format."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    def table(self, schema: Schema, topic: str) -> TableFormat:
        encoder = TableEncoder(schema.namespace, schema.name, schema.schema, schema.primary_key)
        value_id = self.registry.register(value_subject(topic), encoder.value)
        key_id = None
        if encoder.key is not None:
            key_id = self.registry.register(key_subject(topic), encoder.key)
        return _AvroTable(encoder, value_id, key_id)

    def close(self) -> None:
        self.registry.close()


class _JsonTable:
    __slots__ = ("_key_columns",)

    def __init__(self, key_columns: tuple[str, ...]) -> None:
        self._key_columns = key_columns

    def row_encoder(self, shape: TableShape) -> Encode | None:
        return None  # JSON values take the record route

    def key(self, row: Mapping[str, object]) -> bytes | None:
        if not self._key_columns:
            return None
        return dumps({c: row.get(c) for c in self._key_columns})

    def value(self, m: Modification) -> bytes:
        return modification_json(m)


class JsonFormat:
    """--format json: the file sink's JSON, no registry."""

    def table(self, schema: Schema, topic: str) -> TableFormat:
        # Schema.primary_key is in key order; the row record's list in table order
        key_columns = tuple(schema.primary_key or schema.schema.get("pg.primary_key") or ())
        return _JsonTable(key_columns)

    def close(self) -> None:
        pass


class _EncoderTable:
    __slots__ = ("key", "value")

    def __init__(self, table: FormatTable) -> None:
        self.key: Callable[[Mapping[str, object]], bytes | None] = table.key
        self.value: Callable[[Modification], bytes] = table.value

    def row_encoder(self, shape: TableShape) -> Encode | None:
        return None  # the record route


class EncoderFormat:
    """A formats/ encoder's messages (--format pg-kinesis, wal-listener, psql-streamer);
    no registry."""

    def __init__(self, encoder: Encoder) -> None:
        self._encoder = encoder

    def table(self, schema: Schema, topic: str) -> TableFormat:
        return _EncoderTable(self._encoder.table(schema))

    def close(self) -> None:
        pass
