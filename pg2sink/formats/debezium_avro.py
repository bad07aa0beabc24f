"""--format debezium --debezium-avro: Debezium's change events in Avro through the schema
registry, as Kafka Connect's AvroConverter writes them (the Confluent wire format: magic
byte 0, the 4-byte schema id, the Avro binary body; subjects `<topic>-key` and
`<topic>-value`).

The Avro schemas are the Connect schemas of debezium.py (those --debezium-schemas
writes in JSON) translated by AvroConverter's rules (its default settings):

- a struct is a record named by the Connect name's last part, in the namespace before
  it (`app.public.users.Envelope`: record `Envelope` in `app.public.users`;
  `io.debezium.connector.postgresql.Source`), with `connect.name` (and
  `connect.version`) kept as properties;
- int8/int16 are Avro ints with `connect.type`, int32 int, int64 long, float32 float,
  float64 double;
- a named Connect type (Debezium's semantic types: `io.debezium.time.MicroTimestamp`,
  `io.debezium.data.Json`...) keeps its name and parameters as `connect.name`,
  `connect.version` and `connect.parameters` on the Avro type; Connect's `Decimal` is
  also Avro's `decimal` logical type (precision and scale);
- an optional field is the union `["null", T]` with default null; one with a Connect
  default (source.snapshot's "false") is `[T, "null"]` with that default, and
  `connect.default` on T.

Values are the JSON payload's, with the base64 strings of bytes fields (Decimal,
bytea, VariableScaleDecimal's value) as bytes; on the Kafka sink's row route the
payload of a new row comes from debezium.DebeziumTable.new_rows and its row and key are
written by `_binary`, the bytes fastavro writes for them (tests/formats/
test_debezium_rows.py compares the routes) at a fraction of its cost per call.
"""

from __future__ import annotations

import io
import struct
from base64 import b64decode
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import fastavro

from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.formats.avro import avro_long, avro_string
from pg2sink.formats.base import Origin
from pg2sink.formats.debezium import DebeziumEncoder, DebeziumTable
from pg2sink.schema_registry import SchemaRegistry, key_subject, value_subject, wire_header

if TYPE_CHECKING:
    from pg2sink.changelog.builder import TableShape
    from pg2sink.formats.avro_native import Encode

__all__ = ["DebeziumAvroFormat", "avro_schema", "avro_value"]

#: Connect's primitive types in Avro
_PRIMITIVES = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}
_DECIMAL = "org.apache.kafka.connect.data.Decimal"


def _split(name: str) -> tuple[str, str | None]:
    """A Connect name as Avro's record name and namespace."""
    namespace, _, last = name.rpartition(".")
    return last, namespace or None


