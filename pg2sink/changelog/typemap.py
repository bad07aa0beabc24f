"""PostgreSQL types → Avro types and text decoders, as data.

pgoutput sends each value as the text its type's output function prints, in a walsender
session that pg2sink starts with DateStyle=ISO, IntervalStyle=iso_8601, TimeZone=UTC,
extra_float_digits=3 and bytea_output=hex; the decoders below rely on those settings.
`codec_for` picks, for a column's type and modifier, a `ValueCodec`: the Avro type of the
value and the function that turns the text bytes into a Python value.

The choice is made by looking up tables, in this order:

1. `_BUILTIN`: built-in types by pg_catalog typname;
2. `_EXTENSION`: extension types by name, in whatever schema the extension lives;
3. arrays (`PgType.element` set): an Avro array of the nullable element type;
4. `_BY_KIND`: enums, domains, composites, ranges, multiranges;
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

Every Avro type carries a "pg.type" property with the PostgreSQL type (schema-qualified
when not built in, with its modifier: 'numeric(10,2)', 'varchar(20)[]', 'public.mood'), so
a consumer always sees what the column was.

`PgText` marks values kept as PostgreSQL's text because Python has no exact counterpart:
'NaN', 'Infinity', '-Infinity' (float and numeric), 'infinity' and '-infinity' (date,
timestamp, timestamptz), dates and timestamps BC ('0044-03-15 BC') or after year 9999
('12345-01-01'), time '24:00:00', and arrays with a lower bound other than 1
('[0:1]={1,2}'). They are str, so the JSON encoder writes them as strings. The Avro
encoder writes float(value) for float/double (IEEE has NaN and the infinities); for the
other Avro types, which have no room for them, the row schema's union has a "string"
branch (`nullable`) that takes the same text.

Multi-dimensional arrays: PostgreSQL does not record the number of dimensions in the type
(int4[] and int4[][] are the same type), so the Avro type describes one dimension while a
2-D value decodes to a `PgArray`: a list of lists that also keeps PostgreSQL's text, which
the Avro encoder writes in the "string" branch. docs/types.md is the user-facing table.
"""

from __future__ import annotations

import copy
import re
from binascii import a2b_hex, b2a_base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import orjson

from pg2sink.catalog.types import PgType
from pg2sink.changelog.arrays import parse_array
from pg2sink.logical.fastpath import register_fixed, register_inline

__all__ = [
    "PgArray",
    "PgText",
    "RowColumn",
    "ValueCodec",
    "avro_name",
    "avro_row_schema",
    "codec_for",
    "nullable",
]


class PgText(str):
    """A value kept in PostgreSQL's text form: no Python/JSON type holds it exactly."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"PgText({str.__repr__(self)})"


class PgArray(list[object]):
    """A multi-dimensional array value: nested lists, plus PostgreSQL's text of the array.

    JSON writes it as the nested lists (orjson writes list subclasses as lists). An Avro
    array type has one dimension, so the Avro encoder writes `text` instead, in the
    "string" branch of the field (see `nullable`).
    """

    __slots__ = ("text",)

    def __init__(self, items: list[object], text: str) -> None:
        super().__init__(items)
        self.text = text


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
    result, made without building the Python value where that is cheaper (see "JSON
    fast path"); for most types it is `decode` itself."""


@dataclass(frozen=True, slots=True)
class RowColumn:
    """One column of a table, as `avro_row_schema` needs it."""

    name: str
    codec: ValueCodec
    is_key: bool


# --- decoders: text bytes → value. They run for every value, so they stay small. ---

_decode_text: Callable[[bytes], object] = bytes.decode

# boolout prints 't' or 'f'; anything else raises KeyError, which RowDecoder reports.
_decode_bool: Callable[[bytes], object] = {b"t": True, b"f": False}.__getitem__


def _decode_float(text: bytes) -> object:
    value = float(text)
    # x - x is 0.0 for every finite float and NaN for NaN and the infinities
    if value - value == 0.0:
        return value
    return PgText(text.decode())


def _decode_numeric(text: bytes) -> object:
    value = Decimal(text.decode())
    if value.is_finite():
        return value
    return PgText(text.decode())


def _decode_bytea(text: bytes) -> object:
    # bytea_output=hex: '\x' then two hex digits per byte
    if text[:2] != b"\\x":
        raise ValueError("bytea value not in hex format")
    return a2b_hex(text[2:])


