"""Contiguous acknowledgement: which checkpoints Kafka has made durable.

Messages are numbered in the order they are produced. Kafka acknowledges them per
partition, so across partitions the delivery reports arrive out of order: message 7 on
partition 1 may be acknowledged before message 5 on partition 0. A checkpoint taken after
message n is durable only once every message below n is acknowledged; a later ack never
covers an earlier unacknowledged message (DESIGN.md §3).

    produced:   0 1 2 3 | 4 5 | 6          (| = a checkpoint mark)
    delivered:  0 1 2 3   4 _   6          → the contiguous prefix ends at 5,
                                             so only the first mark is acknowledged
"""

from __future__ import annotations

from collections import deque

__all__ = ["AckTracker"]


class AckTracker:
    """Numbers produced messages and tells the highest checkpoint fully delivered."""

    __slots__ = ("_acknowledged", "_ahead", "_contiguous", "_marks", "produced")

    def __init__(self) -> None:
        #: messages produced so far; the next message gets this number
        self.produced = 0
        # every message below this number is delivered
        self._contiguous = 0
        # delivered messages above the contiguous prefix (bounded by what is in flight)
        self._ahead: set[int] = set()
        # (messages produced when the checkpoint was taken, checkpoint LSN), oldest first
        self._marks: deque[tuple[int, int]] = deque()
        self._acknowledged: int | None = None

    def next_seq(self) -> int:
        """Number the next produced message."""
        seq = self.produced
        self.produced = seq + 1
        return seq

    def delivered(self, seq: int) -> None:
        """Kafka acknowledged message `seq`."""
        if seq != self._contiguous:
            self._ahead.add(seq)
            return
        contiguous = seq + 1
        ahead = self._ahead
        while ahead and contiguous in ahead:
            ahead.remove(contiguous)
            contiguous += 1
        self._contiguous = contiguous

    def checkpoint(self, lsn: int) -> None:
        """Everything produced so far belongs to WAL below `lsn`."""
        marks = self._marks
        if marks and marks[-1][0] == self.produced:
            # nothing produced since the last mark (keepalives): move it forward
            if lsn > marks[-1][1]:
                marks[-1] = (self.produced, lsn)
            return
        marks.append((self.produced, lsn))

    def acknowledged(self) -> int | None:
        """The highest checkpoint whose every earlier message is delivered."""
        marks = self._marks
        contiguous = self._contiguous
        while marks and marks[0][0] <= contiguous:
            self._acknowledged = marks.popleft()[1]
        return self._acknowledged

    @property
    def pending(self) -> bool:
        """Whether the latest checkpoint still waits for deliveries."""
        return bool(self._marks) and self._marks[-1][0] > self._contiguous

    @property
    def undelivered(self) -> int:
        """Messages produced but not (contiguously) delivered."""
        return self.produced - self._contiguous
