"""Debezium's PostgreSQL type mapping, as data: a column's Kafka Connect schema and how
its values are written, with the connector's defaults (decimal.handling.mode=precise,
time.precision.mode=adaptive, interval.handling.mode=numeric, binary.handling.mode=bytes).

| PostgreSQL               | Connect type | semantic type (name)                           |
|--------------------------|--------------|------------------------------------------------|
| bool                     | boolean      |                                                |
| int2, int4, int8, oid    | int16/32/64  |                                                |
| float4, float8           | float32/64   |                                                |
| numeric(p,s)             | bytes        | org.apache.kafka.connect.data.Decimal (scale,  |
|                          |              | connect.decimal.precision): the unscaled value,|
|                          |              | big-endian two's complement, base64 in JSON    |
| numeric                  | struct       | io.debezium.data.VariableScaleDecimal {scale,  |
|                          |              | value}                                         |
| date                     | int32        | io.debezium.time.Date: days since 1970-01-01   |
| time(0-3)                | int32        | io.debezium.time.Time: milliseconds            |
| time, time(4-6)          | int64        | io.debezium.time.MicroTime: microseconds       |
| timestamp(0-3)           | int64        | io.debezium.time.Timestamp: ms since the epoch |
| timestamp, timestamp(4-6)| int64        | io.debezium.time.MicroTimestamp: microseconds  |
| timestamptz              | string       | io.debezium.time.ZonedTimestamp, UTC ISO 8601  |
| interval                 | int64        | io.debezium.time.MicroDuration (a month is     |
|                          |              | 365.25/12 days)                                |
| uuid                     | string       | io.debezium.data.Uuid                          |
| json, jsonb              | string       | io.debezium.data.Json                          |
| bytea                    | bytes        | base64 in JSON                                 |
| arrays                   | array        | of the element's                               |
| anything else            | string       | pg2sink's text of the value                    |

Values a type cannot hold (NaN or ±Infinity in a numeric, infinity or BC dates and
timestamps) are null, every field being optional (docs/formats.md: Debezium's own
handling of them differs between versions); an unchanged TOASTed value is Debezium's
placeholder `__debezium_unavailable_value` in a string field, null in others.

A value reaches `convert` in its JSON form (a record's value through `json_of`), or, on
the Kafka sink's row route, as the text PostgreSQL sent: `text_reader` gives the column's
converter from that text, the FieldType's `read` where the type has one (the hot types:
integers, floats, bool, strings, numeric(p,s), dates, timestamps, bytea), else the
record route's decoding and `convert`, one after the other.
"""

from __future__ import annotations

import re
from base64 import b64encode
from binascii import b2a_base64
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import orjson

from pg2sink.changelog.codecs import Kind, ValueCodec, kind_of
from pg2sink.changelog.pgvalues import _decode_bool, _decode_text, _json_bytea
from pg2sink.formats.base import Column, json_of, text_of
from pg2sink.formats.jsonenc import OPTIONS
from pg2sink.logical.messages import UnchangedToast

__all__ = ["UNAVAILABLE", "FieldType", "convert_value", "field_type", "text_reader"]

#: Debezium's unavailable.value.placeholder default, for unchanged TOASTed values
UNAVAILABLE = "__debezium_unavailable_value"

_EPOCH = date(1970, 1, 1)
_EPOCH_ORDINAL = _EPOCH.toordinal()
_EPOCH_NAIVE = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)
_PRECISION = re.compile(r"\((\d+)\)")
_DURATION = re.compile(
    r"^P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+(?:\.\d+)?)S)?)?$"
)
_MICROS_PER_DAY = 86_400_000_000
_MICROS_PER_MONTH = Decimal("365.25") / 12 * _MICROS_PER_DAY

Convert = Callable[[Any], object]
#: PostgreSQL's text of a value -> its Debezium value
Read = Callable[[bytes], object]


@dataclass(frozen=True)
class FieldType:
    """A column's Connect schema (without "field" and "optional") and value conversion:
    `convert` takes the value's JSON form (base.json_of), never None; `read`, where the
    type has one, takes the text PostgreSQL sent for the column's kind and gives what
    `convert` gives, raising for any text it does not handle so (see text_reader)."""

    schema: dict[str, Any]
    convert: Convert
    read: Read | None = None


def _named(type_: str, name: str, **parameters: str) -> dict[str, Any]:
    """A Connect schema of a semantic type, keys in JsonConverter's order."""
    out: dict[str, Any] = {"type": type_, "name": name, "version": 1}
    if parameters:
        out["parameters"] = parameters
    return out


