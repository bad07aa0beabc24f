"""An import batch's JSON lines built column-wise with Arrow compute kernels (C++).

The reference path of the file import writer (imports.py) turns every value of a batch
into a Python object and lets orjson write a line per row: Python work per value.
`LineBuilder` builds the same bytes a column at a time instead:

1. Per column, the JSON text of each value (its *fragment*) as an Arrow string array,
   chosen by the column's value kind (changelog.codecs.KINDS):

   | kind (types)                               | fragment                                 |
   |--------------------------------------------|------------------------------------------|
   | int, long (int2, int4, int8, oid, xid, cid)| the text as is                           |
   | boolean (bool)                             | true / false                             |
   | numeric, decimal, float, double            | the text as is (a raw number)            |
   | text, uuid (text, varchar, json, enum, ...)| the text as is when nothing in the column|
   |                                            | needs escaping, else one orjson call over|
   |                                            | the column's values                      |
   | date, time, timestamp, timestamptz         | the text reshaped: "2024-01-01T10:00:00Z"|
   |                                            | (whole seconds, no NULL: on the bytes)   |
   | anything else (bytes, arrays)              | the converter and orjson, per value      |

   The text and whole-second cases work on the column's bytes with numpy
   (column_bytes.py), cheaper per row than Arrow's string kernels
   (`make bench-import ARGS="--sink file"`).

   A vectorised form is used only for the text it is exact for, checked per value
   (a regular expression for dates and times, the last character for numbers, ...);
   every other value of such a column (NaN, infinity, BC, year 10000, '-0', ...) goes
   through the stream's converter (codec.to_json) and orjson one by one, which also
   raises the DecodeError of malformed text. NULL is `null`.
2. One `binary_join_element_wise` of the line's constant pieces (formats.jsonlines
   `import_envelope`), the sequence numbers, the keys and the fragments, and a newline:
   the batch's lines, one buffer written with one os.write.

The lines are byte for byte the stream's (tests/sinks/file/test_file_arrow_lines.py compares
both on PostgreSQL's text for every type family). Text is escaped by orjson itself,
over a whole column in one call: the list's JSON is cut into the values' JSON at each
'","' (see `_orjson_text`), so no escaping rule is written twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from pg2sink.changelog.codecs import Kind
from pg2sink.formats.jsonenc import default, dumps
from pg2sink.sinks.file.column_bytes import fixed_datetimes, needs_no_escape

__all__ = ["LineBuilder"]


@dataclass(frozen=True, slots=True)
class _Fragments:
    """A column's fragments: `before + values[i] + after` is row i's JSON (None: null)."""

    values: pa.Array
    before: str = ""
    after: str = ""
    redo: pa.Array | None = None
    """Rows whose fragment the vectorised form cannot vouch for (a boolean mask, or None
    for none): they are made by the converter and orjson, one by one."""


_Encoder = Callable[[pa.Array], _Fragments]


def _redo_unless(column: pa.Array, exact: pa.Array) -> pa.Array | None:
    """The rows that are not NULL and not `exact`; None when there are none."""
    redo = pc.and_not(column.is_valid(), pc.fill_null(exact, False))
    return redo if pc.any(redo).as_py() else None


# Integers: int() then orjson prints the digits int_out printed (no leading zero, no -0).
_INTEGER = r"^(0|-?[1-9][0-9]*)$"


def _integer(column: pa.Array) -> _Fragments:
    return _Fragments(column, redo=_redo_unless(column, pc.match_substring_regex(column, _INTEGER)))


def _bool(column: pa.Array) -> _Fragments:
    true, false = pc.equal(column, "t"), pc.equal(column, "f")
    values = pc.if_else(true, "true", "false")
    # boolout prints t or f: anything else is redone (and rejected) by the converter
    return _Fragments(values, redo=_redo_unless(column, pc.or_(true, false)))


def _ends_in_digit(column: pa.Array) -> pa.Array:
    """_json_number's test (`text[-1] <= '9'`, on a non-empty text)."""
    return pc.and_(
        pc.less_equal(pc.utf8_slice_codeunits(column, -1), "9"),
        pc.greater(pc.binary_length(column), 0),
    )


def _number(column: pa.Array) -> _Fragments:
    # numeric_out's digits are the JSON number; NaN and the infinities are strings
    return _Fragments(column, redo=_redo_unless(column, _ends_in_digit(column)))


def _float(column: pa.Array) -> _Fragments:
    # float8out's '-0' becomes -0.0 (see typemap._json_float): one of the rows redone
    exact = pc.and_(_ends_in_digit(column), pc.not_equal(column, "-0"))
    return _Fragments(column, redo=_redo_unless(column, exact))


