"""JSON encoding of records holding decoded PostgreSQL values (orjson, one line, UTF-8).

How each value from `pg2sink.changelog.typemap` is written:

| Value           | PostgreSQL types            | JSON                                       |
|-----------------|-----------------------------|--------------------------------------------|
| None            | NULL                        | null                                       |
| bool            | bool                        | true, false                                |
| int             | int2, int4, int8, oid, xid  | number                                     |
| float           | float4, float8              | number, shortest form that reads back (5)  |
| Decimal         | numeric                     | number, PostgreSQL's digits (1) : 1.50     |
| JsonNumber      | numeric, float4, float8 (6) | number, exactly the text PostgreSQL printed|
| PgText          | special values (2)          | string, PostgreSQL's text: "NaN"           |
| str             | text, varchar, uuid, json,  | string, PostgreSQL's text form (3)         |
|                 | enum, money, interval, ...  |                                            |
| bytes           | bytea                       | string, base64, standard alphabet, padded  |
| date            | date                        | "2024-05-01"                               |
| time            | time                        | "10:00:00", "10:00:00.123456"              |
| naive datetime  | timestamp                   | "2024-05-01T10:00:00.123456"               |
| aware datetime  | timestamptz (always UTC)    | "2024-05-01T10:00:00.123456Z"              |
| list, PgArray   | arrays                      | array, nested when multi-dimensional (4)   |
| UNCHANGED_TOAST | unchanged TOASTed value     | {"unchanged_toast": true}                  |

(1) Exactly the digits PostgreSQL printed, trailing zeros included, never in exponent
    notation: 0.00000001 stays 0.00000001 (str(Decimal) would write 1E-8).
(2) "NaN", "Infinity", "-Infinity" (float4, float8, numeric); "infinity", "-infinity"
    (date, timestamp, timestamptz); BC or after year 9999 ("0044-03-15 BC",
    "12345-01-01 00:00:00+00"); time "24:00:00"; arrays with a lower bound other than
    1 ("[0:1]={1,2}"). Strings, so never turned into null. The Avro encoder writes the
    same text in the "string" branch of the field (docs/types.md).
(3) json and jsonb values are strings holding the JSON text, not inlined objects.
(4) null for NULL elements; the fractional seconds of time and datetime values appear
    only when not zero, with 6 digits.
(5) Negative zero is -0.0, never -0, which most JSON readers take for the integer 0.
(6) For encoders that write JSON (ValueCodec.to_json): the value decoded straight to its
    JSON form, without a Decimal or float (pgvalues' JSON fast path).

The UNCHANGED_TOAST marker is an object: no column value ever encodes as one (json and
jsonb are strings), so it cannot be mistaken for data. Dataclasses (e.g. records) are written
as objects of their fields, natively by orjson. Non-ASCII text is written as is, never escaped.
"""

from __future__ import annotations

import json
from binascii import b2a_base64
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import orjson

from pg2sink.changelog import _cmodule
from pg2sink.changelog.pgvalues import JsonNumber
from pg2sink.logical.messages import UnchangedToast

__all__ = ["LINE_OPTIONS", "OPTIONS", "default", "dumps", "dumps_line", "loads", "python_default"]

_UNCHANGED_TOAST_JSON = {"unchanged_toast": True}


def _decimal(value: Decimal) -> object:
    if value.is_finite():
        # 'f' keeps PostgreSQL's plain notation where str() would switch to 1E-8
        return orjson.Fragment(format(value, "f"))
    # The decoders turn NaN and the infinities into PgText; a Decimal one is written alike.
    return "NaN" if value.is_nan() else str(value)


def _base64(value: bytes) -> str:
    return b2a_base64(value, newline=False).decode("ascii")


# Types orjson does not know natively, by exact type (the common case: one dict lookup).
_ENCODERS: dict[type, Callable[[Any], object]] = {
    Decimal: _decimal,
    bytes: _base64,
    bytearray: _base64,
    memoryview: _base64,
    UnchangedToast: lambda _: _UNCHANGED_TOAST_JSON,
}


def python_default(obj: Any) -> object:
    """orjson's fallback for the values above that it does not write natively (the
    reference of `default`)."""
    if obj.__class__ is JsonNumber:  # the most frequent by far: no lookup, no second frame
        return orjson.Fragment(obj.text)
    encoder = _ENCODERS.get(type(obj))
    if encoder is not None:
        return encoder(obj)
    for kind, encode in _ENCODERS.items():
        if isinstance(obj, kind):
            return encode(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


#: `python_default`, or under PG2SINK_IMPL=c its drop-in in C, which writes a JsonNumber
#: (one per numeric or float value in a row) without a Python frame and hands any other
#: type to python_default (bench/callgrind_stream.py, the file sink)
default: Callable[[Any], object] = python_default
if _cmodule.ROWS is not None:
    _cmodule.ROWS.install_default(orjson.Fragment, python_default)
    default = _cmodule.ROWS.json_default

#: orjson options of `dumps` and `dumps_line`, for callers that inline them on a hot path
OPTIONS = orjson.OPT_UTC_Z
LINE_OPTIONS = orjson.OPT_UTC_Z | orjson.OPT_APPEND_NEWLINE


def dumps(obj: object) -> bytes:
    """`obj` as one line of UTF-8 JSON (no trailing newline), as the table above says."""
    return orjson.dumps(obj, default=default, option=OPTIONS)


def dumps_line(obj: object) -> bytes:
    """`dumps(obj)` followed by a newline, without a copy: one JSON-lines record."""
    return orjson.dumps(obj, default=default, option=LINE_OPTIONS)


def loads(data: bytes | str, *, exact_numbers: bool = False) -> Any:
    """Parse JSON written by `dumps`. Values stay in their JSON form (timestamps are strings,
    bytea is base64); with `exact_numbers`, numbers with a fraction or exponent become
    Decimal instead of float, so numeric values come back digit for digit."""
    if exact_numbers:
        return json.loads(data, parse_float=Decimal)
    return orjson.loads(data)
