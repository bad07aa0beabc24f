"""Value kinds: the one table every encoder reads a column's type from.

A column's `ValueCodec` (changelog.typemap.codec_for) carries a `kind`: what its values
are, whatever the PostgreSQL type is called (a domain has its base type's kind, every
text-like type is TEXT). `KINDS` says, per kind, everything that depends on it alone:

| kind        | Avro type (logicalType)        | narrower (1) | text (2) | C kind (3) |
|-------------|--------------------------------|--------------|----------|------------|
| boolean     | boolean                        |              |          | 1          |
| int         | int                            |              |          | 2          |
| long        | long                           |              |          | 3          |
| text        | string                         |              | yes      | 4          |
| uuid        | string (uuid)                  |              | yes      | 4          |
| bytes       | bytes                          |              |          | 5          |
| float       | float                          |              |          | 6          |
| double      | double                         |              |          | 7          |
| decimal     | bytes (decimal p,s)            | yes          |          | 8          |
| date        | int (date)                     | yes          |          | 9          |
| time        | long (time-micros)             | yes          |          | 10         |
| timestamp   | long (local-timestamp-micros)  | yes          |          | 11         |
| timestamptz | long (timestamp-micros)        | yes          |          | 12         |
| numeric     | string                         |              |          | 13         |
| array       | array of the element's union   | yes          |          | 14         |

(1) The Avro type's domain is narrower than PostgreSQL's (infinity, BC and after-9999
    dates, time 24:00:00, NaN in numeric(p,s), arrays with several dimensions or other
    lower bounds): a field of it is ["null", T, "string"] (`rowschema.nullable`).
(2) A value is its text as a str (the decoder is bytes.decode, for JSON too): an import
    keeps such columns as the strings Arrow gives.
(3) `_avro_native.c`'s enum Kind: how the C encoder reads the column's text.

Who reads it: typemap builds the codecs from it, rowschema the unions, the Avro encoder
(formats.avro) picks its converters by kind and the C encoder (formats.avro_native)
its column kinds. Encoders built from a Schema record alone (the Kafka sink's) read the
kind back from a field's Avro type with `kind_of`, through the same table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["KINDS", "Kind", "KindSpec", "RowColumn", "ValueCodec", "kind_of"]


class Kind(StrEnum):
    """What the values of a column are (see the module docstring)."""

    BOOLEAN = "boolean"
    INT = "int"
    LONG = "long"
    TEXT = "text"
    UUID = "uuid"
    BYTES = "bytes"
    FLOAT = "float"
    DOUBLE = "double"
    DECIMAL = "decimal"
    DATE = "date"
    TIME = "time"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"
    NUMERIC = "numeric"
    ARRAY = "array"


@dataclass(frozen=True, slots=True)
class KindSpec:
    """What depends on a value kind alone."""

    avro: Mapping[str, Any]
    """The Avro type, without pg.type (decimal: precision and scale come per column; array:
    its items come from the element's codec)."""
    narrower: bool
    """Whether a field of it has the "string" branch for values Avro cannot hold."""
    native: int
    """The C encoder's kind number (_avro_native.c's enum Kind)."""
    text: bool = False
    """Whether a value is its text as a str, in Python and JSON alike."""


KINDS: Mapping[Kind, KindSpec] = {
    Kind.BOOLEAN: KindSpec({"type": "boolean"}, False, 1),
    Kind.INT: KindSpec({"type": "int"}, False, 2),
    Kind.LONG: KindSpec({"type": "long"}, False, 3),
    Kind.TEXT: KindSpec({"type": "string"}, False, 4, text=True),
    Kind.UUID: KindSpec({"type": "string", "logicalType": "uuid"}, False, 4, text=True),
    Kind.BYTES: KindSpec({"type": "bytes"}, False, 5),
    Kind.FLOAT: KindSpec({"type": "float"}, False, 6),
    Kind.DOUBLE: KindSpec({"type": "double"}, False, 7),
    Kind.DECIMAL: KindSpec({"type": "bytes", "logicalType": "decimal"}, True, 8),
    Kind.DATE: KindSpec({"type": "int", "logicalType": "date"}, True, 9),
    Kind.TIME: KindSpec({"type": "long", "logicalType": "time-micros"}, True, 10),
    Kind.TIMESTAMP: KindSpec({"type": "long", "logicalType": "local-timestamp-micros"}, True, 11),
    Kind.TIMESTAMPTZ: KindSpec({"type": "long", "logicalType": "timestamp-micros"}, True, 12),
    Kind.NUMERIC: KindSpec({"type": "string"}, False, 13),
    Kind.ARRAY: KindSpec({"type": "array"}, True, 14),
}

#: (Avro type, logicalType) -> kind, the inverse of KINDS; an unconstrained numeric is an
#: Avro string like text, told apart by kind_of
_BY_AVRO: Mapping[tuple[object, object], Kind] = {
    (spec.avro["type"], spec.avro.get("logicalType")): kind
    for kind, spec in KINDS.items()
    if kind is not Kind.NUMERIC
}


def kind_of(avro: Any) -> Kind:
    """The kind of a field's Avro type (a codec's `avro`, or a type name), for encoders
    that only hold a Schema record's row record; ValueError for a type no codec makes."""
    if isinstance(avro, str):
        avro = {"type": avro}
    kind = _BY_AVRO.get((avro.get("type"), avro.get("logicalType")))
    if kind is None:
        raise ValueError(f"no value kind has the Avro type {avro!r}")
    if kind is Kind.TEXT and avro.get("pg.type") == "numeric":
        # typemap writes pg.type 'numeric' on the unconstrained numeric only (numeric(p,s)
        # is a decimal; a domain over numeric carries the domain's name, and its text is
        # passed on as text: numeric_out's text either way)
        return Kind.NUMERIC
    return kind


@dataclass(frozen=True, slots=True)
class ValueCodec:
    """How to represent the values of one column type."""

    avro: Any
    """The Avro type of a non-null value (a dict with a "pg.type" property)."""
    decode: Callable[[bytes], object]
    """Text output bytes → Python value."""
    pg_type: str
    """The PostgreSQL type, with modifiers: 'numeric(10,2)', 'varchar(20)', 'int4[]'."""
    to_json: Callable[[bytes], object]
    """Text output bytes → a value `jsonenc.dumps` writes exactly as it writes `decode`'s
    result, made without building the Python value where that is cheaper (see
    pgvalues' "JSON fast path"); for most types it is `decode` itself."""
    kind: Kind
    """What the values are (KINDS): encoders choose by it, never by the decoder."""


@dataclass(frozen=True, slots=True)
class RowColumn:
    """One column of a table, as `rowschema.avro_row_schema` needs it."""

    name: str
    codec: ValueCodec
    is_key: bool