#: Where a list of strings' JSON is cut into its items: the closing quote of one item, the
#: comma and the opening quote of the next (b'","')
_QUOTE, _COMMA = ord('"'), ord(",")
#: The largest offset of a string array (int32)
_MAX_OFFSET = 2**31 - 1


def _text(column: pa.Array) -> _Fragments:
    """A column that needs no escaping is its values, between quotes that join the line's
    constants (column_bytes.needs_no_escape); any other goes through orjson."""
    if needs_no_escape(column):
        return _Fragments(column, '"', '"')
    return _orjson_text(column)


def _orjson_text(column: pa.Array) -> _Fragments:
    """orjson writes the column's values as one JSON list of strings, then the list is cut
    into the items' JSON (quotes included) by Arrow offsets into that one buffer.

    The list is `["a","b"]`: every item ends with '","' but the last. The sequence can
    also occur inside an item (a value ending in a quote and a comma is written
    `"x\\","`), never fewer times than n - 1: exactly n - 1 occurrences are exactly the
    cuts; more make the batch's column go through orjson value by value.
    """
    n = len(column)
    texts = pc.fill_null(column, "").to_pylist() if column.null_count else column.to_pylist()
    data = orjson.dumps(texts)
    if len(data) > _MAX_OFFSET:
        raise pa.ArrowCapacityError("a text column's JSON passes 2 GiB")
    raw = np.frombuffer(data, np.uint8)
    # commas first (a few per item), then the quotes around them
    commas = np.flatnonzero(raw[1:-1] == _COMMA) + 1
    cuts = commas[(raw[commas - 1] == _QUOTE) & (raw[commas + 1] == _QUOTE)]
    if len(cuts) != n - 1:
        return _Fragments(column, redo=column.is_valid())
    # item i is data[offsets[i]:offsets[i+1]] less its last byte: the comma after it, or
    # the list's closing bracket after the last one
    offsets = np.empty(n + 1, np.int32)
    offsets[0] = 1  # after '['
    offsets[1:n] = cuts + 1
    offsets[n] = len(data)
    items = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
    items = pc.utf8_slice_codeunits(items, 0, -1)
    if column.null_count:
        items = pc.if_else(column.is_valid(), items, None)
    return _Fragments(items)


# The text date_out, time_out and timestamp(tz)_out print for the values Python holds
# (DateStyle ISO), field by field in range. Whether the day exists in its month is not
# checked: PostgreSQL prints only real dates (other text comes from no output function).
_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
_TIMESTAMP = "^" + _DATE + " " + _TIME


def _six_digits(text: pa.Array, whole: int) -> pa.Array:
    """orjson writes a time's fraction with 6 digits, PostgreSQL without trailing zeros:
    texts longer than `whole` (the length without a fraction) padded with zeros."""
    lengths = pc.binary_length(text)
    if pc.max(lengths).as_py() in (None, whole):
        return text
    return pc.if_else(pc.equal(lengths, whole), text, pc.utf8_rpad(text, whole + 7, "0"))


def _iso_datetime(column: pa.Array, suffix: int) -> pa.Array:
    """'2024-01-01 10:00:00.5' (+ `suffix` characters) -> '2024-01-01T10:00:00.500000'."""
    body = pc.utf8_slice_codeunits(column, 0, -suffix) if suffix else column
    return _six_digits(pc.replace_substring(body, " ", "T", max_replacements=1), 19)


def _fixed(column: pa.Array, width: int, tail: bytes, after: str) -> _Fragments | None:
    """A column of whole seconds (or dates) at one width, by column_bytes.fixed_datetimes."""
    found = fixed_datetimes(column, width, tail)
    if found is None:
        return None
    values, redo = found
    return _Fragments(values, '"', after, pa.array(redo) if redo.any() else None)


def _timestamptz(column: pa.Array) -> _Fragments:
    # TimeZone=UTC: '+00', which orjson writes as Z (OPT_UTC_Z)
    fixed = _fixed(column, 22, b"+00", 'Z"')
    if fixed is not None:
        return fixed
    exact = pc.match_substring_regex(column, _TIMESTAMP + r"\+00$")
    return _Fragments(_iso_datetime(column, 3), '"', 'Z"', _redo_unless(column, exact))


