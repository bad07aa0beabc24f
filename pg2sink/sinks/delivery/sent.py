"""The messages a client thread sent in one generation, kept until its server
acknowledges them (to send again, in order, on a new connection), and the count
acknowledged with no gap before it: Acks with the messages and their sizes.

Kept by write (a chunk of messages), each with the cumulative sizes of its payloads, so
that the bytes acknowledged are one lookup and no message is popped one at a time; a
write is dropped once wholly acknowledged (the last one stays, for its sizes). Serials
are 0, 1, ... in the order sent; acks come back in order, a run of them moves the count
in one step, and one ahead of a gap waits. The client thread's own (it publishes the
count to the sink's thread as a Report). Used by the NATS sink (sinks/nats/client.py).
"""

from __future__ import annotations

from collections import deque
from itertools import accumulate
from typing import Generic, TypeVar

from pg2sink.sinks.delivery.acks import Acks

__all__ = ["Sent"]

#: a message, whatever a client sends
M = TypeVar("M")


class Sent(Acks, Generic[M]):
    """See the module docstring."""

    __slots__ = ("_writes", "sent_bytes", "size")

    _writes: deque[tuple[int, list[M], list[int]]]
    """The writes, oldest first: (serial of the first message, the messages, the payload
    bytes sent before each message of this generation and after the last)."""
    size: int
    """The payload bytes of the messages acknowledged with no gap (`count`)."""
    sent_bytes: int
    """The payload bytes of the messages sent (`sent`)."""

    def clear(self) -> None:
        """A new generation: nothing sent."""
        super().clear()
        self._writes = deque()
        self.size = self.sent_bytes = 0

    def resend(self) -> list[M]:
        """The messages sent and not acknowledged, in their order, forgotten: they are
        sent again with the same serials (a new connection)."""
        left: list[M] = []
        for first, messages, _ in self._writes:
            left += messages[max(self.count - first, 0) :]
        self._writes.clear()
        self._early.clear()
        self.sent, self.sent_bytes = self.count, self.size
        return left

    def waiting(self) -> bool:
        """Whether a message sent waits for its acknowledgement."""
        return self.sent != self.count

    def keep(self, messages: list[M], sizes: list[int]) -> None:
        """Messages sent next, and the sizes of their payloads."""
        ends = list(accumulate(sizes, initial=self.sent_bytes))
        self._writes.append((self.sent, messages, ends))
        self.sent, self.sent_bytes = self.sent + len(messages), ends[-1]

    def acknowledge_run(self, serials: list[bytes]) -> bool:
        """The serials of a read's run of PubAcks; whether the count moved."""
        count, n = self.count, len(serials)
        if (
            self._early
            or count + n > self.sent
            or list(map(int, serials)) != list(range(count, count + n))
        ):  # not the n messages after the count, in order
            moved = False
            for serial in serials:
                moved = self.acknowledge(int(serial)) or moved
            return moved
        self._moved(count + n)
        return True

    def _moved(self, count: int) -> None:
        """The count is `count` (more than it was, at most those sent): its bytes, and
        the writes acknowledged in whole dropped."""
        writes = self._writes
        while True:
            first, messages, ends = writes[0]
            if count - first < len(messages) or len(writes) == 1:
                self.count, self.size = count, ends[count - first]
                return
            writes.popleft()
