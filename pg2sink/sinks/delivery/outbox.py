"""The sink thread's side of a message sink whose client thread sends and counts the
acknowledgements: batches handed over, checkpoints, the in-flight bound, waits.

A sink built on `Outbox` appends (message, size) with `put` (or inlines its three lines
on its hot path), notes checkpoints with `checkpoint`, and gives its client: an object
with `submit(generation, batch)` (never waits), `acked` (the Report of acks.py, written
whole by the client thread) and `failure` ((generation, error) that ended a generation,
or None). Everything else is here: a batch goes to the client every `batch` messages
and whenever the stream asks for acknowledgements or a flush; a checkpoint is confirmed
once every message written before it is acknowledged (Window); `put` waits while more
than the bound waits for acknowledgements; a failure of the current generation raises,
and the next generation starts (PostgreSQL replays from the last confirmed position).

What a sink adds (`check`): how long it waits on a server that does not answer, and
what it does then (the NATS sink replaces the connection, then gives up with
SinkUnavailableError).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from pg2sink.errors import SinkError
from pg2sink.sinks.delivery.acks import Report, Window

__all__ = ["Client", "Outbox"]

#: a message, whatever the client sends
M = TypeVar("M")
M_contra = TypeVar("M_contra", contravariant=True)

#: One wait for acknowledgements, in seconds.
POLL = 0.001


class Client(Protocol[M_contra]):
    """What Outbox needs of a client thread."""

    @property
    def acked(self) -> Report: ...

    @property
    def failure(self) -> tuple[int, SinkError] | None: ...

    def submit(self, generation: int, batch: Sequence[M_contra]) -> None: ...


class Outbox(Generic[M]):
    """See the module docstring."""

    def __init__(self, batch: int, max_messages: int, max_bytes: int) -> None:
        self.client: Client[M] | None = None
        """None until the sink is opened, and after it closed."""
        self.batch_size = batch
        #: the generation, the checkpoints and the in-flight bound
        self._window = Window(max_messages, max_bytes)
        self._batch: list[M] = []
        #: the batch's length at which `put` hands it over and checks for room:
        #: batch_size, or 1 after a batch was handed over early with no room left
        self._batch_limit = batch
        #: messages written in this generation, and their bytes
        self._written = 0
        self._written_bytes = 0
        #: (messages written before it, lsn) of the checkpoints not yet taken into the
        #: window (taken at each acknowledgement check: a commit of one change each
        #: costs an append, not a call)
        self._noted: list[tuple[int, int]] = []
        #: when the oldest message still waiting was handed over, if nothing waited then
        self._waiting_since = 0.0

    def put(self, message: M, size: int) -> None:
        """Write one message of `size` payload bytes (waits while there is no room)."""
        batch = self._batch
        batch.append(message)
        self._written += 1
        self._written_bytes += size
        if len(batch) >= self._batch_limit:
            self._hand_over()

    def _hand_over(self) -> None:
        """The batch is full: hand it over, and wait while there is no room."""
        self._submit()
        if self._no_room():
            while self._no_room():
                self.check(blocking=True)
                time.sleep(POLL)

    def _submit(self) -> None:
        """Hand the batch to the client thread."""
        if not self._batch:
            return
        client = self.client
        if client is None:
            raise SinkError("the sink was not opened")
        if self._acked()[0] == self._written - len(self._batch):
            self._waiting_since = time.monotonic()  # nothing waited: the clock starts
        early = len(self._batch) < self._batch_limit
        client.submit(self._window.generation, self._batch)
        self._batch = []
        # A batch handed over before it filled (the stream asked for acknowledgements or
        # a flush: once per small transaction when the sink keeps up) skipped put's room
        # check: with no room, the next message checks (else the messages in flight grow
        # past the bound at the end of a run of single-row transactions).
        self._batch_limit = 1 if early and self._no_room() else self.batch_size

    def _no_room(self) -> bool:
        """Whether more than the bound waits for acknowledgements."""
        client = self.client
        return client is not None and self._window.full(
            self._written, self._written_bytes, client.acked
        )

    def _acked(self) -> tuple[int, int]:
        """Messages of this generation acknowledged with no gap before them, and their
        payload bytes."""
        client = self.client
        return (0, 0) if client is None else self._window.own(client.acked)

    # -- the stream's calls ------------------------------------------------------------

    def checkpoint(self, lsn: int) -> None:
        self._noted.append((self._written, lsn))
        # Not handed over here: a commit of one change each would wake the client
        # thread once per message. The batch goes when full, or when the stream asks
        # for acknowledgements or a flush.

    def start_flush(self) -> None:
        self._submit()
        self.check()

    def pending_bytes(self) -> int:
        """Payload bytes written and not yet acknowledged."""
        return self._written_bytes - self._acked()[1]

    def acknowledged(self) -> int | None:
        self._submit()
        acked = self.check()
        window = self._window
        window.take(self._noted)
        return window.acknowledged(acked)

    def wait_acked(self, seconds: float) -> int:
        """Submit, then wait up to `seconds` until everything written is acknowledged;
        the number of messages still waiting."""
        self._submit()
        deadline = time.monotonic() + seconds
        while (left := self._written - self.check()) and time.monotonic() < deadline:
            time.sleep(POLL)
        return left

    def wait_all(self) -> None:
        """Wait until everything written is acknowledged (bounded by what `check` does
        when blocking)."""
        self._submit()
        while self._written > self.check(blocking=True):
            time.sleep(POLL)

    def check(self, *, blocking: bool = False) -> int:
        """The acknowledged count; raises the failure of this generation (and starts
        the next). `blocking`: a wait the stream cannot leave (room to write, an
        import's acknowledgements), which a sink may end (`waited`)."""
        client = self.client
        if client is None:
            return 0
        failure = client.failure
        if failure is not None and failure[0] == self._window.generation:
            self.restart()
            raise failure[1]
        acked = self._acked()[0]
        if acked == self._written or self._batch:
            return acked
        self.waited(self._written - acked, blocking)
        return acked

    def waited(self, waiting: int, blocking: bool) -> None:
        """`waiting` messages handed over wait for their acknowledgement (since
        `_waiting_since` at least): a sink's chance to act on a server that does not
        answer (raise to end a blocking wait)."""

    def restart(self) -> None:
        """Forget this generation's messages: PostgreSQL replays from the last
        confirmed position."""
        self._window.restart()
        self._noted.clear()
        self._batch = []
        self._batch_limit = self.batch_size
        self._written = self._written_bytes = 0
