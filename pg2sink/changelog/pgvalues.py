"""PostgreSQL text → Python values: the decoders of every codec, and their JSON forms.

pgoutput sends each value as the text its type's output function prints, in a walsender
session that pg2sink starts with DateStyle=ISO, IntervalStyle=iso_8601, TimeZone=UTC,
extra_float_digits=3 and bytea_output=hex; the decoders below rely on those settings.
changelog.typemap's kind table picks them per column type.

`PgText` marks values kept as PostgreSQL's text because Python has no exact counterpart:
'NaN', 'Infinity', '-Infinity' (float and numeric), 'infinity' and '-infinity' (date,
timestamp, timestamptz), dates and timestamps BC ('0044-03-15 BC') or after year 9999
('12345-01-01'), time '24:00:00', and arrays with a lower bound other than 1
('[0:1]={1,2}'). They are str, so the JSON encoder writes them as strings. The Avro
encoder writes float(value) for float/double (IEEE has NaN and the infinities); for the
other Avro types, which have no room for them, the row schema's union has a "string"
branch (`rowschema.nullable`) that takes the same text.

Multi-dimensional arrays: PostgreSQL does not record the number of dimensions in the type
(int4[] and int4[][] are the same type), so the Avro type describes one dimension while a
2-D value decodes to a `PgArray`: a list of lists that also keeps PostgreSQL's text, which
the Avro encoder writes in the "string" branch. docs/types.md is the user-facing table.
"""

from __future__ import annotations

from binascii import a2b_hex, b2a_base64
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, time
from decimal import Decimal
from enum import IntEnum

from pg2sink.changelog import _cmodule
from pg2sink.logical.fastpath import RowReader, register_fixed, register_inline, register_native
from pg2sink.logical.messages import UNCHANGED_TOAST

__all__ = ["JsonNumber", "PgArray", "PgText"]


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


class JsonNumber:
    """A number's JSON form, the digits PostgreSQL printed (numeric's trailing zeros,
    float's round-trip text): the value of a numeric or float column read by a JSON
    encoder's own row reader (ValueCodec.to_json). A plain value: the JSON encoder writes
    its text unquoted (formats.jsonenc), nothing else needs to know it."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonNumber) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"JsonNumber({self.text.decode()})"


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
# already the JSON: a number's digits go out as they are (JsonNumber, written unquoted)
# instead of a Decimal that the encoder's fallback must format again, and bytea goes
# straight to base64.
# Dates and timestamps keep their typed decoders: fromisoformat plus orjson's native
# datetime writer beat any string reshaping in Python. Tests check that both
# paths give the same JSON.

_LAST_DIGIT = ord("9")


def _json_number(text: bytes) -> object:
    # numeric_out and float8out print plain JSON-compatible numbers ('-12.50', '1e+20');
    # only NaN and the infinities end in a letter.
    if text and text[-1] <= _LAST_DIGIT:
        return JsonNumber(text)
    return PgText(text.decode())


def _json_float(text: bytes) -> object:
    # float8out prints negative zero as '-0', which most JSON readers (Python's json,
    # Jackson) take for the integer 0: '-0.0' keeps the sign, as the decode path writes it.
    if text == b"-0":
        return JsonNumber(b"-0.0")
    return _json_number(text)


def _decline() -> object:
    raise ValueError("not the common case: let the full converter decide")


# The same conversions written out for logical.fastpath's row readers, which then make
# no call per value. Each gives the converter's result for the common case and raises
# otherwise (the converter then runs and handles infinity, BC, NaN, ...).
register_inline(
    _json_number,
    "_jn_fragment(v) if (v := {})[-1] < 58 else _jn_decline()",
    _jn_fragment=JsonNumber,
    _jn_decline=_decline,
)
register_inline(
    _json_float,
    "_jf_fragment(v if v != b'-0' else b'-0.0') if (v := {})[-1] < 58 else _jf_decline()",
    _jf_fragment=JsonNumber,
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


class NativeCode(IntEnum):
    """How the C row reader converts a column (changelog/_rows_native.c's enum Code)."""

    CALL = 0  # calls the converter, as the Python reader does for a converter it cannot inline
    TEXT = 1
    INT = 2
    BOOL = 3
    NUMBER = 4
    FLOAT = 5
    DATE = 6
    TIMESTAMP = 7
    TIMESTAMPTZ = 8


#: converter -> what the C reader does instead of calling it: the same result for the
#: common text, a decline (the general path runs the converter) for the rest
NATIVE_CODES: Mapping[Callable[[bytes], object], NativeCode] = {
    _decode_text: NativeCode.TEXT,
    int: NativeCode.INT,
    _decode_bool: NativeCode.BOOL,
    _json_number: NativeCode.NUMBER,
    _json_float: NativeCode.FLOAT,
    _decode_date: NativeCode.DATE,
    _decode_timestamp: NativeCode.TIMESTAMP,
    _decode_timestamptz: NativeCode.TIMESTAMPTZ,
}


def native_row_reader(
    names: Sequence[str], converters: Sequence[Callable[[bytes], object]]
) -> RowReader:
    """fastpath.compile_row_reader's reader in C (PG2SINK_IMPL=c)."""
    native = _cmodule.ROWS
    if native is None:
        raise RuntimeError("the C row reader is not loaded (PG2SINK_IMPL)")
    reader: RowReader = native.RowReader(
        [
            (name, NATIVE_CODES.get(convert, NativeCode.CALL), convert)
            for name, convert in zip(names, converters, strict=True)
        ]
    )
    return reader


if _cmodule.ROWS is not None:
    _cmodule.ROWS.install_values(JsonNumber, UNCHANGED_TOAST)
    register_native(native_row_reader)
