"""pgoutput messages written as bytes: the layouts decoder.py reads, for the messages
pg2sink makes itself (a streamed transaction's Begin and Commit when its spill is
replayed, subscription/in_progress.py; Insert messages in tests), and the Begin and
Commit structs the fast path (fastpath.py) reads with.

Layouts (decoder.py has them all):
  Begin   'B', Int64 final LSN, Int64 commit time, Int32 xid
  Commit  'C', Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit time
  Insert  'I', Int32 relation id, 'N', TupleData
  TupleData: Int16 column count, then per column 'n' (NULL), 'u' (unchanged TOASTed
  value) or 't', Int32 length and the value's text.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from pg2sink.logical.decoder import MessageTag, TupleMarker
from pg2sink.logical.messages import UNCHANGED_TOAST, UnchangedToast

__all__ = ["BEGIN", "COMMIT", "begin", "commit", "insert", "tuple_data"]

BEGIN: Final = struct.Struct(">BQqI")  # tag, final LSN, commit time, xid
COMMIT: Final = struct.Struct(">BBQQq")  # tag, flags, commit LSN, end LSN, commit time
_LENGTH: Final = struct.Struct(">I")
_COUNT: Final = struct.Struct(">H")


def begin(final_lsn: int, commit_time: int, xid: int) -> bytes:
    """A Begin message (`commit_time` in PostgreSQL's microseconds since 2000)."""
    return BEGIN.pack(int(MessageTag.BEGIN), final_lsn, commit_time, xid)


def commit(flags: int, commit_lsn: int, end_lsn: int, commit_time: int) -> bytes:
    """A Commit message."""
    return COMMIT.pack(int(MessageTag.COMMIT), flags, commit_lsn, end_lsn, commit_time)


def tuple_data(values: Sequence[bytes | UnchangedToast | None]) -> bytes:
    """A TupleData of text values (None: NULL)."""
    parts = [_COUNT.pack(len(values))]
    for value in values:
        if value is None:
            parts.append(b"n")
        elif value is UNCHANGED_TOAST:
            parts.append(b"u")
        else:
            assert isinstance(value, bytes)
            parts.append(b"t" + _LENGTH.pack(len(value)) + value)
    return b"".join(parts)


def insert(relation_id: int, values: Sequence[bytes | UnchangedToast | None]) -> bytes:
    """An Insert message of a row's text values."""
    head = bytes([int(MessageTag.INSERT)]) + _LENGTH.pack(relation_id)
    return head + bytes([int(TupleMarker.NEW)]) + tuple_data(values)
