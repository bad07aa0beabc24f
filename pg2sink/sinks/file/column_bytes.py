"""JSON fragments made on an Arrow string column's bytes with numpy (arrow_lines.py).

Two shapes of PostgreSQL text are common enough in imports to be worth a pass over the
column's data buffer instead of a kernel per step or a Python object per value:

- **Text that needs no escaping** (`needs_no_escape`): when no value holds '"', '\\' or a
  control character (U+0000-U+001F), each value is its JSON string's body as it is
  (RFC 8259 section 7: only those must be escaped; orjson escapes exactly those and
  leaves everything else, non-ASCII, U+007F, U+2028 included, as it is). Escaping with
  numpy (np.insert of the backslashes) is slower than orjson's list and its cut, so a
  column that needs it still goes through orjson (arrow_lines `_text`;
  `make bench-import ARGS="--sink file"`).
- **Whole-second dates and times at a fixed width** (`fixed_datetimes`): when every
  value is `width` bytes, the column is a (rows, width) byte matrix; its fields are
  checked in range, as arrow_lines' regular expressions do, and the ISO 'T' put in place
  of the space. Any other column (fractions of a second, NULLs, BC, infinity, years past
  9999) gives None and takes the kernels' path.

Both return arrays whose rows are exactly those of the kernels' path (the tests compare
the lines with the reference path's, tests/sinks/file/test_file_arrow_lines.py).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["fixed_datetimes", "needs_no_escape"]

_QUOTE, _BACKSLASH, _SPACE = ord('"'), ord("\\"), ord(" ")


def _buffers(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string column's offsets (len + 1, from 0) and the bytes they index (no copy)."""
    n = len(column)
    _, offsets_buffer, data = column.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32, n + 1, column.offset * 4)
    start, end = int(offsets[0]), int(offsets[-1])
    if data is None or end == start:
        return offsets - start, np.empty(0, np.uint8)
    return offsets - start, np.frombuffer(data, np.uint8, end - start, start)


def needs_no_escape(column: pa.Array) -> bool:
    """Whether no value of the string column holds a byte JSON escapes: '"', '\\' or a
    control character (NULLs' bytes, if any, count too)."""
    _, raw = _buffers(column)
    return not len(raw) or (
        raw.min() >= _SPACE and not ((raw == _QUOTE) | (raw == _BACKSLASH)).any()
    )


#: Positions of the digits and separators of 'YYYY-MM-DD HH:MM:SS' (date_out and
#: timestamp_out with DateStyle ISO), and of each two-digit field with its range
_DIGITS = (0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18)
_SEPARATORS = {4: "-", 7: "-", 10: " ", 13: ":", 16: ":"}
#: (position of the field's first digit, smallest, largest): month, day, hour, min, sec
_FIELDS = ((5, 1, 12), (8, 1, 31), (11, 0, 23), (14, 0, 59), (17, 0, 59))


def fixed_datetimes(
    column: pa.Array, width: int, tail: bytes
) -> tuple[pa.Array, np.ndarray] | None:
    """For a column whose every value is `width` bytes, no NULL: each value's first
    min(width - len(tail), 19) bytes with 'T' for the space (a date: the value as it is),
    and a boolean array of the rows that are not a date ('YYYY-MM-DD', width 10) or a
    timestamp ('YYYY-MM-DD HH:MM:SS') in range followed by `tail` (b'+00': UTC). None
    for any other column."""
    n = len(column)
    if column.null_count or not n:
        return None
    offsets, raw = _buffers(column)
    if len(raw) != n * width or not np.array_equal(offsets, np.arange(n + 1) * width):
        return None
    body = width - len(tail)
    m = raw.reshape(n, width)
    # uint8: a byte below '0' wraps past 9
    digits = m[:, [at for at in _DIGITS if at < body]] - ord("0")
    ok: np.ndarray = np.asarray((digits <= 9).all(axis=1))
    for at, sep in _SEPARATORS.items():
        if at < body:
            ok &= m[:, at] == ord(sep)
    for at, low, high in _FIELDS:
        if at < body:
            value = m[:, at].astype(np.int16) * 10 + m[:, at + 1] - ord("0") * 11
            ok &= (value >= low) & (value <= high)
    for i, byte in enumerate(tail):
        ok &= m[:, body + i] == byte
    redo = np.logical_not(ok)
    if body <= 10:
        return column, redo
    out = m[:, :body].copy()
    out[:, 10] = ord("T")
    offsets = pa.py_buffer((np.arange(n + 1) * body).astype(np.int32))
    return pa.StringArray.from_buffers(n, offsets, pa.py_buffer(out)), redo