def _timestamp(column: pa.Array) -> _Fragments:
    fixed = _fixed(column, 19, b"", '"')
    if fixed is not None:
        return fixed
    exact = pc.match_substring_regex(column, _TIMESTAMP + "$")
    return _Fragments(_iso_datetime(column, 0), '"', '"', _redo_unless(column, exact))


def _date(column: pa.Array) -> _Fragments:
    fixed = _fixed(column, 10, b"", '"')
    if fixed is not None:
        return fixed
    exact = pc.match_substring_regex(column, "^" + _DATE + "$")
    return _Fragments(column, '"', '"', _redo_unless(column, exact))


def _time(column: pa.Array) -> _Fragments:
    exact = pc.match_substring_regex(column, "^" + _TIME + "$")
    return _Fragments(_six_digits(column, 8), '"', '"', _redo_unless(column, exact))


def _per_value(column: pa.Array) -> _Fragments:
    return _Fragments(column, redo=column.is_valid())


#: The vectorised form of each value kind (changelog.codecs; a domain has its base type's
#: kind); the other kinds (bytes, arrays) go value by value.
_ENCODERS: Mapping[Kind, _Encoder] = {
    Kind.INT: _integer,
    Kind.LONG: _integer,
    Kind.BOOLEAN: _bool,
    Kind.NUMERIC: _number,
    Kind.DECIMAL: _number,
    Kind.FLOAT: _float,
    Kind.DOUBLE: _float,
    Kind.TEXT: _text,
    Kind.UUID: _text,
    Kind.TIMESTAMPTZ: _timestamptz,
    Kind.TIMESTAMP: _timestamp,
    Kind.DATE: _date,
    Kind.TIME: _time,
}


class LineBuilder:
    """A batch of Arrow string columns -> its JSON lines (see the module docstring)."""

    def __init__(
        self,
        names: Sequence[str],
        kinds: Sequence[Kind],
        converters: Sequence[Callable[[bytes], object]],
        head: bytes,
        middle: bytes,
        fail: Callable[[pa.RecordBatch], None],
    ) -> None:
        """`head + sequence + middle + row + "}\\n"` is a line; `fail(batch)` raises the
        DecodeError of a batch a converter rejected."""
        self._converters = list(converters)
        self._encoders = [_ENCODERS.get(k, _per_value) for k in kinds]
        self._fail = fail
        self._head = head.decode()
        # what comes before each fragment: the envelope's middle and the row's first key,
        # then ',"key":'
        self._keys = [
            ("{" if i == 0 else ",") + dumps(name).decode() + ":" for i, name in enumerate(names)
        ]
        self._middle = middle.decode()
        self._end = ("}" if names else "{}") + "}\n"

    def lines(self, batch: pa.RecordBatch, first: int) -> pa.Array:
        """The batch's lines (sequence numbers from `first`) as one string array."""
        n = batch.num_rows
        numbers = pc.cast(pa.array(np.arange(first, first + n, dtype=np.int64)), pa.string())
        pieces: list[object] = [self._head, numbers]
        constant = self._middle
        for i, column in enumerate(batch.columns):
            f = self._fragments(batch, i, column)
            if f.redo is None and not f.values.null_count:
                # the value's quotes (or Z") join the constants around it
                pieces += [constant + self._keys[i] + f.before, f.values]
                constant = f.after
                continue
            values = f.values
            if f.before or f.after:
                values = pc.binary_join_element_wise(f.before, values, f.after, "")
            if f.redo is not None:
                values = pc.replace_with_mask(values, f.redo, self._per_row(batch, i, f.redo))
            pieces += [constant + self._keys[i], pc.fill_null(values, "null")]
            constant = ""
        pieces += [constant + self._end, ""]  # the last argument is the separator
        return pc.binary_join_element_wise(*pieces)

    def _fragments(self, batch: pa.RecordBatch, i: int, column: pa.Array) -> _Fragments:
        if pa.types.is_large_string(column.type):
            column = column.cast(pa.string())
        return self._encoders[i](column)

    def _per_row(self, batch: pa.RecordBatch, i: int, redo: pa.Array) -> pa.Array:
        """The JSON of column i's values in the `redo` rows, each by the stream's converter
        and orjson (what the reference path writes for it)."""
        column = batch.column(i)
        values = column.filter(redo).cast(pa.binary()).to_pylist()
        convert = self._converters[i]
        try:
            texts = [b"null" if v is None else _dumps(convert(v)) for v in values]
        except Exception:
            self._fail(batch)
            raise
        return pa.array(texts, pa.string())


def _dumps(value: object) -> bytes:
    return orjson.dumps(value, default=default, option=orjson.OPT_UTC_Z)
