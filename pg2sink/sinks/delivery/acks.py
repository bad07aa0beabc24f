"""Acknowledgements to LSNs: what a sink may confirm, given what its server acknowledged.

Messages are numbered 0, 1, ... in the order the sink wrote them, within a generation.
The client thread's `Acks` turns the server's acknowledgements (per message, in any
order) into `count`, the messages acknowledged with no gap before them. The sink
thread's `Window` remembers, per checkpoint, how many messages were written before it
(`Marks`): a checkpoint is confirmed once `count` reaches that number, so no LSN is
confirmed before every message written before it is acknowledged (DESIGN.md §3).

Generations: a failure that makes PostgreSQL replay from the last confirmed LSN starts
a new generation on both sides (`Window.restart`, `Acks.clear`); the client reports its
count as (generation, count, bytes), and a report of another generation counts nothing,
so a late acknowledgement of the old generation never confirms a replayed message.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Acks", "Marks", "Window"]

#: (generation, messages acknowledged with no gap, their bytes): what a client thread
#: publishes to the sink's thread, written whole (a read sees the old or the new tuple)
Report = tuple[int, int, int]


class Acks:
    """The client thread's count of messages acknowledged with no gap before them."""

    __slots__ = ("_early", "count", "sent")

    _early: set[int]
    count: int
    """Messages acknowledged with no gap before them."""
    sent: int
    """Messages sent (the next serial)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """A new generation: nothing sent."""
        self._early = set()
        self.count = self.sent = 0

    def acknowledge(self, serial: int) -> bool:
        """One message's acknowledgement; whether the count moved. One ahead of a gap
        waits until the gap is filled; a repeat, or a serial not sent, counts nothing."""
        count = self.count
        if serial != count or serial >= self.sent:
            if count < serial < self.sent:
                self._early.add(serial)
            return False
        early = self._early
        count += 1
        while count in early:
            early.remove(count)
            count += 1
        self._moved(count)
        return True

    def _moved(self, count: int) -> None:
        """The count is `count` now (more than it was, at most those sent)."""
        self.count = count


class Marks:
    """Checkpoints and how many messages were written before each."""

    __slots__ = ("_acknowledged", "_marks")

    def __init__(self) -> None:
        self._marks: deque[tuple[int, int]] = deque()
        self._acknowledged: int | None = None

    def checkpoint(self, written: int, lsn: int) -> None:
        """Every message of the first `written` belongs to WAL below `lsn`."""
        marks = self._marks
        if marks:
            last_written, last_lsn = marks[-1]
            if lsn <= last_lsn:
                return  # never backwards
            if last_written == written:  # nothing written since: move the mark
                marks[-1] = (written, lsn)
                return
        elif self._acknowledged is not None and lsn <= self._acknowledged:
            return
        marks.append((written, lsn))

    def take(self, noted: list[tuple[int, int]]) -> None:
        """The checkpoints a sink noted as (written, lsn), oldest first, with a list
        append on its hot path instead of a call per checkpoint; `noted` is emptied."""
        for written, lsn in noted:
            self.checkpoint(written, lsn)
        noted.clear()

    def acknowledged(self, count: int) -> int | None:
        """The highest checkpoint whose messages are all among the first `count`."""
        marks = self._marks
        while marks and marks[0][0] <= count:
            self._acknowledged = marks.popleft()[1]
        return self._acknowledged

    def forget(self) -> None:
        """Drop the checkpoints not yet acknowledged (their messages were dropped and
        come again in the replay); what was acknowledged stays so."""
        self._marks.clear()


class Window(Marks):
    """The sink thread's side: Marks, the generation, and the in-flight bound."""

    __slots__ = ("generation", "max_bytes", "max_messages")

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        super().__init__()
        self.generation = 1
        self.max_messages = max_messages
        self.max_bytes = max_bytes

    def own(self, report: Report) -> tuple[int, int]:
        """(count, bytes) of a client's report, (0, 0) when it is of another generation."""
        generation, count, size = report
        return (count, size) if generation == self.generation else (0, 0)

    def full(self, written: int, written_bytes: int, report: Report) -> bool:
        """Whether more than max_messages or max_bytes wait for their acknowledgement."""
        count, size = self.own(report)
        return written - count > self.max_messages or written_bytes - size > self.max_bytes

    def restart(self) -> None:
        """A new generation: the messages written so far are forgotten (the replay
        writes them again, counted from 0), and nothing of it is acknowledged yet."""
        self.generation += 1
        self.forget()
        self._acknowledged = None
