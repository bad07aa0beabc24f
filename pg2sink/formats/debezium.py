"""Debezium's change event (--format debezium), as its PostgreSQL connector (3.x) writes
it through Kafka Connect's JsonConverter: without schemas (schemas.enable=false, the
default), or with them (--debezium-schemas: {"schema": ..., "payload": ...}).

The value is the envelope, keys in Debezium's order:

    {"before":null,"after":{"id":1,"name":"Ann"},
     "source":{"version":"pg2sink-0.1.0","connector":"postgresql","name":"pg2sink",
               "ts_ms":1714557600123,"snapshot":"false","db":"app","sequence":null,
               "ts_us":1714557600123456,"ts_ns":1714557600123456000,"schema":"public",
               "table":"users","txId":745,"lsn":24023128,"xmin":null,"origin":null,
               "origin_lsn":null},
     "transaction":null,"op":"c","ts_ms":1714557600123,"ts_us":1714557600123456,
     "ts_ns":1714557600123456000}

- op: c (INSERT), u (UPDATE), d (DELETE), t (TRUNCATE), r (an imported row, as
  Debezium's snapshot reads; source.snapshot "true" for them, "false" else).
- before: the old image PostgreSQL sent (the key with the default REPLICA IDENTITY, its
  other columns null as in Debezium; the whole row with FULL), after: the new row;
  values by debezium_types. Key columns are required fields of the row struct (they
  are NOT NULL), the others optional.
- source.name: Debezium's topic.prefix, which pg2sink's topic prefix plays (topics are
  PREFIX.<schema>.<table> in both); source.db: the source database; ts_ms, ts_us, ts_ns
  (source and envelope): the commit time (Debezium's envelope times are its own clock
  when it processed the change; pg2sink keeps the bytes a function of the change).
- The key is the key columns' struct ({"id":1}), null for a table without a key and for
  TRUNCATE.

Where pg2sink differs is listed in docs/formats.md.

On the Kafka sink an Insert's or an Update's new row takes the row route: `row_encoder`
reads it from pgoutput's bytes with the column converters of debezium_types.text_reader
(the row reader of logical.fastpath: C under PG2SINK_IMPL=c) into the envelope the
record route writes for the same change, byte for byte, without a Modification; what
that reader declines (an old tuple, a value only the record route handles) takes the
record route.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson

from pg2sink import __version__
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.formats.base import Origin, columns_of, key_columns
from pg2sink.formats.debezium_types import FieldType, convert_value, field_type, text_reader
from pg2sink.formats.jsonenc import dumps
from pg2sink.logical.fastpath import compile_row_reader
from pg2sink.logical.messages import UNCHANGED_TOAST

if TYPE_CHECKING:
    from pg2sink.changelog.builder import TableShape
    from pg2sink.formats.avro_native import Encode

__all__ = ["OPS", "VERSION", "DebeziumEncoder", "DebeziumFormat", "DebeziumTable", "Payloads"]

#: source.version: pg2sink's, so that a reader can tell who wrote the event
VERSION = f"pg2sink-{__version__}"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
OPS = {
    Operation.INSERT: "c",
    Operation.UPDATE: "u",
    Operation.DELETE: "d",
    Operation.TRUNCATE: "t",
    Operation.IMPORT: "r",
}


def _field(name: str, schema: Mapping[str, Any], optional: bool = True) -> dict[str, Any]:
    """A struct field's schema in JsonConverter's key order: type first, field last."""
    out = {"type": schema["type"], "optional": optional}
    out.update((k, v) for k, v in schema.items() if k != "type")
    out["field"] = name
    return out


def _string(name: str, optional: bool = False) -> dict[str, Any]:
    return {"type": "string", "optional": optional, "field": name}


def _int64(name: str, optional: bool = True) -> dict[str, Any]:
    return {"type": "int64", "optional": optional, "field": name}


#: the schema of source (io.debezium.connector.postgresql.Source)
SOURCE_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        _string("version"),
        _string("connector"),
        _string("name"),
        _int64("ts_ms", optional=False),
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {
                "allowed": "true,first,first_in_data_collection,last_in_data_collection,"
                "last,false,incremental"
            },
            "default": "false",
            "field": "snapshot",
        },
        _string("db"),
        _string("sequence", optional=True),
        _int64("ts_us"),
        _int64("ts_ns"),
        _string("schema"),
        _string("table"),
        _int64("txId"),
        _int64("lsn"),
        _int64("xmin"),
        _string("origin", optional=True),
        _int64("origin_lsn"),
    ],
    "optional": False,
    "name": "io.debezium.connector.postgresql.Source",
    "version": 1,
    "field": "source",
}
#: the schema of transaction (Debezium's event.block; pg2sink writes null)
TRANSACTION_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        _string("id"),
        _int64("total_order", optional=False),
        _int64("data_collection_order", optional=False),
    ],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}


#: (Insert or Update message, commit time, lsn, xid, operation) -> (the key struct's
#: values or None, the envelope's values) or None (declined); see DebeziumTable.new_rows
Payloads = Callable[
    [bytes, datetime, int, int, Operation],
    "tuple[dict[str, object] | None, dict[str, object]] | None",
]


class DebeziumTable:
    __slots__ = (
        "_columns",
        "_fields",
        "_key_schema",
        "_keys",
        "_name",
        "_origin",
        "_value_schema",
    )

    def __init__(self, schema: Schema, origin: Origin, schemas: bool) -> None:
        self._origin = origin
        self._keys = key_columns(schema)
        self._columns = columns_of(schema)
        self._fields: dict[str, FieldType] = {c.name: field_type(c) for c in self._columns}
        self._name = f"{origin.name}.{schema.namespace}.{schema.name}"
        self._value_schema = self._envelope_schema() if schemas else None
        self._key_schema = self._key_struct() if schemas and self._keys else None

    def _row_schema(self, field: str) -> dict[str, Any]:
        # key columns are NOT NULL (a primary key's, a replica identity index's); of the
        # others the Schema record does not say
        keys = self._keys
        fields = [_field(n, ft.schema, optional=n not in keys) for n, ft in self._fields.items()]
        return {
            "type": "struct",
            "fields": fields,
            "optional": True,
            "name": f"{self._name}.Value",
            "field": field,
        }

    def _envelope_schema(self) -> dict[str, Any]:
        return {
            "type": "struct",
            "fields": [
                self._row_schema("before"),
                self._row_schema("after"),
                SOURCE_SCHEMA,
                TRANSACTION_SCHEMA,
                _string("op"),
                _int64("ts_ms"),
                _int64("ts_us"),
                _int64("ts_ns"),
            ],
            "optional": False,
            "name": f"{self._name}.Envelope",
            "version": 2,
        }

    def _key_struct(self) -> dict[str, Any]:
        fields = [_field(k, self._fields[k].schema, optional=False) for k in self._keys]
        return {"type": "struct", "fields": fields, "optional": False, "name": f"{self._name}.Key"}

    def _row(self, row: Mapping[str, object] | None) -> dict[str, object] | None:
        if row is None:
            return None
        # every column of the struct, as Debezium writes them: a column the old key
        # image lacks (default REPLICA IDENTITY) is null there too
        out = {name: convert_value(ft, row.get(name)) for name, ft in self._fields.items()}
        out.update((name, v) for name, v in row.items() if name not in out)
        return out

    @property
    def key_schema(self) -> dict[str, Any] | None:
        """The key's Connect schema; None for a table without a key."""
        return self._key_struct() if self._keys else None

    @property
    def value_schema(self) -> dict[str, Any]:
        """The envelope's Connect schema."""
        return self._value_schema or self._envelope_schema()

    def key_payload(self, row: Mapping[str, object]) -> dict[str, object] | None:
        """The key struct's values (JsonConverter's JSON form); None without a key."""
        if not self._keys:
            return None
        fields = self._fields
        return {k: convert_value(fields[k], row.get(k)) for k in self._keys}

    def key(self, row: Mapping[str, object]) -> bytes | None:
        payload = self.key_payload(row)
        if payload is None:
            return None
        if self._key_schema is None:
            return dumps(payload)
        return dumps({"schema": self._key_schema, "payload": payload})

    def value(self, m: Modification) -> bytes:
        payload = self.payload(m)
        if self._value_schema is None:
            return dumps(payload)
        return dumps({"schema": self._value_schema, "payload": payload})

    def payload(self, m: Modification) -> dict[str, Any]:
        """The envelope's values (JsonConverter's JSON form)."""
        ts_us = (m.timestamp - _EPOCH) // _MICROSECOND
        ts_ms, ts_ns = ts_us // 1000, ts_us * 1000
        origin = self._origin
        return {
            "before": self._row(m.before),
            "after": self._row(m.after),
            "source": {
                "version": VERSION,
                "connector": "postgresql",
                "name": origin.name,
                "ts_ms": ts_ms,
                "snapshot": "true" if m.operation is Operation.IMPORT else "false",
                "db": origin.database,
                "sequence": None,
                "ts_us": ts_us,
                "ts_ns": ts_ns,
                "schema": m.namespace,
                "table": m.name,
                "txId": m.xid or None,
                "lsn": m.lsn,
                "xmin": None,
                "origin": None,
                "origin_lsn": None,
            },
            "transaction": None,
            "op": OPS[m.operation],
            "ts_ms": ts_ms,
            "ts_us": ts_us,
            "ts_ns": ts_ns,
        }

    def new_rows(self, shape: TableShape) -> Payloads | None:
        """What `key_payload` and `payload` give for the Insert or Update (without old
        tuple) whose message `data` is, read from its bytes (module docstring); None
        when `shape` is not this table's. The envelope returned is reused for the next
        change: encode it before."""
        columns = shape.columns
        if columns != tuple(self._fields):
            return None
        read = compile_row_reader(
            columns,
            [
                text_reader(self._fields[c.name], c, codec)
                for c, codec in zip(self._columns, shape.codecs, strict=True)
            ],
        )
        # what an unchanged TOASTed value (the reader's UNCHANGED_TOAST) is in each column
        unavailable = {n: convert_value(ft, UNCHANGED_TOAST) for n, ft in self._fields.items()}
        keys = self._keys
        ops = OPS
        # the envelope of the transaction last seen: only lsn, op and after change within it
        time: datetime | None = None
        transaction = -1
        payload: dict[str, Any] = {}
        source: dict[str, Any] = {}

        def payloads(
            data: bytes, commit_time: datetime, lsn: int, xid: int, op: Operation
        ) -> tuple[dict[str, object] | None, dict[str, object]] | None:
            nonlocal time, transaction, payload, source
            after = read(data)
            if after is None:
                return None
            if UNCHANGED_TOAST in after.values():
                after = {n: unavailable[n] if v is UNCHANGED_TOAST else v for n, v in after.items()}
            if commit_time is not time or xid != transaction:
                time, transaction = commit_time, xid
                payload = self.payload(
                    Modification(
                        commit_time, 0, lsn, xid, op, shape.namespace, shape.name, None, None
                    )
                )
                source = payload["source"]
            payload["after"] = after
            payload["op"] = ops[op]
            source["lsn"] = lsn
            return ({k: after[k] for k in keys} if keys else None), payload

        return payloads

    def row_encoder(self, shape: TableShape) -> Encode | None:
        """The Kafka sink's encoder of this shape's new rows from pgoutput's bytes to
        the key and value `key` and `value` write (formats.kafka.TableFormat)."""
        payloads = self.new_rows(shape)
        if payloads is None:
            return None
        value_schema = self._value_schema
        key_schema = self._key_schema
        # the schemas' JSON written once (--debezium-schemas)
        value_json = orjson.Fragment(dumps(value_schema)) if value_schema is not None else None
        key_json = orjson.Fragment(dumps(key_schema)) if key_schema is not None else None

        def encode(
            data: bytes, commit_time: datetime, sequence: int, lsn: int, xid: int, op: Operation
        ) -> tuple[bytes | None, bytes] | None:
            got = payloads(data, commit_time, lsn, xid, op)
            if got is None:
                return None
            key, payload = got
            if key is not None:
                key = key if key_json is None else {"schema": key_json, "payload": key}
            if value_json is not None:
                payload = {"schema": value_json, "payload": payload}
            return (None if key is None else dumps(key)), dumps(payload)

        return encode


class DebeziumFormat:
    """The Kafka sink's Format (formats/kafka.py) of --format debezium in JSON: the
    tables' DebeziumTable, with their row route; no registry."""

    def __init__(self, origin: Origin, schemas: bool) -> None:
        self._encoder = DebeziumEncoder(origin, schemas)

    def table(self, schema: Schema, topic: str) -> DebeziumTable:
        return self._encoder.table(schema)

    def close(self) -> None:
        pass


class DebeziumEncoder:
    """--format debezium (with --debezium-schemas, JsonConverter's schemas too)."""

    def __init__(self, origin: Origin, schemas: bool = False) -> None:
        self._origin = origin
        self._schemas = schemas

    def table(self, schema: Schema) -> DebeziumTable:
        return DebeziumTable(schema, self._origin, self._schemas)
