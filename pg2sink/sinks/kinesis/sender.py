"""The Kinesis sink's background thread: queued entries put in order, retried.

The stream's thread queues entries (`enqueue`, a lock and an append: no I/O per
record); this thread takes them in order and sends one PutRecords at a time:

- a batch goes as soon as the queue holds a full one (batching.take_batch's limits),
  or when the stream asks for everything queued so far (`send_all`, at each
  start_flush), so a quiet stream sends small batches at the flush interval;
- the failed entries of a response (batching.plan_retry) are sent again, after a pause
  (pg2sink.retry, full jitter), before anything newer: per-key order holds, and the batch counts
  as accepted only when all of it is stored;
- a request that fails as a whole is retried the same way: retryable failures (no
  connection, throttling, a 5xx) forever, with one WARNING when the trouble starts and
  one INFO line when Kinesis accepts records again (`outages`, the delivery engine's:
  also the sink's health in GET /status); a failure retrying cannot fix
  (the stream deleted, access denied) stops the thread, and the stream's next call
  raises it.

`accepted` counts the entries stored, from the head of the queue without a gap: the
sink confirms a checkpoint once every entry written before it is counted.

Memory is bounded: `enqueue` waits while `max_queued` bytes are queued, and when the
queue has stayed full for STALL_WAIT (Kinesis away for long), it raises
SinkUnavailableError after `reset()`: the service reconnects after a pause and
PostgreSQL replays from the last confirmed position, while this thread, finding its
generation changed, gives up the batch it was retrying (the replay brings it again).

Why a thread: a PutRecords of 500 records waits for the server far longer than it
takes of this process's CPU; sent at start_flush on the stream's thread, it would stop
decoding for that wait every 500 records (bench/kinesis_sink.py measures the whole
sink).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.retry import Backoff
from pg2sink.sinks.delivery import Outages
from pg2sink.sinks.kinesis.batching import (
    BACKOFF_BASE,
    BACKOFF_CAP,
    MAX_RECORDS,
    MAX_REQUEST_BYTES,
    Entry,
    plan_retry,
    take_batch,
)

__all__ = ["Put", "Sender"]

log = logging.getLogger(__name__)

#: Sends one request: the PutRecords response dict; raises SinkUnavailableError for a
#: failure worth retrying, SinkError for one that is not.
Put = Callable[[Sequence[Entry]], Mapping[str, Any]]

#: Bytes queued before `enqueue` waits for the thread (several full requests).
MAX_QUEUED = 8 * MAX_REQUEST_BYTES
#: Seconds the queue may stay full before `enqueue` gives up (SinkUnavailableError):
#: the stream's thread must get back to PostgreSQL well within wal_sender_timeout (60s).
STALL_WAIT = 20.0


class Sender:
    """The queue and the thread that empties it; see the module docstring."""

    def __init__(
        self,
        put: Put,
        stream: str,
        *,
        max_queued: int = MAX_QUEUED,
        stall_wait: float = STALL_WAIT,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._put = put
        self._stream = stream
        self._max_queued = max_queued
        self._stall_wait = stall_wait
        #: the waits between attempts: reset by each stored request (sending thread's own)
        self._backoff = Backoff(BACKOFF_BASE, BACKOFF_CAP, jitter=1.0, rand=rand)
        self._cond = threading.Condition()
        # all below under self._cond
        self._queue: deque[Entry] = deque()
        self._queued_bytes = 0
        self._in_flight_bytes = 0
        #: entries enqueued, taken into a request, and stored (this generation)
        self._written = 0
        self._taken = 0
        self._accepted = 0
        #: entries the stream asked to send without waiting for a full batch
        self._send_upto = 0
        #: bumped by reset(): a request of an older generation is given up
        self._generation = 0
        self._error: SinkError | None = None
        self._stopping = False
        #: retryable trouble: logged once each way, the sink's health
        self.outages = Outages(f"Kinesis stream {stream!r}")
        self._thread = threading.Thread(target=self._run, name="pg2sink-kinesis", daemon=True)

    # -- the stream's thread ---------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def written(self) -> int:
        """Entries enqueued since the last reset (only the stream's thread changes it)."""
        return self._written

    def enqueue(self, entry: Entry) -> None:
        """Queue `entry` behind the others; waits while the queue is full (bounded by
        the stall wait, then SinkUnavailableError after a reset)."""
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._queued_bytes >= self._max_queued:
                self._wait_for_room()
            self._queue.append(entry)
            self._queued_bytes += entry.size
            self._written += 1
            if len(self._queue) == MAX_RECORDS or self._queued_bytes >= MAX_REQUEST_BYTES:
                self._cond.notify_all()

    def _wait_for_room(self) -> None:
        """Wait (holding the condition) until the thread takes a batch from the queue."""
        self._send_upto = self._written
        self._cond.notify_all()
        deadline = time.monotonic() + self._stall_wait
        while self._queued_bytes >= self._max_queued:
            remaining = deadline - time.monotonic()
            if self._error is not None:
                raise self._error
            if remaining <= 0:
                reason = self.outages.reason or "no answer"
                self._reset()
                raise SinkUnavailableError(
                    f"Kinesis stream {self._stream!r} took no records for "
                    f"{self._stall_wait:.0f}s ({reason}); resending from the last "
                    "confirmed position (at-least-once)"
                )
            self._cond.wait(remaining)

    def send_all(self) -> None:
        """Send everything queued so far, without waiting for a full batch."""
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._send_upto < self._written:
                self._send_upto = self._written
                self._cond.notify_all()

    def accepted(self) -> int:
        """Entries stored by Kinesis, from the first without a gap; raises the failure
        that stopped the thread, if any."""
        with self._cond:
            if self._error is not None:
                raise self._error
            return self._accepted

    def wait_accepted(self, count: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds until `count` entries are stored."""
        with self._cond:
            self._cond.wait_for(lambda: self._accepted >= count or self._error is not None, timeout)
            if self._error is not None:
                raise self._error
            return self._accepted >= count

    def pending_bytes(self) -> int:
        """Bytes queued or in flight, not yet stored."""
        with self._cond:
            return self._queued_bytes + self._in_flight_bytes

    def reset(self) -> None:
        """Forget every entry not stored yet (PostgreSQL replays them)."""
        with self._cond:
            self._reset()

    def _reset(self) -> None:
        self._generation += 1
        self._queue.clear()
        self._queued_bytes = 0
        self._written = self._taken = self._accepted = self._send_upto = 0
        self._cond.notify_all()

    def stop(self, timeout: float) -> None:
        """Stop the thread: a request in flight is given up after it returns (its
        entries are not confirmed, so they come again after a restart)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the sending thread ----------------------------------------------------------

    def _ready(self) -> bool:
        """Whether a request is due: a full batch, or entries the stream asked for."""
        queue = self._queue
        return bool(queue) and (
            len(queue) >= MAX_RECORDS
            or self._queued_bytes >= MAX_REQUEST_BYTES
            or self._taken < self._send_upto
        )

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._ready():
                    if self._stopping:
                        return
                    self._cond.wait()
                if self._stopping:
                    return
                generation = self._generation
                batch = take_batch(self._queue)
                size = sum(e.size for e in batch)
                self._taken += len(batch)
                self._queued_bytes -= size
                self._in_flight_bytes = size
                self._cond.notify_all()  # room for a writer waiting in enqueue
            try:
                stored = self._deliver(batch, generation)
            except Exception as e:  # a bug must not leave the stream waiting forever
                log.exception("Kinesis sender failed")
                stored = False
                self._fail(SinkError(f"the Kinesis sender failed: {e!r}"))
            with self._cond:
                self._in_flight_bytes = 0
                if stored and generation == self._generation:
                    self._accepted += len(batch)
                self._cond.notify_all()
                if self._error is not None:
                    return

    def _deliver(self, batch: list[Entry], generation: int) -> bool:
        """Put `batch` until all of it is stored: True; False when it was given up (a
        reset, a stop, a failure retrying cannot fix)."""
        pending = batch
        while not self._given_up(generation):
            try:
                response = self._put(pending)
            except SinkUnavailableError as e:
                self._trouble(str(e))
            except SinkError as e:
                self._fail(e)
                return False
            else:
                outcome = plan_retry(pending, response)
                if outcome.terminal is not None:
                    self._fail(
                        SinkError(
                            f"Kinesis stream {self._stream!r} refused a record: {outcome.terminal}"
                        )
                    )
                    return False
                if not outcome.again:
                    self._backoff.succeeded()
                    self._recovered()
                    return True
                codes = ", ".join(f"{n} {code}" for code, n in sorted(outcome.errors.items()))
                self._trouble(f"{outcome.failed} of {len(pending)} records failed ({codes})")
                pending = outcome.again
            self._pause(self._backoff.failed(), generation)
        return False

    def _given_up(self, generation: int) -> bool:
        with self._cond:
            return self._stopping or generation != self._generation

    def _pause(self, seconds: float, generation: int) -> None:
        """Sleep before a retry; a reset or a stop ends it early."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or generation != self._generation, seconds)

    def _fail(self, error: SinkError) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    # -- one line per outage ---------------------------------------------------------

    def _trouble(self, reason: str) -> None:
        """A request failed in a way worth retrying: logged once per outage."""
        if self.outages.trouble(reason):
            log.warning(
                "Kinesis stream %r: %s; retrying with backoff (nothing after the last "
                "stored record is confirmed)",
                self._stream,
                reason,
            )

    def _recovered(self) -> None:
        """A request was stored after trouble: one line saying so."""
        ended = self.outages.recovered()
        if ended is not None:
            log.info(
                "Kinesis stream %r stores records again, after %.1fs and %d failed attempts",
                self._stream,
                *ended,
            )