def _connect_properties(connect: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "doc" in connect:
        out["connect.doc"] = connect["doc"]
    if "version" in connect:
        out["connect.version"] = connect["version"]
    if "parameters" in connect:
        out["connect.parameters"] = dict(connect["parameters"])
    if "default" in connect:
        out["connect.default"] = connect["default"]
    if "name" in connect:
        out["connect.name"] = connect["name"]
    return out


def _record(connect: Mapping[str, Any], seen: set[str]) -> Any:
    full = connect.get("name") or "io.confluent.connect.avro.ConnectDefault"
    if full in seen:  # Avro defines a name once; later uses refer to it
        return full
    seen.add(full)
    name, namespace = _split(full)
    out: dict[str, Any] = {"type": "record", "name": name}
    if namespace:
        out["namespace"] = namespace
    out["fields"] = [_field(f, seen) for f in connect["fields"]]
    return {**out, **_connect_properties(connect)}


def _field(connect: Mapping[str, Any], seen: set[str]) -> dict[str, Any]:
    schema = avro_schema(connect, seen)
    if not connect.get("optional"):
        return {"name": connect["field"], "type": schema}
    if connect.get("default") is not None:
        return {"name": connect["field"], "type": [schema, "null"], "default": connect["default"]}
    return {"name": connect["field"], "type": ["null", schema], "default": None}


def avro_schema(connect: Mapping[str, Any], seen: set[str] | None = None) -> Any:
    """The Avro schema of a Connect schema (JsonConverter's JSON form), by AvroConverter's
    rules (see the module docstring); a field's optionality is its field's business.
    `seen`: the records defined so far in the enclosing schema."""
    seen = set() if seen is None else seen
    type_ = connect["type"]
    if type_ == "struct":
        return _record(connect, seen)
    if type_ == "array":
        items = avro_schema(connect["items"], seen)
        return {
            "type": "array",
            "items": ["null", items] if connect["items"].get("optional") else items,
        }
    props = _connect_properties(connect)
    if type_ in ("int8", "int16"):
        props = {"connect.type": type_, **props}
    if connect.get("name") == _DECIMAL:
        params = connect.get("parameters", {})
        props["logicalType"] = "decimal"
        props["precision"] = int(params.get("connect.decimal.precision", 0))
        props["scale"] = int(params.get("scale", 0))
    if not props:
        return _PRIMITIVES[type_]
    return {"type": _PRIMITIVES[type_], **props}


def avro_value(connect: Mapping[str, Any], value: Any) -> Any:
    """A JSON payload value as the Avro datum of `avro_schema(connect)`: base64 bytes
    decoded, Decimal as its unscaled bytes (what the decimal logical type holds)."""
    if value is None:
        return None
    type_ = connect["type"]
    if type_ == "struct":
        return {f["field"]: avro_value(f, value.get(f["field"])) for f in connect["fields"]}
    if type_ == "array":
        return [avro_value(connect["items"], v) for v in value]
    if type_ == "bytes":
        return b64decode(value)
    return value


class _AvroTable:
    """One table shape's keys and values in the wire format."""

    __slots__ = ("_key", "_key_header", "_table", "_value", "_value_header")

    def __init__(self, table: DebeziumTable, registry: SchemaRegistry, topic: str) -> None:
        self._table = table
        value_connect = table.value_schema
        value_avro = avro_schema(value_connect)
        self._value = _writer(value_connect, value_avro)
        self._value_header = wire_header(registry.register(value_subject(topic), value_avro))
        key_connect = table.key_schema
        self._key: Callable[[Any], bytes] | None = None
        self._key_header = b""
        if key_connect is not None:
            key_avro = avro_schema(key_connect)
            self._key = _writer(key_connect, key_avro)
            self._key_header = wire_header(registry.register(key_subject(topic), key_avro))

    def key(self, row: Mapping[str, object]) -> bytes | None:
        payload = self._table.key_payload(row)
        if payload is None or self._key is None:
            return None
        return self._key_header + self._key(payload)

    def value(self, m: Modification) -> bytes:
        return self._value_header + self._value(self._table.payload(m))

    def row_encoder(self, shape: TableShape) -> Encode | None:
        """The encoder of this shape's new rows from pgoutput's bytes to what `key` and
        `value` write (formats.kafka.TableFormat): the row by the writer of its own
        record (Avro's record is its fields one after the other), the envelope's bytes
        around it made once per transaction and operation (`_around`)."""
        payloads = self._table.new_rows(shape)
        if payloads is None:
            return None
        after = self._table.value_schema["fields"][1]  # the row's struct
        write_row = _binary(after, field=False) or _writer(after, avro_schema(after))
        key_connect = self._table.key_schema
        key_writer = self._key if key_connect is None else _binary(key_connect) or self._key
        key_header = self._key_header
        value_header = self._value_header
        envelope: object = None  # the transaction's (new_rows makes one per transaction)
        pieces: dict[Operation, tuple[bytes, bytes]] = {}

        def encode(
            data: bytes, commit_time: datetime, sequence: int, lsn: int, xid: int, op: Operation
        ) -> tuple[bytes | None, bytes] | None:
            nonlocal envelope, pieces
            got = payloads(data, commit_time, lsn, xid, op)
            if got is None:
                return None
            key, payload = got
            if payload is not envelope:
                envelope, pieces = payload, {}
            around = pieces.get(op)
            if around is None:
                around = pieces[op] = self._around(payload)
            try:
                row = write_row(payload["after"])
                key_bytes = (
                    None if key is None or key_writer is None else key_header + key_writer(key)
                )
            except (TypeError, ValueError, struct.error):
                return None  # a value Avro's type cannot hold (a 2-D array): the record's error
            # before null, after its union's branch 1, the row, the rest with lsn's long
            head, tail = around
            return key_bytes, b"".join(
                (value_header, b"\x00\x02", row, head, b"\x02", avro_long(lsn), tail)
            )

        return encode

    def _around(self, payload: dict[str, Any]) -> tuple[bytes, bytes]:
        """The envelope's bytes after the row, before and after the lsn's: those of
        `payload` with a null row and lsn and with lsn 0 differ in that union only (a
        null's byte, long 0's two)."""
        source = payload["source"]
        saved = payload["after"], source["lsn"]
        payload["after"] = source["lsn"] = None
        none = self._value(payload)
        source["lsn"] = 0
        zero = self._value(payload)
        payload["after"], source["lsn"] = saved
        at = next(i for i, (a, b) in enumerate(zip(none, zero, strict=False)) if a != b)
        if none[:2] != b"\x00\x00" or none[at:] != b"\x00" + zero[at + 2 :]:
            raise AssertionError("Debezium's envelope: before, after first, lsn a long")
        return none[2:at], none[at + 1 :]


def _boolean(value: Any) -> bytes:
    return b"\x01" if value else b"\x00"


def _bytes(value: Any) -> bytes:
    data = b64decode(value)
    return avro_long(len(data)) + data


#: Connect's primitive types -> Avro's binary of their JSON payload value
_BINARY: dict[str, Callable[[Any], bytes]] = {
    "int8": avro_long,
    "int16": avro_long,
    "int32": avro_long,
    "int64": avro_long,
    "float": struct.Struct("<f").pack,
    "double": struct.Struct("<d").pack,
    "boolean": _boolean,
    "string": avro_string,
    "bytes": _bytes,
}


def _binary(connect: Mapping[str, Any], field: bool = True) -> Callable[[Any], bytes] | None:
    """Avro's binary of a JSON payload value of `connect` (a field's, with its optional
    union, unless not `field`), as fastavro writes `avro_value(connect, value)` for
    `avro_schema`'s type; None for a type written by fastavro alone (a union with a
    default first). The row route's writer: fastavro's per call costs many times this."""
    type_ = connect["type"]
    encode: Callable[[Any], bytes] | None
    if type_ == "struct":
        fields = [(f["field"], _binary(f)) for f in connect["fields"]]
        if any(e is None for _, e in fields):
            return None
        encoders = cast(list[tuple[str, Callable[[Any], bytes]]], fields)

        def encode(value: Any) -> bytes:
            return b"".join([e(value.get(name)) for name, e in encoders])

    elif type_ == "array":
        item = _binary(connect["items"])
        if item is None:
            return None

        def encode(value: Any) -> bytes:
            if not value:
                return b"\x00"
            return avro_long(len(value)) + b"".join([item(v) for v in value]) + b"\x00"

    else:
        encode = _BINARY.get(type_)
    if encode is None or not field or not connect.get("optional"):
        return encode
    if connect.get("default") is not None:
        return None  # [T, "null"] (avro_schema's _field)
    present = encode

    def optional(value: Any) -> bytes:
        return b"\x00" if value is None else b"\x02" + present(value)

    return optional


def _writer(connect: Mapping[str, Any], avro: Any) -> Callable[[Any], bytes]:
    parsed = fastavro.parse_schema(avro)
    return partial(_write, connect, parsed)


def _write(connect: Mapping[str, Any], parsed: Any, payload: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, avro_value(connect, payload))
    return out.getvalue()


class DebeziumAvroFormat:
    """The Kafka sink's Format (formats/kafka.py) of --format debezium
    --debezium-avro: each table shape's key and value schemas registered, then the wire
    format."""

    def __init__(self, origin: Origin, registry: SchemaRegistry) -> None:
        self._encoder = DebeziumEncoder(origin)
        self.registry = registry

    def table(self, schema: Schema, topic: str) -> _AvroTable:
        return _AvroTable(self._encoder.table(schema), self.registry, topic)

    def close(self) -> None:
        self.registry.close()
