"""PostgreSQL types → value kinds, Avro types and text decoders, as data.

`codec_for` picks, for a column's type and modifier, a `ValueCodec`: the value kind
(changelog.codecs.KINDS, which gives the Avro type), the Avro type with its "pg.type",
and the functions that turn the text bytes into a Python value or its JSON form.

The choice is made by looking up tables, in this order:

1. `_BUILTIN`: built-in types by pg_catalog typname;
2. `_EXTENSION`: extension types by name, in whatever schema the extension lives;
3. arrays (`PgType.element` set): an Avro array of the nullable element type;
4. `_BY_TYPTYPE`: enums, domains, composites, ranges, multiranges;
5. anything else: a string holding PostgreSQL's text form.

Adding a type is adding a row to one of these tables, plus a test.

In a row record, a column's union is `nullable(avro)`: ["null", T], or ["null", T, "string"]
when T is narrower than the PostgreSQL type (date, time, timestamps, decimal, array).

| PostgreSQL              | Avro                                 | Python value                    |
|-------------------------|--------------------------------------|---------------------------------|
| bool                    | boolean                              | bool                            |
| int2, int4              | int                                  | int                             |
| int8, oid, xid, cid     | long                                 | int                             |
| xid8 (uint64)           | string                               | str                             |
| float4, float8          | float, double                        | float; NaN, ±Infinity: PgText   |
| numeric(p,s)            | bytes, decimal(p,s) (see below)      | Decimal; NaN: PgText            |
| numeric                 | string                               | Decimal; NaN, ±Infinity: PgText |
| money                   | string (locale-formatted, '$1.50')   | str                             |
| text, varchar, bpchar, name, citext | string                   | str (bpchar keeps its padding)  |
| bytea                   | bytes                                | bytes                           |
| uuid                    | string, uuid                         | str                             |
| date                    | int, date                            | date; see PgText                |
| time                    | long, time-micros                    | time; '24:00:00': PgText        |
| timestamp               | long, local-timestamp-micros         | naive datetime; see PgText      |
| timestamptz             | long, timestamp-micros               | datetime in UTC; see PgText     |
| enum                    | string                               | str (the label)                 |
| domain                  | the codec of its base type           |                                 |
| T[]                     | array of nullable(T)                 | list, PgArray (n-D), PgText (2) |
| anything else           | string                               | str (PostgreSQL's text form)    |

(2) An array with a lower bound other than 1, e.g. '[0:1]={1,2}'.

Avro requires 0 <= scale <= precision, PostgreSQL 15 does not: numeric(5,-2) becomes
decimal(7,0) and numeric(3,5) becomes decimal(5,5), the narrowest that hold every value.
An unconstrained numeric is an Avro string but decodes to an exact Decimal: writers put
format(value, "f") in the string, which gives back PostgreSQL's digits (str() would write
0.00000001 as 1E-8).

The PgText and PgArray values, and the decoders, are in changelog.pgvalues; the row
record built from the codecs in changelog.rowschema.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pg2sink.catalog.types import PgType
from pg2sink.changelog.arrays import parse_array
from pg2sink.changelog.codecs import KINDS, Kind, KindSpec, RowColumn, ValueCodec, kind_of
from pg2sink.changelog.pgvalues import PgArray, PgText
from pg2sink.changelog.pgvalues import _decode_bool as _decode_bool
from pg2sink.changelog.pgvalues import _decode_bytea as _decode_bytea
from pg2sink.changelog.pgvalues import _decode_date as _decode_date
from pg2sink.changelog.pgvalues import _decode_float as _decode_float
from pg2sink.changelog.pgvalues import _decode_numeric as _decode_numeric
from pg2sink.changelog.pgvalues import _decode_text as _decode_text
from pg2sink.changelog.pgvalues import _decode_time as _decode_time
from pg2sink.changelog.pgvalues import _decode_timestamp as _decode_timestamp
from pg2sink.changelog.pgvalues import _decode_timestamptz as _decode_timestamptz
from pg2sink.changelog.pgvalues import _json_bytea as _json_bytea
from pg2sink.changelog.pgvalues import _json_float as _json_float
from pg2sink.changelog.pgvalues import _json_number as _json_number
from pg2sink.changelog.rowschema import avro_name, avro_row_schema, nullable

# The codec types, the row schema and the value classes are re-exported: callers take
# the type mapping from this one module (the decoders' "as" imports keep them reachable
# as typemap._decode_date etc. for the fast reader's tests, which inline by converter).
__all__ = [
    "KINDS",
    "Kind",
    "KindSpec",
    "PgArray",
    "PgText",
    "RowColumn",
    "ValueCodec",
    "avro_name",
    "avro_row_schema",
    "codec_for",
    "kind_of",
    "nullable",
]


# --- type modifiers (atttypmod) as format_type() prints them ---


def _numeric_precision_scale(typmod: int) -> tuple[int, int]:
    # numeric.c: typmod = ((precision << 16) | (scale & 0x7ff)) + VARHDRSZ; since
    # PostgreSQL 15 the scale is an 11-bit two's complement number (-1000 .. 1000).
    bits = typmod - 4
    return (bits >> 16) & 0xFFFF, ((bits & 0x7FF) ^ 1024) - 1024


def _numeric_modifier(typmod: int) -> str:
    precision, scale = _numeric_precision_scale(typmod)
    return f"({precision},{scale})"


def _length_modifier(typmod: int) -> str:
    # varchar(n) and bpchar(n) store n + VARHDRSZ
    return f"({typmod - 4})"


def _plain_modifier(typmod: int) -> str:
    # bit(n), varbit(n), time(p), timetz(p), timestamp(p), timestamptz(p)
    return f"({typmod})"


# datetime.h: the bits of an interval's field restriction, keyed by the mask (bit 1 MONTH,
# 2 YEAR, 3 DAY, 10 HOUR, 11 MINUTE, 12 SECOND), as intervaltypmodout() prints them.
_INTERVAL_FIELDS: Mapping[int, str] = {
    0x7FFF: "",
    1 << 2: " year",
    1 << 1: " month",
    1 << 3: " day",
    1 << 10: " hour",
    1 << 11: " minute",
    1 << 12: " second",
    (1 << 2) | (1 << 1): " year to month",
    (1 << 3) | (1 << 10): " day to hour",
    (1 << 3) | (1 << 10) | (1 << 11): " day to minute",
    (1 << 3) | (1 << 10) | (1 << 11) | (1 << 12): " day to second",
    (1 << 10) | (1 << 11): " hour to minute",
    (1 << 10) | (1 << 11) | (1 << 12): " hour to second",
    (1 << 11) | (1 << 12): " minute to second",
}


def _interval_modifier(typmod: int) -> str:
    fields = _INTERVAL_FIELDS.get((typmod >> 16) & 0x7FFF, "")
    precision = typmod & 0xFFFF
    return fields if precision == 0xFFFF else f"{fields}({precision})"


# --- kinds that depend on the modifier ---


def _numeric_kind(typmod: int) -> tuple[Kind, dict[str, Any]] | None:
    """numeric(p,s) → the decimal kind and its Avro decimal; None for an unconstrained
    numeric (the numeric kind, an Avro string).

    Avro wants 0 <= scale <= precision
    (https://avro.apache.org/docs/1.11.1/specification/#decimal). PostgreSQL 15 also allows
    a negative scale (numeric(5,-2): integers rounded to hundreds, up to 7 digits) and a
    scale above the precision (numeric(3,5): values below 0.01 with 5 decimals); both map
    to the narrowest Avro decimal that holds every value exactly.
    """
    if typmod < 4:
        return None
    precision, scale = _numeric_precision_scale(typmod)
    if scale < 0:
        precision, scale = precision - scale, 0
    elif scale > precision:
        precision = scale
    return Kind.DECIMAL, {**KINDS[Kind.DECIMAL].avro, "precision": precision, "scale": scale}


# --- the tables ---


@dataclass(frozen=True, slots=True)
class _Row:
    """One mapping: the value kind (which gives the Avro type) and the decoder of a type."""

    kind: Kind
    decode: Callable[[bytes], object]
    modifier: Callable[[int], str] | None = None
    """Formats a typmod >= 0 for pg.type, e.g. 24 → '(20)' for varchar."""
    typmod_kind: Callable[[int], tuple[Kind, dict[str, Any]] | None] | None = None
    """A kind and Avro type that depend on the typmod, overriding `kind` unless it
    returns None (numeric(p,s))."""
    to_json: Callable[[bytes], object] | None = None
    """JSON fast path (None: `decode` serves JSON as well)."""


_TEXT = _Row(Kind.TEXT, _decode_text)
_LONG = _Row(Kind.LONG, int)

# Built-in types by typname (pg_catalog only). Types not listed are strings with their
# text form, except arrays, which the array rule handles.
_BUILTIN: Mapping[str, _Row] = {
    "bool": _Row(Kind.BOOLEAN, _decode_bool),
    "int2": _Row(Kind.INT, int),
    "int4": _Row(Kind.INT, int),
    "int8": _LONG,
    "oid": _LONG,
    "xid": _LONG,
    "cid": _LONG,
    # xid8 is a uint64 whose input accepts up to 2^64 - 1: that can overflow an Avro long.
    "xid8": _TEXT,
    "float4": _Row(Kind.FLOAT, _decode_float, to_json=_json_float),
    "float8": _Row(Kind.DOUBLE, _decode_float, to_json=_json_float),
    "numeric": _Row(
        Kind.NUMERIC, _decode_numeric, _numeric_modifier, _numeric_kind, to_json=_json_number
    ),
    # money's text depends on lc_monetary ('$1,234.56'): no safe way back to a number.
    "money": _TEXT,
    "text": _TEXT,
    "varchar": _Row(Kind.TEXT, _decode_text, _length_modifier),
    "bpchar": _Row(Kind.TEXT, _decode_text, _length_modifier),
    "name": _TEXT,
    "bytea": _Row(Kind.BYTES, _decode_bytea, to_json=_json_bytea),
    "uuid": _Row(Kind.UUID, _decode_text),
    "date": _Row(Kind.DATE, _decode_date),
    "time": _Row(Kind.TIME, _decode_time, _plain_modifier),
    "timestamp": _Row(Kind.TIMESTAMP, _decode_timestamp, _plain_modifier),
    "timestamptz": _Row(Kind.TIMESTAMPTZ, _decode_timestamptz, _plain_modifier),
    # strings, listed only for the modifier in pg.type
    "timetz": _Row(Kind.TEXT, _decode_text, _plain_modifier),
    "interval": _Row(Kind.TEXT, _decode_text, _interval_modifier),
    "bit": _Row(Kind.TEXT, _decode_text, _plain_modifier),
    "varbit": _Row(Kind.TEXT, _decode_text, _plain_modifier),
}

# Extension types by typname, in any schema (CREATE EXTENSION ... SCHEMA x puts them in x).
_EXTENSION: Mapping[str, _Row] = {
    "citext": _TEXT,
}


def _row_codec(row: _Row, t: PgType, typmod: int) -> ValueCodec:
    pg_type = t.display_name
    if row.modifier is not None and typmod >= 0:
        pg_type += row.modifier(typmod)
    kind, avro = row.kind, dict(KINDS[row.kind].avro)
    if row.typmod_kind is not None:
        kind, avro = row.typmod_kind(typmod) or (kind, avro)
    avro["pg.type"] = pg_type
    return ValueCodec(avro, row.decode, pg_type, row.to_json or row.decode, kind)


def _text_codec(t: PgType, typmod: int) -> ValueCodec:
    avro = {**KINDS[Kind.TEXT].avro, "pg.type": t.display_name}
    return ValueCodec(avro, _decode_text, t.display_name, _decode_text, Kind.TEXT)


def _enum_codec(t: PgType, typmod: int) -> ValueCodec:
    # A string, not an Avro enum: adding a label (ALTER TYPE ... ADD VALUE, which pgoutput
    # does not even announce with a new Relation) would make the new schema unreadable by
    # consumers holding the old one, and schema registries reject that under their default
    # BACKWARD compatibility.
    return _text_codec(t, typmod)


def _domain_codec(t: PgType, typmod: int) -> ValueCodec:
    if t.base is None:
        return _text_codec(t, typmod)
    # A column of a domain type has no modifier of its own; the domain's base type has.
    base = codec_for(t.base, t.base_typmod if t.base_typmod >= 0 else typmod)
    avro = dict(base.avro)
    avro["pg.type"] = t.display_name
    return ValueCodec(avro, base.decode, t.display_name, base.to_json, base.kind)


def _array_codec(t: PgType, typmod: int) -> ValueCodec:
    assert t.element is not None
    # The column's modifier belongs to the element: varchar(20)[] has atttypmod 24.
    element = codec_for(t.element, typmod)
    decode_element = element.decode
    element_to_json = element.to_json
    # array_out separates elements with the element type's typdelim (';' for box)
    delimiter = t.element.delimiter

    # array_out writes a dimension decoration ('[0:1]={1,2}') only when a lower bound is
    # not 1. Lists have no lower bounds, so such a value stays PostgreSQL's text (PgText),
    # checked by the parser first; the common '{...}' value pays one byte comparison.
    def decode(text: bytes) -> object:
        value = parse_array(text, decode_element, delimiter)
        if text[:1] != b"{":
            return PgText(text.decode())
        if value and value[0].__class__ is list:
            return PgArray(value, text.decode())
        return value

    def to_json(text: bytes) -> object:
        value = parse_array(text, element_to_json, delimiter)
        if text[:1] != b"{":
            return PgText(text.decode())
        return value

    pg_type = element.pg_type + "[]"
    avro = {**KINDS[Kind.ARRAY].avro, "items": nullable(element.avro), "pg.type": pg_type}
    return ValueCodec(avro, decode, pg_type, to_json, Kind.ARRAY)


# By typtype, for types that are not built in.
_BY_TYPTYPE: Mapping[str, Callable[[PgType, int], ValueCodec]] = {
    "e": _enum_codec,
    "d": _domain_codec,
    "c": _text_codec,  # composite: '(1,"a b")'
    "r": _text_codec,  # range: '[1,5)'
    "m": _text_codec,  # multirange: '{[1,3),[5,7)}'
}


def codec_for(t: PgType, typmod: int) -> ValueCodec:
    """The codec for values of type `t` with modifier `typmod` (atttypmod, -1 if none)."""
    if t.namespace == "pg_catalog":
        row = _BUILTIN.get(t.name)
    elif t.kind == "b":
        row = _EXTENSION.get(t.name)
    else:
        row = None
    if row is not None:
        return _row_codec(row, t, typmod)
    if t.element is not None:
        return _array_codec(t, typmod)
    return _BY_TYPTYPE.get(t.kind, _text_codec)(t, typmod)
