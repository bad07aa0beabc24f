"""Transactions held until their checkpoint, gathered into batches and committed by one
background thread: the Sink protocol's write/checkpoint/start_flush/flush/acknowledged for
a sink whose commit is one call (the BigQuery sink's load jobs; the DuckDB sink's
transactions follow the same rules).

A transaction's records are held until `checkpoint(lsn)` (its commit's end LSN), then join
the batch, unless the sink has it already (`stored`: the LSN the sink's own state holds,
read at open; a transaction at or below it was committed before this process started
and is dropped whole). `start_flush()` hands the batch to the background thread, which
calls `commit(records, lsn)`; `acknowledged()` is the LSN of the last commit that
returned, so PostgreSQL is never told of a change the sink does not hold. A commit's
SinkError fails the sink: every later call raises it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from pg2sink.changelog.records import Message, Modification, Record, Schema
from pg2sink.errors import SinkError

__all__ = ["BackgroundCommits"]

#: pending_bytes' estimate of a record held in memory
RECORD_BYTES = 256


class BackgroundCommits:
    """See the module docstring. `commit` runs on the background thread and returns the
    LSN it made durable."""

    def __init__(
        self, commit: Callable[[Sequence[Record], int], int], name: str, max_records: int
    ) -> None:
        self._commit = commit
        self._max_records = max_records
        self.stored = 0
        self._pending: list[Record] = []
        self._batch: list[Record] = []
        self._batch_lsn = 0
        #: the highest checkpoint taken into a batch (or already in the sink)
        self._taken = 0
        self._acked: int | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._in_flight: Future[int] | None = None
        self._in_flight_records = 0
        self.failed: SinkError | None = None

    def start(self, stored: int) -> None:
        """The LSN the sink holds (read at open)."""
        self.stored = self._taken = stored

    def write(self, record: Record) -> None:
        """Hold the record with its transaction's (Messages are not stored)."""
        if record.__class__ is Message:
            return
        if isinstance(record, Modification) and self._pending:
            last = self._pending[-1]
            if isinstance(last, Modification) and record.sequence <= last.sequence:
                # the transaction starts again (a reconnect replays it): its Schema
                # records are kept (the builder sends them once)
                self._pending = [r for r in self._pending if isinstance(r, Schema)]
        self._pending.append(record)

    def checkpoint(self, lsn: int) -> None:
        """The held records are a transaction committed at `lsn`: into the batch, unless
        the sink (or a batch) has it already."""
        pending, self._pending = self._pending, []
        if lsn <= self._taken:
            if lsn <= self.stored and (self._acked is None or lsn > self._acked):
                self._acked = lsn  # committed before this process started
            return
        self._batch.extend(pending)
        self._batch_lsn = self._taken = lsn
        if len(self._batch) >= self._max_records:
            # the sink is behind: wait for its commit and hand it this batch, so memory
            # holds two batches at most (the stream waits meanwhile)
            self._wait()
            self.start_flush()

    def start_flush(self) -> None:
        """Start committing the batch in the background, unless a commit is running."""
        self._collect()
        if self._in_flight is not None or not self._batch_lsn:
            return
        batch, lsn = self._batch, self._batch_lsn
        self._batch, self._batch_lsn = [], 0
        self._in_flight_records = len(batch)
        self._in_flight = self._worker.submit(self._commit, batch, lsn)

    def flush(self) -> int | None:
        """Commit everything checkpointed, waiting for it."""
        self._wait()
        if self._batch_lsn:
            self.start_flush()
            self._wait()
        return self._acked

    def acknowledged(self) -> int | None:
        self._collect()
        return self._acked

    def pending_bytes(self) -> int:
        """An estimate: RECORD_BYTES per record held or being committed."""
        held = len(self._pending) + len(self._batch) + self._in_flight_records
        return held * RECORD_BYTES

    def stop(self) -> None:
        """Wait for the background thread and end it."""
        self._worker.shutdown(wait=True)

    def _collect(self) -> None:
        """Take the result of a finished background commit (raising its error)."""
        if self.failed is not None:
            raise self.failed
        done = self._in_flight
        if done is None or not done.done():
            return
        self._in_flight, self._in_flight_records = None, 0
        try:
            lsn = done.result()
        except SinkError as e:
            self.failed = e
            raise
        if self._acked is None or lsn > self._acked:
            self._acked = lsn

    def _wait(self) -> None:
        if self._in_flight is not None:
            self._in_flight.exception()
        self._collect()
