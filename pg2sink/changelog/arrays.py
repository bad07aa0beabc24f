"""Parse PostgreSQL array literals (the text output of array_out) into nested lists.

The format (https://www.postgresql.org/docs/current/arrays.html#ARRAYS-IO):

    [1:2][0:1]=           optional dimension decoration, only when a lower bound is not 1
    {{1,2},{3,NULL}}      one brace level per dimension; sub-arrays of a level have equal sizes
    {"a b","c\\"d",NULL}  an element is double-quoted when it is empty, contains the delimiter,
                          a brace, a quote, a backslash or white space, or spells NULL;
                          inside quotes a backslash escapes the next byte
    {(1,1),(0,0);(2,2)}   the delimiter is the element type's typdelim: ',' except for box

An unquoted NULL (in any letter case) is a NULL element; a quoted "NULL" is the string.
Elements reach `decode_element` as bytes, unquoted and unescaped.

array_out never puts white space outside quotes, but array_in accepts it around elements and
braces, so this parser skips it too, like the server would.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import product

__all__ = ["parse_array"]

# Every letter case of NULL: a set lookup is cheaper than upper-casing each element.
_NULLS = frozenset(bytes(p) for p in product(*((c, c + 32) for c in b"NULL")))

# A byte that needs the full parser: nesting, quoting, escaping or white space.
# Any other array is flat and a split on the delimiter parses it.
_NEEDS_PARSER = re.compile(rb'[{}"\\\s]')

# What may precede the first brace: white space and the dimension decoration, e.g.
# b"[0:1]=" or b"[1:1][-2:3]=" (array_in also accepts "[3]", meaning "[1:3]").
_PREFIX = re.compile(rb"\s*(?:(?:\[\s*[+-]?\d+\s*(?::\s*[+-]?\d+\s*)?\])+\s*=\s*)?")

# array_isspace() in arrayfuncs.c
_WHITESPACE = frozenset(b" \t\n\r\v\f")

_BACKSLASH = ord("\\")

# Per delimiter: where an unquoted element may end (or turn out to need escaping).
_UNQUOTED_END: dict[bytes, re.Pattern[bytes]] = {}


def _unquoted_end(delim: bytes) -> re.Pattern[bytes]:
    pattern = _UNQUOTED_END.get(delim)
    if pattern is None:
        pattern = _UNQUOTED_END[delim] = re.compile(rb'[{}"\\' + re.escape(delim) + rb"]")
    return pattern


def parse_array(
    text: bytes | str,
    decode_element: Callable[[bytes], object],
    delimiter: str = ",",
) -> list[object]:
    """Parse an array literal into a list (nested lists for more than one dimension).

    NULL elements become None; every other element is passed to `decode_element` as bytes.
    Bounds given by a dimension decoration are dropped. Raises ValueError when the text is
    not a well-formed array literal (exceptions of `decode_element` propagate as they are).
    """
    data = text.encode() if isinstance(text, str) else text
    delim = delimiter.encode()
    if len(delim) != 1 or delim in b'{}"\\' or delim.isspace():
        raise ValueError(f"invalid array delimiter {delimiter!r}")
    if data[:1] != b"{":
        # The decoration is rare (only for lower bounds other than 1): keep it off the
        # common path.
        prefix = _PREFIX.match(data)
        if prefix is not None:  # always, since the pattern matches the empty string
            data = data[prefix.end() :]
    if data[-1:] != b"}":
        data = data.rstrip(b" \t\n\r\v\f")
    if data[:1] != b"{" or data[-1:] != b"}":
        raise ValueError(f"malformed array literal: {_shorten(data)}")

    inner = data[1:-1]
    if _NEEDS_PARSER.search(inner) is None:
        if not inner:
            return []
        parts = inner.split(delim)
        if b"" in parts:
            raise ValueError(f"malformed array literal (empty element): {_shorten(data)}")
        return [None if part in _NULLS else decode_element(part) for part in parts]

    return _Parser(data, delim, decode_element).parse()


def _shorten(data: bytes) -> str:
    text = data.decode(errors="replace")
    return repr(text if len(text) <= 60 else text[:57] + "...")


class _Parser:
    """Recursive descent over one literal that has nesting, quotes or white space."""

    __slots__ = ("_data", "_decode", "_delim", "_unquoted_end")

    def __init__(self, data: bytes, delim: bytes, decode: Callable[[bytes], object]) -> None:
        self._data = data
        self._delim = delim
        self._decode = decode
        # where an unquoted element may end (or turn out to need escaping)
        self._unquoted_end = _unquoted_end(delim)

    def parse(self) -> list[object]:
        data = self._data
        start = self._skip_space(0)
        if data[start : start + 1] != b"{":
            raise self._error(start, "expected '{'")
        items, _, end = self._level(start)
        end = self._skip_space(end)
        if end != len(data):
            raise self._error(end, "junk after the closing brace")
        return items

    def _level(self, pos: int) -> tuple[list[object], tuple[int, ...], int]:
        """Parse the braces at data[pos]: (items, shape, position after the '}')."""
        data, delim = self._data, self._delim
        items: list[object] = []
        sub_shape: tuple[int, ...] | None = None  # shape shared by nested levels, if any
        scalars = False
        pos = self._skip_space(pos + 1)
        if data[pos : pos + 1] == b"}":
            return items, (0,), pos + 1
        while True:
            pos = self._skip_space(pos)
            char = data[pos : pos + 1]
            if char == b"{":
                sub, shape, pos = self._level(pos)
                if shape[0] == 0:
                    raise self._error(pos, "empty sub-array")
                if sub_shape is None:
                    sub_shape = shape
                elif shape != sub_shape:
                    raise self._error(pos, "sub-arrays of different dimensions")
                items.append(sub)
            elif char == b'"':
                value, pos = self._quoted(pos)
                items.append(self._decode(value))
                scalars = True
            elif char in (b"", b"}", delim):
                raise self._error(pos, "empty element")
            else:
                null, value, pos = self._unquoted(pos)
                items.append(None if null else self._decode(value))
                scalars = True
            if scalars and sub_shape is not None:
                raise self._error(pos, "elements and sub-arrays at the same level")
            pos = self._skip_space(pos)
            char = data[pos : pos + 1]
            if char == delim:
                pos += 1
            elif char == b"}":
                shape = (len(items),) if sub_shape is None else (len(items), *sub_shape)
                return items, shape, pos + 1
            else:
                raise self._error(pos, "expected a delimiter or '}'")

    def _quoted(self, pos: int) -> tuple[bytes, int]:
        """The element quoted at data[pos] (unescaped), and the position after it."""
        data = self._data
        chunks: list[bytes] = []
        pos += 1
        while True:
            quote = data.find(b'"', pos)
            if quote < 0:
                raise self._error(pos, "unterminated quoted element")
            backslash = data.find(b"\\", pos, quote)
            if backslash < 0:
                chunks.append(data[pos:quote])
                return b"".join(chunks), quote + 1
            chunks.append(data[pos:backslash])
            chunks.append(data[backslash + 1 : backslash + 2])
            pos = backslash + 2

    def _unquoted(self, pos: int) -> tuple[bool, bytes, int]:
        """(is NULL, the element at data[pos] unescaped, the position after it)."""
        data = self._data
        end_match = self._unquoted_end.search(data, pos)
        end = end_match.start() if end_match is not None else len(data)
        if data[end : end + 1] not in (b"\\", b"{", b'"'):
            value = data[pos:end].rstrip(b" \t\n\r\v\f")
            return value in _NULLS, value, end
        # Escapes (or stray quotes and braces, which are errors) in an unquoted element:
        # rare, so byte by byte. Trailing white space is dropped unless escaped.
        out = bytearray()
        keep = 0  # length of `out` up to the last byte that must be kept
        while pos < len(data):
            byte = data[pos]
            if byte == _BACKSLASH:
                if pos + 1 >= len(data):
                    break
                out.append(data[pos + 1])
                keep = len(out)
                pos += 2
                continue
            char = data[pos : pos + 1]
            if char == self._delim or char == b"}":
                return False, bytes(out[:keep]), pos
            if char in (b"{", b'"'):
                raise self._error(pos, f"unexpected {char.decode()!r} in an unquoted element")
            out.append(byte)
            if byte not in _WHITESPACE:
                keep = len(out)
            pos += 1
        raise self._error(pos, "unexpected end of input")

    def _skip_space(self, pos: int) -> int:
        data = self._data
        while pos < len(data) and data[pos] in _WHITESPACE:
            pos += 1
        return pos

    def _error(self, pos: int, reason: str) -> ValueError:
        return ValueError(
            f"malformed array literal at byte {pos} ({reason}): {_shorten(self._data)}"
        )
