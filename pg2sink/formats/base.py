"""What every format shares: the protocols and the column facts a Schema record gives.

A format's Encoder makes one TableEncoder per table shape (from its Schema record, which
precedes the table's changes); the TableEncoder turns a Modification into the message's
value bytes and a row image into its key bytes. Row values reach an encoder as records
hold them (typed Python values) or, relayed from a JSON topic, in their JSON form
(ValueCodec.to_json). Both encode to the same JSON bytes (formats/jsonenc.py), so
encoders read values through `json_of` and `text_of`, never by their Python type.
"""

from __future__ import annotations

import re
from base64 import b64decode
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from pg2sink.changelog.codecs import Kind, kind_of
from pg2sink.changelog.records import Modification, Schema
from pg2sink.formats.jsonenc import dumps, loads

__all__ = [
    "Column",
    "Encoder",
    "Origin",
    "TableEncoder",
    "columns_of",
    "item_kind",
    "json_of",
    "key_columns",
    "key_of",
    "pg_array_text",
    "pg_text",
    "text_of",
]


class TableEncoder(Protocol):
    """Encodes the messages of one table shape."""

    def key(self, row: Mapping[str, object]) -> bytes | None:
        """The message key of a row image; None for a table without a key."""
        ...

    def value(self, m: Modification) -> bytes:
        """The message value of a change."""
        ...


class Encoder(Protocol):
    """A format: makes each table's encoder from its Schema record."""

    def table(self, schema: Schema) -> TableEncoder: ...


@dataclass(frozen=True)
class Origin:
    """Where the changes come from, for formats that name it (psql-streamer, Debezium).
    No secret: the host and the database name of the source's connection string."""

    host: str = ""
    database: str = ""
    name: str = "pg2sink"
    """The logical name of the source: the sink's topic or subject prefix, or the Kinesis
    stream (Debezium's `topic.prefix`, its `source.name`)."""


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table, as the Schema record describes it."""

    name: str
    pg_type: str
    """PostgreSQL's type with modifiers: 'int4', 'numeric(10,2)', 'int4[]'."""
    avro: Mapping[str, Any]
    """The Avro type of its non-null values (with "pg.type", precision, scale...)."""
    kind: Kind | None
    """Its value kind (codecs.KINDS); None for a type no kind describes."""
    key: bool


def columns_of(schema: Schema) -> tuple[Column, ...]:
    """The table's columns, in table order, from its Schema record's row schema."""
    out = []
    for f in schema.schema["fields"]:
        branches = f["type"] if isinstance(f["type"], list) else [f["type"]]
        avro = next((b for b in branches if isinstance(b, dict)), None)
        if avro is None:
            avro = {"type": next(b for b in branches if b != "null")}
        try:
            kind: Kind | None = kind_of(avro)
        except ValueError:
            kind = None
        name = f.get("pg.column", f["name"])
        out.append(Column(name, str(avro.get("pg.type", "")), avro, kind, bool(f.get("pg.key"))))
    return tuple(out)


def key_columns(schema: Schema) -> tuple[str, ...]:
    """The key columns in key order (Schema.primary_key; the row record's list else)."""
    return tuple(schema.primary_key or schema.schema.get("pg.primary_key") or ())


def key_of(columns: tuple[str, ...], row: Mapping[str, object]) -> bytes | None:
    """pg2sink's JSON key of a row, `{"id":1}` (Kafka's JSON key); None without a key."""
    if not columns:
        return None
    return dumps({c: row.get(c) for c in columns})


def json_of(value: object) -> object:
    """A value in its JSON form as plain Python: None, bool, int, Decimal (a number with
    a fraction, digit for digit), str, list, dict. The same for both value forms."""
    if value is None or value.__class__ in (bool, int, str):
        return value
    return loads(dumps(value), exact_numbers=True)


def text_of(value: object) -> str | None:
    """The text of a value: a JSON string's content, else the JSON itself (`12.50`,
    `true`, `[1,2]`); None for NULL."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    data = dumps(value)
    if data[:1] == b'"':
        text: str = orjson.loads(data)
        return text
    return data.decode()


#: a timestamp as pg2sink writes it in ISO 8601 (not infinity, BC, after year 9999)
_ISO_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\d)T([\d:.]+)(Z?)$")


def pg_text(value: object, kind: Kind | None) -> str | None:
    """The text PostgreSQL's output function writes (DateStyle ISO, TimeZone UTC) where
    pg2sink's JSON form differs by notation only: timestamps with a space and '+00',
    bytea in hex; other values as `text_of` (arrays stay JSON)."""
    text = text_of(value)
    if text is None:
        return None
    if kind is Kind.TIMESTAMP or kind is Kind.TIMESTAMPTZ:
        m = _ISO_TIMESTAMP.match(text)
        if m:
            return f"{m.group(1)} {m.group(2)}{'+00' if m.group(3) else ''}"
    elif kind is Kind.BYTES:  # bytes, or the base64 of its JSON form
        raw = bytes(value) if isinstance(value, bytes | bytearray | memoryview) else b64decode(text)
        return "\\x" + raw.hex()
    return text


def item_kind(column: Column) -> Kind | None:
    """The kind of an array column's elements; None for another column or an element
    type no kind describes."""
    if column.avro.get("type") != "array":
        return None
    items = column.avro.get("items")
    branches = items if isinstance(items, list) else [items]
    item = next((b for b in branches if isinstance(b, dict)), None)
    if item is None:
        item = {"type": next((b for b in branches if b != "null"), "string")}
    try:
        return kind_of(item)
    except ValueError:
        return None


#: what makes PostgreSQL's array_out double-quote an element (besides white space)
_ARRAY_SPECIAL = frozenset('{},"\\')


def _array_element(value: object, kind: Kind | None) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list):
        return "{" + ",".join(_array_element(v, kind) for v in value) + "}"
    if isinstance(value, bool):
        return "t" if value else "f"
    text = pg_text(value, kind) or ""
    if not text or text.upper() == "NULL" or any(c in _ARRAY_SPECIAL or c.isspace() for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def pg_array_text(value: object, kind: Kind | None) -> str | None:
    """The text PostgreSQL's array_out writes for an array value (`{a,NULL}`,
    `{{1,2},{3,4}}`, `{"a b","x\\"y"}`), its elements as pg_text writes them, booleans
    t and f; None for NULL."""
    items = json_of(value)
    if items is None:
        return None
    return _array_element(items, kind) if isinstance(items, list) else text_of(value)