def _unscaled(value: Decimal, scale: int) -> str:
    """Connect's Decimal: the unscaled integer, big-endian two's complement, base64."""
    n = int(value.scaleb(scale).to_integral_value())
    size = max(1, (n + (n < 0)).bit_length() // 8 + 1)
    return b64encode(n.to_bytes(size, "big", signed=True)).decode("ascii")


def _number(value: Any) -> Decimal | None:
    """A numeric's JSON form as a Decimal; None for NaN and the infinities (strings)."""
    return Decimal(value) if isinstance(value, int | Decimal) else None


def _decimal(scale: int) -> Convert:
    def convert(value: Any) -> object:
        d = _number(value)
        return None if d is None else _unscaled(d, scale)

    return convert


def _decimal_text(scale: int) -> Read:
    """_decimal(scale) from numeric_out's text, which has exactly `scale` decimals."""

    def read(text: bytes) -> object:
        if scale:
            whole, _, fraction = text.partition(b".")
            if len(fraction) != scale:
                raise ValueError("not numeric_out's text at this scale (NaN, Infinity)")
            text = whole + fraction
        n = int(text)
        # _unscaled's bytes, written out: a Python call less per value
        size = (n + (n < 0)).bit_length() // 8 + 1
        return b2a_base64(n.to_bytes(size, "big", signed=True), newline=False).decode("ascii")

    return read


def _variable_decimal(value: Any) -> object:
    d = _number(value)
    if d is None:
        return None
    scale = max(0, -int(d.as_tuple().exponent))
    return {"scale": scale, "value": _unscaled(d, scale)}


def _days(value: Any) -> object:
    try:
        return (date.fromisoformat(value) - _EPOCH).days
    except (TypeError, ValueError):
        return None  # infinity, BC, after 9999


def _days_text(text: bytes) -> object:
    return date.fromisoformat(text.decode()).toordinal() - _EPOCH_ORDINAL


def _time_micros(value: Any) -> int | None:
    if value == "24:00:00":
        return _MICROS_PER_DAY
    try:
        t = time.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


def _epoch_micros(value: Any) -> int | None:
    try:
        t = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    delta = t.replace(tzinfo=None) - datetime(1970, 1, 1)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _epoch_micros_text(text: bytes) -> int:
    """A timestamp's microseconds from timestamp_out's text (infinity, BC raise)."""
    return (datetime.fromisoformat(text.decode()) - _EPOCH_NAIVE) // _MICROSECOND


def _millis(micros: Callable[[Any], int | None]) -> Convert:
    def convert(value: Any) -> object:
        us = micros(value)
        return None if us is None else us // 1000

    return convert


def _epoch_millis_text(text: bytes) -> object:
    return _epoch_micros_text(text) // 1000


def _zoned(value: Any) -> object:
    """ZonedTimestamp: pg2sink's timestamptz text is already UTC ISO 8601 ('...Z')."""
    return value if isinstance(value, str) and value.endswith("Z") else None


def _zoned_text(text: bytes) -> object:
    """_zoned from timestamptz_out's text (TimeZone=UTC: '+00'): pg2sink's JSON of it."""
    if text[-3:] != b"+00":
        raise ValueError("not a UTC timestamp")
    return orjson.dumps(datetime.fromisoformat(text.decode()), option=OPTIONS)[1:-1].decode()


def _duration(value: Any) -> object:
    m = _DURATION.match(value) if isinstance(value, str) else None
    if m is None:
        return None
    y, mo, d, h, mi, s = (Decimal(g) if g else Decimal(0) for g in m.groups())
    micros = (y * 12 + mo) * _MICROS_PER_MONTH + d * _MICROS_PER_DAY
    micros += ((h * 60 + mi) * 60 + s) * 1_000_000
    return int(micros)


def _same(value: Any) -> object:
    return value


def _text(value: Any) -> object:
    return text_of(value)


def _precision(pg_type: str) -> int:
    m = _PRECISION.search(pg_type)
    return int(m.group(1)) if m else 6


#: pg2sink type name (pg.type without modifiers) -> field type, where the name decides
_BY_NAME: dict[str, FieldType] = {
    "int2": FieldType({"type": "int16"}, _same, int),
    "int4": FieldType({"type": "int32"}, _same, int),
    "int8": FieldType({"type": "int64"}, _same, int),
    "oid": FieldType({"type": "int64"}, _same, int),
    "float4": FieldType({"type": "float"}, _same),
    "float8": FieldType({"type": "double"}, _same),
    "uuid": FieldType(_named("string", "io.debezium.data.Uuid"), _text, _decode_text),
    "json": FieldType(_named("string", "io.debezium.data.Json"), _text, _decode_text),
    "jsonb": FieldType(_named("string", "io.debezium.data.Json"), _text, _decode_text),
    "interval": FieldType(_named("int64", "io.debezium.time.MicroDuration"), _duration),
    "timestamptz": FieldType(
        _named("string", "io.debezium.time.ZonedTimestamp"), _zoned, _zoned_text
    ),
}
_FLOATS = frozenset(("float4", "float8"))


def _by_kind(column: Column, base: str) -> FieldType:
    """The field type of a column whose name is not in _BY_NAME, by its value kind."""
    kind, p = column.kind, _precision(column.pg_type)
    if kind is Kind.BOOLEAN:
        return FieldType({"type": "boolean"}, _same, _decode_bool)
    if kind is Kind.DECIMAL:
        scale, precision = int(column.avro.get("scale", 0)), int(column.avro.get("precision", 0))
        schema = _named(
            "bytes",
            "org.apache.kafka.connect.data.Decimal",
            scale=str(scale),
            **{"connect.decimal.precision": str(precision)},
        )
        return FieldType(schema, _decimal(scale), _decimal_text(scale))
    if kind is Kind.NUMERIC:
        schema = {
            "type": "struct",
            "fields": [
                {"type": "int32", "optional": False, "field": "scale"},
                {"type": "bytes", "optional": False, "field": "value"},
            ],
            **_named("struct", "io.debezium.data.VariableScaleDecimal"),
            "doc": "Variable scaled decimal",  # Debezium's, JsonConverter's order
        }
        return FieldType(schema, _variable_decimal)
    if kind is Kind.DATE:
        return FieldType(_named("int32", "io.debezium.time.Date"), _days, _days_text)
    if kind is Kind.TIME:
        if p <= 3:
            return FieldType(_named("int32", "io.debezium.time.Time"), _millis(_time_micros))
        return FieldType(_named("int64", "io.debezium.time.MicroTime"), _time_micros)
    if kind is Kind.TIMESTAMP:
        if p <= 3:
            millis = _millis(_epoch_micros)
            return FieldType(
                _named("int64", "io.debezium.time.Timestamp"), millis, _epoch_millis_text
            )
        micros = _named("int64", "io.debezium.time.MicroTimestamp")
        return FieldType(micros, _epoch_micros, _epoch_micros_text)
    if kind is Kind.BYTES:
        # base64 already, in the JSON form
        return FieldType({"type": "bytes"}, _same, _json_bytea)
    # a string kind's text is the value itself; other kinds' text is not their JSON form
    text = kind is Kind.TEXT or kind is Kind.UUID
    return FieldType({"type": "string"}, _text, _decode_text if text else None)


def field_type(column: Column) -> FieldType:
    """The Connect schema and value conversion of a column (see the module docstring)."""
    base = _PRECISION.sub("", column.pg_type)
    if base.endswith("[]") and column.kind is Kind.ARRAY:
        items_avro = column.avro.get("items")
        branches = items_avro if isinstance(items_avro, list) else [items_avro]
        element_avro = next((b for b in branches if isinstance(b, dict)), {"type": "string"})
        element = field_type(
            Column(column.name, base[:-2], element_avro, _kind(element_avro), column.key)
        )
        convert = element.convert

        def each(value: Any) -> object:
            if not isinstance(value, list):
                return None  # a lower bound other than 1: no Connect array holds it
            return [None if v is None else _nested(convert, v) for v in value]

        schema = {"type": "array", "items": {**element.schema, "optional": True}}
        return FieldType(schema, each)
    if base in _BY_NAME and base not in _FLOATS:
        return _BY_NAME[base]
    if base in _FLOATS:
        return FieldType(_BY_NAME[base].schema, _float, _float_text)
    return _by_kind(column, base)


def _nested(convert: Convert, value: Any) -> object:
    """An element of a multi-dimensional array: a list of its own."""
    if isinstance(value, list):
        return [None if v is None else _nested(convert, v) for v in value]
    return convert(value)


def _float(value: Any) -> object:
    """float32/float64: a number; NaN and the infinities, strings in pg2sink's JSON, null."""
    return float(value) if isinstance(value, int | Decimal) else None


def _float_text(text: bytes) -> object:
    """_float from float4out's or float8out's text: the double it reads back as."""
    value = float(text)
    if value - value != 0.0:  # NaN, an infinity
        raise ValueError("not a finite float")
    return value


def _kind(avro: Any) -> Kind | None:
    try:
        return kind_of(avro)
    except ValueError:
        return None


def text_reader(ft: FieldType, column: Column, codec: ValueCodec) -> Read:
    """The row route's converter of `column` (field type `ft`, decoded by `codec` on the
    record route): from the text PostgreSQL sent to what `convert_value` writes for the
    decoded value, for every text; raising (the row reader then declines the change, which
    takes the record route) is allowed. `ft.read` where it has one and the codec is of
    the kind it reads."""
    if ft.read is not None and codec.kind is column.kind:
        return ft.read
    decode, convert = codec.decode, ft.convert

    def read(text: bytes) -> object:
        return convert(json_of(decode(text)))

    return read


def convert_value(ft: FieldType, value: object) -> object:
    """A row value as Debezium writes it in JSON: None stays null, an unchanged TOASTed
    value is the placeholder (string fields) or null."""
    if value is None:
        return None
    if isinstance(value, UnchangedToast):
        return UNAVAILABLE if ft.schema["type"] == "string" else None
    return ft.convert(json_of(value))
