"""Which checkpoints Kafka has made durable: acknowledgement by draining the producer.

A checkpoint (an LSN) may be confirmed only once every message produced before it is
acknowledged by the broker, whatever its partition: across partitions acknowledgements
arrive out of order, and a later ack never covers an earlier unacknowledged message
(DESIGN.md §3).

pg2sink does not track messages one by one. A delivery report per message is a Python
callback with a Message object built for it, a large share of the main thread's work
per change (`make bench-stream ARGS="--sink kafka"`). Instead the producer reports failures
only (delivery.report.only.error), and a checkpoint is acknowledged when the producer is
seen *drained*: its out-queue (messages queued or in flight, plus reports not yet served)
is empty after serving the reports, and none of them was a failure. Every message
produced before that moment is then delivered, so every checkpoint taken before it is
durable: contiguity holds by construction, not by bookkeeping.

Under a light load the queue empties by itself within a linger.ms or two. Under a steady
load it never does, so the sink drains it when it was last seen empty a second ago
(`KafkaSink.start_flush`: librdkafka's flush sends at once, ignoring linger.ms; the pause
is one round trip to the broker, a few milliseconds per second).

    produce 0 1 2 3 | 4 5 | 6          (| = a checkpoint)
    drained after 6 → both checkpoints are acknowledged; 6 waits for the next one
"""

from __future__ import annotations

__all__ = ["Checkpoints"]


class Checkpoints:
    """The latest checkpoint, and the highest one a drain acknowledged."""

    __slots__ = ("_acknowledged", "_latest")

    def __init__(self) -> None:
        self._latest: int | None = None
        self._acknowledged: int | None = None

    def checkpoint(self, lsn: int) -> None:
        """Everything produced so far belongs to WAL below `lsn` (never backwards)."""
        if self._latest is None or lsn > self._latest:
            self._latest = lsn

    def drained(self) -> None:
        """The producer was seen empty with no failure: every checkpoint so far is durable."""
        self._acknowledged = self._latest

    def acknowledged(self) -> int | None:
        """The highest checkpoint whose every earlier message is delivered."""
        return self._acknowledged

    @property
    def pending(self) -> bool:
        """Whether the latest checkpoint still waits for a drain."""
        return self._latest != self._acknowledged