def _beyond_python(text: bytes, parse: Callable[[str], object]) -> PgText:
    """Date/time text Python cannot represent (infinity, BC, year > 9999) as a PgText.

    The rest of the value is still checked with `parse` (under a stand-in year 2000, a leap
    year), so malformed text raises ValueError instead of slipping through.
    """
    value = text.decode()
    if value in ("infinity", "-infinity"):
        return PgText(value)
    bc = value.endswith(" BC")
    year, dash, rest = (value[:-3] if bc else value).partition("-")
    if dash and year.isdigit() and (bc or len(year) > 4):
        parse("2000-" + rest)
        return PgText(value)
    raise ValueError(f"invalid date/time value {value!r}")


def _decode_date(text: bytes) -> object:
    try:
        return date.fromisoformat(text.decode())
    except ValueError:
        return _beyond_python(text, date.fromisoformat)


def _decode_time(text: bytes) -> object:
    try:
        return time.fromisoformat(text.decode())
    except ValueError:
        # PostgreSQL's time range ends at 24:00:00 inclusive, Python's at 23:59:59.999999
        if text == b"24:00:00":
            return PgText("24:00:00")
        raise


def _decode_timestamp(text: bytes) -> object:
    try:
        return datetime.fromisoformat(text.decode())
    except ValueError:
        return _beyond_python(text, datetime.fromisoformat)


def _decode_timestamptz(text: bytes) -> object:
    try:
        value = datetime.fromisoformat(text.decode())
    except ValueError:
        return _beyond_python(text, datetime.fromisoformat)
    # With TimeZone=UTC the offset is always +00, which fromisoformat maps to UTC itself.
    if value.tzinfo is UTC:
        return value
    if value.tzinfo is None:
        raise ValueError("timestamptz value without a UTC offset")
    return value.astimezone(UTC)


# --- JSON fast path: text bytes → what jsonenc writes, without the Python value ---
#
# The file sink only needs JSON. For the hottest types the text PostgreSQL printed is
# already the JSON: a number's digits go out as a raw JSON fragment instead of a Decimal
# that the encoder's fallback must format again, and bytea goes straight to base64.
# Dates and timestamps keep their typed decoders: fromisoformat plus orjson's native
# datetime writer beat any string reshaping in Python (measured). Tests check that both
# paths give the same JSON.

_LAST_DIGIT = ord("9")


def _json_number(text: bytes) -> object:
    # numeric_out and float8out print plain JSON-compatible numbers ('-12.50', '1e+20');
    # only NaN and the infinities end in a letter.
    if text and text[-1] <= _LAST_DIGIT:
        return orjson.Fragment(text)
    return PgText(text.decode())


def _json_float(text: bytes) -> object:
    # float8out prints negative zero as '-0', which most JSON readers (Python's json,
    # Jackson) take for the integer 0: '-0.0' keeps the sign, as the decode path writes it.
    if text == b"-0":
        return orjson.Fragment(b"-0.0")
    return _json_number(text)


def _decline() -> object:
    raise ValueError("not the common case: let the full converter decide")


# The same conversions written out for logical.fastpath's row readers, which then make
# no call per value. Each gives the converter's result for the common case and raises
# otherwise (the converter then runs and handles infinity, BC, NaN, ...).
register_inline(
    _json_number,
    "_jn_fragment(v) if (v := {})[-1] < 58 else _jn_decline()",
    _jn_fragment=orjson.Fragment,
    _jn_decline=_decline,
)
register_inline(
    _json_float,
    "_jf_fragment(v if v != b'-0' else b'-0.0') if (v := {})[-1] < 58 else _jf_decline()",
    _jf_fragment=orjson.Fragment,
    _jf_decline=_decline,
)
register_inline(
    _decode_timestamptz,
    "_tz_fromiso(v.decode()) if (v := {})[-3:] == b'+00' else _tz_decline()",
    _tz_fromiso=datetime.fromisoformat,
    _tz_decline=_decline,
)
register_inline(_decode_timestamp, "_ts_fromiso({}.decode())", _ts_fromiso=datetime.fromisoformat)
register_inline(_decode_date, "_d_fromiso({}.decode())", _d_fromiso=date.fromisoformat)
register_fixed(_decode_bool, {b"t": True, b"f": False})


