"""Fast paths for the hottest pgoutput messages: Begin, Commit, and new rows.

`decode` is general and builds a dataclass per message; these functions read the
three messages that make up nearly all of a busy stream without it.

Begin and Commit (once per transaction, which for small transactions is as often as
a change): `begin_fields` and `commit_end_lsn` unpack just the fields the changelog
needs.

New rows (an Insert's or Update's new row), from bytes straight to a dict:

`decoder.decode` builds a message dataclass holding a tuple of raw values, and the
changelog then converts each value: two passes and two containers per row. For the
common messages, an Insert and an Update without an old tuple, `compile_row_reader`
generates one function per relation that walks the TupleData (layout in decoder.py)
and converts each value as it goes, unrolled over the relation's columns (less CPU
per row than decode + RowDecoder: `make bench-stream`).

Under PG2SINK_IMPL=c the reader is changelog/_rows_native.c, the same walk in C
(registered by changelog.pgvalues with `register_native`, tested against this one),
fewer instructions per change on the file sink's path (bench/callgrind_stream.py).

The reader is an optimisation only, never the authority: it returns None for
anything it does not handle exactly (another column count, a binary value, trailing
bytes, a value its converter rejects) and the caller then takes the general path,
which decodes the same bytes again and raises the precise DecodeError. Still no I/O;
converters reach the generated code as bound globals, and column names as repr()
literals, so no identifier can change what the code does.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from pg2sink.logical.decoder import MessageTag, TupleKind, TupleMarker
from pg2sink.logical.encode import BEGIN, COMMIT
from pg2sink.logical.messages import UNCHANGED_TOAST

__all__ = [
    "INSERT_TAG",
    "RELATION_ID",
    "UPDATE_TAG",
    "Inline",
    "RowReader",
    "begin_fields",
    "commit_end_lsn",
    "compile_row_reader",
    "python_row_reader",
    "register_fixed",
    "register_inline",
    "register_native",
]

#: (an Insert or Update message) -> {column: converted value} of its new row, or None:
#: use the general path (also for an Update that carries an old tuple).
RowReader = Callable[[bytes], "dict[str, object] | None"]

_BEGIN: Final = int(MessageTag.BEGIN)
_COMMIT: Final = int(MessageTag.COMMIT)
_INSERT: Final = int(MessageTag.INSERT)
_UPDATE: Final = int(MessageTag.UPDATE)
_NEW: Final = int(TupleMarker.NEW)


def begin_fields(data: bytes) -> tuple[int, int, int] | None:
    """(final LSN, commit time, xid) of a Begin (layout in decoder.py), else None."""
    if data[0] != _BEGIN or len(data) != BEGIN.size:
        return None
    _, final_lsn, commit_time, xid = BEGIN.unpack(data)
    return final_lsn, commit_time, xid


def commit_end_lsn(data: bytes) -> int | None:
    """The end LSN of a Commit (layout in decoder.py), else None."""
    if data[0] != _COMMIT or len(data) != COMMIT.size:
        return None
    end_lsn: int = COMMIT.unpack(data)[3]
    return end_lsn


#: unpack_from(data, 1)[0] is the relation id of an Insert, Update or Delete
RELATION_ID: Final = struct.Struct(">I")
INSERT_TAG: Final = _INSERT
UPDATE_TAG: Final = _UPDATE


@dataclass(frozen=True, slots=True)
class Inline:
    """A converter written out as an expression in the generated reader (no call).

    `template` is a Python expression in which `{}` stands for the value's bytes; it
    must give exactly what the converter gives for the common case and raise for
    anything else (the reader then declines and the converter itself runs on the
    general path). `names` are the globals the expression uses; prefix them so they
    cannot clash with another converter's.
    """

    template: str
    names: Mapping[str, object]


_INLINE: dict[Callable[[bytes], object], Inline] = {}
#: converter -> the only texts it accepts (all of one length) and their results
_FIXED: dict[Callable[[bytes], object], Mapping[bytes, object]] = {}


def register_inline(converter: Callable[[bytes], object], template: str, **names: object) -> None:
    """Let readers inline `converter` as `template` (see Inline)."""
    _INLINE[converter] = Inline(template, names)


def register_fixed(converter: Callable[[bytes], object], values: Mapping[bytes, object]) -> None:
    """Let readers match a value of `converter` as a whole, length included, against
    each of the texts in `values` (one slice and a comparison instead of reading the
    length and calling the converter: bool's 't' and 'f'). Any other text goes to the
    converter as before."""
    if len({len(text) for text in values}) != 1:
        raise ValueError("fixed texts must all have one length")
    _FIXED[converter] = dict(values)


#: makes the C reader (changelog/_rows_native.c) when PG2SINK_IMPL chose it; registered
#: by changelog.pgvalues, which knows the converters (this package imports no changelog)
_native: Callable[[Sequence[str], Sequence[Callable[[bytes], object]]], RowReader] | None = None


def register_native(
    factory: Callable[[Sequence[str], Sequence[Callable[[bytes], object]]], RowReader],
) -> None:
    """Let `compile_row_reader` make its readers with `factory`: a drop-in for
    `python_row_reader`, same arguments, same contract."""
    global _native
    _native = factory


def compile_row_reader(
    names: Sequence[str], converters: Sequence[Callable[[bytes], object]]
) -> RowReader:
    """A reader for the new row of an Insert or Update of a relation with exactly
    len(names) columns; see the module docstring. The caller has checked the tag and
    looked the relation up by `RELATION_ID`. The C reader when one is registered
    (PG2SINK_IMPL=c), else `python_row_reader`, the reference."""
    if _native is not None:
        return _native(names, converters)
    return python_row_reader(names, converters)


def python_row_reader(
    names: Sequence[str], converters: Sequence[Callable[[bytes], object]]
) -> RowReader:
    """The reader of `compile_row_reader` in Python: a function generated per relation
    (the module docstring), the reference the C reader is tested against."""
    count = len(names)
    if len(converters) != count:
        raise ValueError(f"{count} column names but {len(converters)} converters")
    # _len(data, off) is the Int32 length after the kind byte at `off` (the pad byte
    # 'x' skips it: one addition less per column than unpacking at off + 1).
    env: dict[str, object] = {"_len": struct.Struct(">xI").unpack_from, "_U": UNCHANGED_TOAST}
    # Byte1 tag, Int32 relation id, then 'N' and the Int16 column count of the new
    # TupleData, checked with one slice (an Update with 'K' or 'O' here carries an old
    # tuple first: general path). The first column then starts at the constant offset 8.
    head = bytes([_NEW, count >> 8, count & 0xFF])
    lines = [
        "def read(data):",
        "    try:",
        f"        if data[5:8] != {head!r}:",
        "            return None",
    ]
    if count == 0:
        lines.append("        off = 8")
    text, null, unchanged = int(TupleKind.TEXT), int(TupleKind.NULL), int(TupleKind.UNCHANGED_TOAST)
    for i, convert in enumerate(converters):
        inline = _INLINE.get(convert)
        if inline is not None:
            env.update(inline.names)
            expression = inline.template.format("data[s:off]")
        else:
            env[f"c{i}"] = convert
            expression = f"c{i}(data[s:off])"
        # offsets as literals for the first column, whose position is fixed
        at, start, after = ("8", "13", "9") if i == 0 else ("off", "off + 5", "off + 1")
        branch = "if"
        for j, (fixed_text, result) in enumerate(_FIXED.get(convert, {}).items()):
            # kind 't', Int32 length and the text itself, compared in one go
            whole = bytes([text]) + len(fixed_text).to_bytes(4, "big") + fixed_text
            env[f"f{i}_{j}"] = result
            value = f"(w := data[{at}:{at} + {len(whole)}])" if j == 0 else "w"
            lines += [
                f"        {branch} {value} == {whole!r}:",
                f"            v{i} = f{i}_{j}",
                f"            off = {at} + {len(whole)}",
            ]
            branch = "elif"
        lines += [
            # text (nearly every value) tested first, without a variable for the kind
            f"        {branch} data[{at}] == {text}:",
            f"            s = {start}",
            f"            off = s + _len(data, {at})[0]",
            f"            v{i} = {expression}",
            f"        elif data[{at}] == {null}:",
            f"            v{i} = None",
            f"            off = {after}",
            f"        elif data[{at}] == {unchanged}:",
            f"            v{i} = _U",
            f"            off = {after}",
            "        else:",
            "            return None",
        ]
    # Column names as literals (LOAD_CONST beats a global lookup); repr() of a str is
    # always a well-formed literal, whatever the identifier contains.
    items = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
    lines += [
        # a short buffer makes the last slice short instead of failing: check the end
        "        if off != len(data):",
        "            return None",
        f"        return {{{items}}}",
        "    except Exception:",
        "        return None",
    ]
    exec(compile("\n".join(lines), f"<row reader, {count} columns>", "exec"), env)
    reader: RowReader = env["read"]  # type: ignore[assignment]
    return reader
