"""Sans-IO decoder of pgoutput messages: bytes in, frozen dataclasses out.

This is the payload of an XLogData frame (see `copydata.py`) sent by the `pgoutput` plugin;
the layouts below are those of
https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
and the framing around them is in
https://www.postgresql.org/docs/current/protocol-replication.html.

Every message starts with a one-byte tag (`MessageTag`). All integers are big-endian (network
order). In the layouts: Int8/16/32/64 are integers of that many bits, String is UTF-8 ending in
a NUL byte, Byte(n) is n raw bytes. `[xid]` marks the Int32 transaction id that the data
messages carry only inside a stream block (protocol version 2+, between Stream Start and Stream
Stop): decode those with `decode(buf, in_stream=True)`.

TupleData, shared by Insert, Update and Delete:

    Int16   number of columns, then for each column:
    Byte1   kind: 'n' NULL, 'u' unchanged TOASTed value (not sent), 't' text, 'b' binary
    Int32   length of the value         (kinds 't' and 'b' only)
    Byte(n) the value                   (kinds 't' and 'b' only)

This runs once per change, so it is written for speed: precompiled `struct.Struct`s read with
`unpack_from` at offsets, one copy per value, no per-byte loops. A truncated buffer shows up as
`struct.error`/`IndexError` from those reads and is turned into `DecodeError` in one place.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import IntEnum
from typing import Final, TypeAlias

from pg2sink.errors import DecodeError
from pg2sink.logical.messages import (
    UNCHANGED_TOAST,
    Begin,
    BinaryValue,
    Column,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleValue,
    Type,
    Update,
)

__all__ = ["MessageTag", "TupleKind", "decode"]


class MessageTag(IntEnum):
    """First byte of each pgoutput message."""

    BEGIN = ord("B")
    COMMIT = ord("C")
    ORIGIN = ord("O")
    RELATION = ord("R")
    TYPE = ord("Y")
    INSERT = ord("I")
    UPDATE = ord("U")
    DELETE = ord("D")
    TRUNCATE = ord("T")
    MESSAGE = ord("M")
    STREAM_START = ord("S")
    STREAM_STOP = ord("E")
    STREAM_COMMIT = ord("c")
    STREAM_ABORT = ord("A")


class TupleKind(IntEnum):
    """Kind byte in front of each column of TupleData."""

    NULL = ord("n")
    UNCHANGED_TOAST = ord("u")
    TEXT = ord("t")
    BINARY = ord("b")


class TupleMarker(IntEnum):
    """Byte in front of a TupleData inside Insert, Update and Delete."""

    NEW = ord("N")
    KEY = ord("K")
    OLD = ord("O")


# Plain ints for the hot loops: comparing with an int local is cheaper than an enum lookup.
_KIND_NULL: Final = int(TupleKind.NULL)
_KIND_UNCHANGED: Final = int(TupleKind.UNCHANGED_TOAST)
_KIND_TEXT: Final = int(TupleKind.TEXT)
_KIND_BINARY: Final = int(TupleKind.BINARY)
_MARK_NEW: Final = int(TupleMarker.NEW)
_MARK_KEY: Final = int(TupleMarker.KEY)
_MARK_OLD: Final = int(TupleMarker.OLD)

# Option bits of Truncate and flags of Message, as in the message formats page linked above.
_TRUNCATE_CASCADE: Final = 1
_TRUNCATE_RESTART_IDENTITY: Final = 2
_MESSAGE_TRANSACTIONAL: Final = 1

_U16: Final = struct.Struct(">H")
_I32: Final = struct.Struct(">i")
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_BEGIN: Final = struct.Struct(">QqI")  # final LSN, commit time, xid
_COMMIT: Final = struct.Struct(">BQQq")  # flags, commit LSN, end LSN, commit time
_COLUMN_TYPE: Final = struct.Struct(">Ii")  # type oid, type modifier
_REL_MARK: Final = struct.Struct(">IB")  # relation oid, tuple marker
_TRUNCATE: Final = struct.Struct(">IB")  # number of relations, options
_MESSAGE: Final = struct.Struct(">BQ")  # flags, LSN
_STREAM_START: Final = struct.Struct(">IB")  # xid, first segment
_STREAM_COMMIT: Final = struct.Struct(">IBQQq")  # xid, flags, commit LSN, end LSN, commit time
_STREAM_ABORT: Final = struct.Struct(">II")  # xid, subxid

_Values: TypeAlias = tuple[TupleValue, ...]
_Decoder: TypeAlias = Callable[[bytes, int, int | None], PgOutputMessage]


def decode(buf: bytes | memoryview, in_stream: bool = False) -> PgOutputMessage:
    """Decode one pgoutput message.

    `in_stream` must be True between a Stream Start and a Stream Stop: there the data
    messages (Relation, Type, Insert, Update, Delete, Truncate, Message) carry an extra xid.
    Raises DecodeError on an unknown tag, truncated or malformed data.
    """
    # One copy of a memoryview up front makes each value a single bytes slice afterwards.
    data = buf if type(buf) is bytes else bytes(buf)
    if not data:
        raise DecodeError("empty pgoutput message")
    tag = data[0]
    entry = _DECODERS.get(tag)
    if entry is None:
        raise DecodeError(f"unknown pgoutput message tag {chr(tag)!r} (0x{tag:02x}) at offset 0")
    decoder, streamable = entry
    try:
        if in_stream and streamable:
            return decoder(data, 5, _U32.unpack_from(data, 1)[0])
        return decoder(data, 1, None)
    except (struct.error, IndexError) as exc:
        raise DecodeError(
            f"truncated pgoutput {MessageTag(tag).name} message: it ends after {len(data)} bytes "
            f"({exc})"
        ) from exc


def _end(data: bytes, off: int, name: str) -> None:
    """Reject bytes left over after a message: the layout did not match what was sent."""
    if off != len(data):
        raise DecodeError(
            f"pgoutput {name} message has {len(data) - off} unexpected bytes at offset {off}"
        )


def _string(data: bytes, off: int) -> tuple[str, int]:
    """Read a NUL-terminated UTF-8 String at `off`; return it and the offset after the NUL."""
    end = data.find(0, off)
    if end < 0:
        raise DecodeError(f"pgoutput string at offset {off} has no terminating NUL byte")
    try:
        return data[off:end].decode(), end + 1
    except UnicodeDecodeError as exc:
        raise DecodeError(f"pgoutput string at offset {off} is not valid UTF-8: {exc}") from exc


def _tuple(data: bytes, off: int) -> tuple[_Values, int]:
    """Read a TupleData (layout in the module docstring); return it and the offset after it."""
    start = off
    (count,) = _U16.unpack_from(data, off)
    off += 2
    unpack_len = _U32.unpack_from
    values: list[TupleValue] = [None] * count
    for i in range(count):
        kind = data[off]
        if kind == _KIND_TEXT:
            # A slice past the end is silently short; the single check after the loop
            # catches it (lengths are read unsigned, so a bogus one cannot move `off` back).
            off += 5
            end = off + unpack_len(data, off - 4)[0]
            values[i] = data[off:end]
            off = end
        elif kind == _KIND_NULL:
            off += 1
        elif kind == _KIND_UNCHANGED:
            values[i] = UNCHANGED_TOAST
            off += 1
        elif kind == _KIND_BINARY:
            off += 5
            end = off + unpack_len(data, off - 4)[0]
            values[i] = BinaryValue(data[off:end])
            off = end
        else:
            raise DecodeError(
                f"unknown pgoutput tuple column kind {chr(kind)!r} (0x{kind:02x}) at offset {off}"
            )
    if off > len(data):
        raise DecodeError(
            f"pgoutput tuple data at offset {start} ({count} columns) needs {off} bytes, "
            f"but the message has only {len(data)}"
        )
    return tuple(values), off


def _bad_marker(marker: int, off: int, expected: str) -> DecodeError:
    return DecodeError(f"expected {expected} at offset {off}, got {chr(marker)!r} (0x{marker:02x})")


def _begin(data: bytes, off: int, xid: int | None) -> Begin:
    """Begin:
    Byte1('B'), Int64 final LSN of the transaction, Int64 commit timestamp, Int32 xid.
    """
    final_lsn, commit_time, txid = _BEGIN.unpack_from(data, off)
    _end(data, off + _BEGIN.size, "BEGIN")
    return Begin(final_lsn, commit_time, txid)


def _commit(data: bytes, off: int, xid: int | None) -> Commit:
    """Commit:
    Byte1('C'), Int8 flags (unused, 0), Int64 commit LSN, Int64 end LSN of the transaction,
    Int64 commit timestamp.
    """
    flags, commit_lsn, end_lsn, commit_time = _COMMIT.unpack_from(data, off)
    _end(data, off + _COMMIT.size, "COMMIT")
    return Commit(flags, commit_lsn, end_lsn, commit_time)


def _origin(data: bytes, off: int, xid: int | None) -> Origin:
    """Origin:
    Byte1('O'), Int64 commit LSN on the origin server, String origin name.
    """
    (commit_lsn,) = _U64.unpack_from(data, off)
    name, off = _string(data, off + 8)
    _end(data, off, "ORIGIN")
    return Origin(commit_lsn, name)


def _relation(data: bytes, off: int, xid: int | None) -> Relation:
    """Relation:
    Byte1('R'), [Int32 xid], Int32 relation OID, String namespace ('' for pg_catalog),
    String relation name, Int8 replica identity (relreplident), Int16 number of columns,
    then per column: Int8 flags (1 = part of the key), String name, Int32 type OID,
    Int32 type modifier (atttypmod).
    """
    (relation_id,) = _U32.unpack_from(data, off)
    namespace, off = _string(data, off + 4)
    name, off = _string(data, off)
    replica_identity = chr(data[off])
    (count,) = _U16.unpack_from(data, off + 1)
    off += 3
    columns = []
    for _ in range(count):
        flags = data[off]
        column_name, off = _string(data, off + 1)
        type_oid, type_modifier = _COLUMN_TYPE.unpack_from(data, off)
        off += 8
        columns.append(Column(flags, column_name, type_oid, type_modifier))
    _end(data, off, "RELATION")
    return Relation(relation_id, namespace, name, replica_identity, tuple(columns), xid)


def _type(data: bytes, off: int, xid: int | None) -> Type:
    """Type:
    Byte1('Y'), [Int32 xid], Int32 type OID, String namespace ('' for pg_catalog),
    String type name.
    """
    (type_oid,) = _U32.unpack_from(data, off)
    namespace, off = _string(data, off + 4)
    name, off = _string(data, off)
    _end(data, off, "TYPE")
    return Type(type_oid, namespace, name, xid)


def _insert(data: bytes, off: int, xid: int | None) -> Insert:
    """Insert:
    Byte1('I'), [Int32 xid], Int32 relation OID, Byte1('N'), TupleData new row.
    """
    relation_id, marker = _REL_MARK.unpack_from(data, off)
    if marker != _MARK_NEW:
        raise _bad_marker(marker, off + 4, "'N' (new tuple) in INSERT")
    new, off = _tuple(data, off + 5)
    _end(data, off, "INSERT")
    return Insert(relation_id, new, xid)


def _update(data: bytes, off: int, xid: int | None) -> Update:
    """Update:
    Byte1('U'), [Int32 xid], Int32 relation OID,
    optionally Byte1('K') + TupleData old key (the replica identity changed) or
    Byte1('O') + TupleData old row (REPLICA IDENTITY FULL),
    then Byte1('N') + TupleData new row.
    """
    relation_id, marker = _REL_MARK.unpack_from(data, off)
    off += 5
    old: _Values | None = None
    old_is_key = marker == _MARK_KEY
    if old_is_key or marker == _MARK_OLD:
        old, off = _tuple(data, off)
        marker = data[off]
        off += 1
    if marker != _MARK_NEW:
        raise _bad_marker(marker, off - 1, "'N' (new tuple) in UPDATE")
    new, off = _tuple(data, off)
    _end(data, off, "UPDATE")
    return Update(relation_id, old, old_is_key, new, xid)


def _delete(data: bytes, off: int, xid: int | None) -> Delete:
    """Delete:
    Byte1('D'), [Int32 xid], Int32 relation OID,
    Byte1('K') + TupleData old key or Byte1('O') + TupleData old row (REPLICA IDENTITY FULL).
    """
    relation_id, marker = _REL_MARK.unpack_from(data, off)
    old_is_key = marker == _MARK_KEY
    if not old_is_key and marker != _MARK_OLD:
        raise _bad_marker(marker, off + 4, "'K' or 'O' (old tuple) in DELETE")
    old, off = _tuple(data, off + 5)
    _end(data, off, "DELETE")
    return Delete(relation_id, old, old_is_key, xid)


def _truncate(data: bytes, off: int, xid: int | None) -> Truncate:
    """Truncate:
    Byte1('T'), [Int32 xid], Int32 number of relations, Int8 option bits
    (1 = CASCADE, 2 = RESTART IDENTITY), then Int32 relation OID per relation.
    """
    count, options = _TRUNCATE.unpack_from(data, off)
    off += _TRUNCATE.size
    relation_ids = struct.unpack_from(f">{count}I", data, off)
    _end(data, off + 4 * count, "TRUNCATE")
    return Truncate(
        relation_ids,
        bool(options & _TRUNCATE_CASCADE),
        bool(options & _TRUNCATE_RESTART_IDENTITY),
        xid,
    )


def _message(data: bytes, off: int, xid: int | None) -> Message:
    """Message (pg_logical_emit_message, sent with option messages 'true'):
    Byte1('M'), [Int32 xid], Int8 flags (1 = transactional),
    Int64 LSN of the message, String prefix, Int32 content length, Byte(n) content.
    """
    flags, lsn = _MESSAGE.unpack_from(data, off)
    prefix, off = _string(data, off + _MESSAGE.size)
    (length,) = _I32.unpack_from(data, off)
    off += 4
    end = off + length
    if length < 0 or end != len(data):
        raise DecodeError(
            f"pgoutput MESSAGE content at offset {off} has length {length}, "
            f"but {len(data) - off} bytes follow"
        )
    return Message(bool(flags & _MESSAGE_TRANSACTIONAL), lsn, prefix, data[off:end], xid)


def _stream_start(data: bytes, off: int, xid: int | None) -> StreamStart:
    """Stream Start:
    Byte1('S'), Int32 xid, Int8 1 if this is the first segment of the transaction, else 0.
    """
    txid, first_segment = _STREAM_START.unpack_from(data, off)
    _end(data, off + _STREAM_START.size, "STREAM_START")
    return StreamStart(txid, first_segment == 1)


def _stream_stop(data: bytes, off: int, xid: int | None) -> StreamStop:
    """Stream Stop: Byte1('E') alone."""
    _end(data, off, "STREAM_STOP")
    return StreamStop()


def _stream_commit(data: bytes, off: int, xid: int | None) -> StreamCommit:
    """Stream Commit:
    Byte1('c'), Int32 xid, Int8 flags (unused, 0), Int64 commit LSN, Int64 end LSN of the
    transaction, Int64 commit timestamp.
    """
    txid, flags, commit_lsn, end_lsn, commit_time = _STREAM_COMMIT.unpack_from(data, off)
    _end(data, off + _STREAM_COMMIT.size, "STREAM_COMMIT")
    return StreamCommit(txid, flags, commit_lsn, end_lsn, commit_time)


def _stream_abort(data: bytes, off: int, xid: int | None) -> StreamAbort:
    """Stream Abort:
    Byte1('A'), Int32 xid, Int32 subtransaction xid (equal to xid for the top level),
    [PostgreSQL 16+, protocol v4 with streaming 'parallel' only: Int64 abort LSN,
    Int64 abort timestamp -- accepted and ignored, this decoder does not request them].
    """
    txid, subxid = _STREAM_ABORT.unpack_from(data, off)
    off += _STREAM_ABORT.size
    if len(data) != off + 16:
        _end(data, off, "STREAM_ABORT")
    return StreamAbort(txid, subxid)


# tag -> (decoder, whether it carries an xid inside a stream block)
_DECODERS: Final[dict[int, tuple[_Decoder, bool]]] = {
    MessageTag.BEGIN: (_begin, False),
    MessageTag.COMMIT: (_commit, False),
    MessageTag.ORIGIN: (_origin, False),
    MessageTag.RELATION: (_relation, True),
    MessageTag.TYPE: (_type, True),
    MessageTag.INSERT: (_insert, True),
    MessageTag.UPDATE: (_update, True),
    MessageTag.DELETE: (_delete, True),
    MessageTag.TRUNCATE: (_truncate, True),
    MessageTag.MESSAGE: (_message, True),
    MessageTag.STREAM_START: (_stream_start, False),
    MessageTag.STREAM_STOP: (_stream_stop, False),
    MessageTag.STREAM_COMMIT: (_stream_commit, False),
    MessageTag.STREAM_ABORT: (_stream_abort, False),
}