def _json_bytea(text: bytes) -> object:
    return b2a_base64(_decode_bytea(text), newline=False).decode("ascii")  # type: ignore[arg-type]


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


# --- Avro types that depend on the modifier ---


def _numeric_avro(typmod: int) -> dict[str, Any] | None:
    """numeric(p,s) → Avro decimal; None for an unconstrained numeric (kept as a string).

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
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


# --- the tables ---


@dataclass(frozen=True, slots=True)
class _Row:
    """One mapping: the Avro type (without pg.type) and the decoder of a type."""

    avro: Mapping[str, Any]
    decode: Callable[[bytes], object]
    modifier: Callable[[int], str] | None = None
    """Formats a typmod >= 0 for pg.type, e.g. 24 → '(20)' for varchar."""
    avro_for_typmod: Callable[[int], dict[str, Any] | None] | None = None
    """An Avro type that depends on the typmod, overriding `avro` unless it returns None."""
    to_json: Callable[[bytes], object] | None = None
    """JSON fast path (None: `decode` serves JSON as well)."""


_STRING: Mapping[str, Any] = {"type": "string"}
_TEXT = _Row(_STRING, _decode_text)
_LONG = _Row({"type": "long"}, int)

# Built-in types by typname (pg_catalog only). Types not listed are strings with their
# text form, except arrays, which the array rule handles.
_BUILTIN: Mapping[str, _Row] = {
    "bool": _Row({"type": "boolean"}, _decode_bool),
    "int2": _Row({"type": "int"}, int),
    "int4": _Row({"type": "int"}, int),
    "int8": _LONG,
    "oid": _LONG,
    "xid": _LONG,
    "cid": _LONG,
    # xid8 is a uint64 whose input accepts up to 2^64 - 1: that can overflow an Avro long.
    "xid8": _TEXT,
    "float4": _Row({"type": "float"}, _decode_float, to_json=_json_float),
    "float8": _Row({"type": "double"}, _decode_float, to_json=_json_float),
    "numeric": _Row(
        _STRING, _decode_numeric, _numeric_modifier, _numeric_avro, to_json=_json_number
    ),
    # money's text depends on lc_monetary ('$1,234.56'): no safe way back to a number.
    "money": _TEXT,
    "text": _TEXT,
    "varchar": _Row(_STRING, _decode_text, _length_modifier),
    "bpchar": _Row(_STRING, _decode_text, _length_modifier),
    "name": _TEXT,
    "bytea": _Row({"type": "bytes"}, _decode_bytea, to_json=_json_bytea),
    "uuid": _Row({"type": "string", "logicalType": "uuid"}, _decode_text),
    "date": _Row({"type": "int", "logicalType": "date"}, _decode_date),
    "time": _Row({"type": "long", "logicalType": "time-micros"}, _decode_time, _plain_modifier),
    "timestamp": _Row(
        {"type": "long", "logicalType": "local-timestamp-micros"},
        _decode_timestamp,
        _plain_modifier,
    ),
    "timestamptz": _Row(
        {"type": "long", "logicalType": "timestamp-micros"},
        _decode_timestamptz,
        _plain_modifier,
    ),
    # strings, listed only for the modifier in pg.type
    "timetz": _Row(_STRING, _decode_text, _plain_modifier),
    "interval": _Row(_STRING, _decode_text, _interval_modifier),
    "bit": _Row(_STRING, _decode_text, _plain_modifier),
    "varbit": _Row(_STRING, _decode_text, _plain_modifier),
}

# Extension types by typname, in any schema (CREATE EXTENSION ... SCHEMA x puts them in x).
_EXTENSION: Mapping[str, _Row] = {
    "citext": _TEXT,
}


def _row_codec(row: _Row, t: PgType, typmod: int) -> ValueCodec:
    pg_type = t.display_name
    if row.modifier is not None and typmod >= 0:
        pg_type += row.modifier(typmod)
    avro = row.avro_for_typmod(typmod) if row.avro_for_typmod is not None else None
    if avro is None:
        avro = dict(row.avro)
    avro["pg.type"] = pg_type
    return ValueCodec(avro, row.decode, pg_type, row.to_json or row.decode)


def _text_codec(t: PgType, typmod: int) -> ValueCodec:
    return ValueCodec(
        {"type": "string", "pg.type": t.display_name}, _decode_text, t.display_name, _decode_text
    )


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
    return ValueCodec(avro, base.decode, t.display_name, base.to_json)


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
    avro = {"type": "array", "items": nullable(element.avro), "pg.type": pg_type}
    return ValueCodec(avro, decode, pg_type, to_json)


# By typtype, for types that are not built in.
_BY_KIND: Mapping[str, Callable[[PgType, int], ValueCodec]] = {
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
    return _BY_KIND.get(t.kind, _text_codec)(t, typmod)


# --- the Avro schema of a row ---

# Avro types whose domain is narrower than that of the PostgreSQL types mapped to them:
# infinity, BC and after-9999 dates and timestamps, time '24:00:00', NaN in numeric(p,s),
# arrays with more than one dimension or with lower bounds other than 1. A field (or array
# item) of one of these types is the union ["null", T, "string"], and such a value goes in
# the "string" branch as PostgreSQL's text: the same string the JSON encoder writes for it
# (a PgText), so a consumer detects it by its type. docs/types.md lists every case.
_NARROWER_THAN_POSTGRESQL: frozenset[tuple[str, str | None]] = frozenset(
    {
        ("int", "date"),
        ("long", "time-micros"),
        ("long", "local-timestamp-micros"),
        ("long", "timestamp-micros"),
        ("bytes", "decimal"),
        ("array", None),
    }
)


def nullable(avro: Mapping[str, Any]) -> list[Any]:
    """The union a column (or array item) of Avro type `avro` has: null first, then the
    type, then "string" for the PostgreSQL text of values the type cannot hold."""
    if (avro["type"], avro.get("logicalType")) in _NARROWER_THAN_POSTGRESQL:
        return ["null", avro, "string"]
    return ["null", avro]


_NOT_IN_AVRO_NAME = re.compile(r"[^A-Za-z0-9_]")


def avro_name(identifier: str) -> str:
    """A PostgreSQL identifier as an Avro name ([A-Za-z_][A-Za-z0-9_]*).

    Every character outside [A-Za-z0-9_] becomes '_' (one per code point), and a leading
    digit (or an empty name) gets a '_' in front: 'order id' → 'order_id', '1st' → '_1st',
    'größe' → 'gr__e'. Not injective: `avro_row_schema` makes field names unique.
    """
    name = _NOT_IN_AVRO_NAME.sub("_", identifier)
    if not name or name[0].isdigit():
        name = "_" + name
    return name


def avro_row_schema(
    namespace: str,
    table: str,
    columns: Sequence[RowColumn],
    *,
    name: str = "value",
    primary_key: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The Avro record of a row of `namespace`.`table`, one nullable field per column.

    Field names are the sanitised column names (`avro_name`); when two columns sanitise to
    the same name the later one gets '_2' (or '_3' ...), so a name depends only on the
    columns before it and new columns (which PostgreSQL adds at the end) never rename
    existing fields. The original names stay in "pg.column", "pg.namespace", "pg.table"
    and "pg.primary_key". The same input always gives an equal dict, so comparing two
    schemas tells whether the table changed. `name` is the record name: 'value' for the
    row, e.g. 'key' for a record of just the key columns. `primary_key` gives the key
    columns in key order for "pg.primary_key" (a composite key's order matters to
    consumers); without it, the key columns are listed in table order.
    """
    used: set[str] = set()
    fields: list[dict[str, Any]] = []
    for column in columns:
        base = avro_name(column.name)
        field_name, suffix = base, 2
        while field_name in used:
            field_name, suffix = f"{base}_{suffix}", suffix + 1
        used.add(field_name)
        fields.append(
            {
                "name": field_name,
                # copied so that the schema shares no mutable state with the codec
                "type": nullable(copy.deepcopy(column.codec.avro)),
                "default": None,
                "pg.column": column.name,
                "pg.key": column.is_key,
            }
        )
    return {
        "type": "record",
        "name": name,
        "namespace": avro_name(namespace) + "." + avro_name(table),
        "fields": fields,
        "pg.namespace": namespace,
        "pg.table": table,
        "pg.primary_key": (
            list(primary_key)
            if primary_key is not None
            else [column.name for column in columns if column.is_key]
        ),
    }
