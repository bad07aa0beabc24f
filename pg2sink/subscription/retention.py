"""--wal-retain: the confirmed LSN held a window of server time behind the acknowledged one.

The loop (subscription/loop.py) notes each checkpoint with its server time (a commit's
time from its pgoutput Commit, a keepalive's send time while idle) and asks `Retention`
which acknowledged checkpoint it may confirm: the highest one at least the window older
than the newest acknowledged checkpoint. PostgreSQL keeps the WAL after the confirmed
LSN, so that window of changes can be sent again (docs/replay.md).
"""

from __future__ import annotations

import struct
from collections import deque

from pg2sink.logical.decoder import MessageTag

__all__ = ["Retention", "commit_time"]

#: a commit time (PG-epoch microseconds) and its offset in a Commit (tag, flags, commit
#: LSN, end LSN, time) and a Stream Commit (tag, xid, flags, commit LSN, end LSN, time)
_COMMIT_TIME = struct.Struct(">q")
_COMMIT_TIME_AT = {int(MessageTag.COMMIT): 18, int(MessageTag.STREAM_COMMIT): 22}
#: --wal-retain keeps one checkpoint per this many microseconds of server time (the
#: latest of each): a window's bookkeeping stays small, and retains up to this much more
_RETAIN_BUCKET_US = 1_000_000


def commit_time(payload: bytes | memoryview) -> int | None:
    """The commit time of a pgoutput Commit or Stream Commit (PG-epoch microseconds);
    None for another message."""
    at = _COMMIT_TIME_AT.get(payload[0]) if len(payload) else None
    if at is None or len(payload) < at + _COMMIT_TIME.size:
        return None
    time_us: int = _COMMIT_TIME.unpack_from(payload, at)[0]
    return time_us


class Retention:
    """--wal-retain: which acknowledged checkpoint may be confirmed, `seconds` of server
    time behind the newest acknowledged one (see the module docstring)."""

    def __init__(self, seconds: float) -> None:
        self.window_us = int(seconds * 1_000_000)
        #: (checkpoint, its server time) not confirmable yet, in LSN order
        self._marks: deque[tuple[int, int]] = deque()
        #: the highest confirmable checkpoint so far
        self.released = 0

    def note(self, lsn: int, at_us: int) -> None:
        """A checkpoint taken at server time `at_us` (the latest of its second kept)."""
        marks = self._marks
        if marks and marks[-1][1] // _RETAIN_BUCKET_US == at_us // _RETAIN_BUCKET_US:
            marks.pop()
        marks.append((lsn, at_us))

    def hold(self, acked: int) -> int:
        """The checkpoint to confirm once the sink acknowledged `acked`: the highest one
        at least the window older than the newest acknowledged one (0: none yet)."""
        newest = None
        for lsn, at_us in self._marks:
            if lsn > acked:
                break
            newest = at_us
        if newest is None:
            return self.released
        marks = self._marks
        while marks and marks[0][0] <= acked and marks[0][1] <= newest - self.window_us:
            self.released = marks.popleft()[0]
        return self.released
