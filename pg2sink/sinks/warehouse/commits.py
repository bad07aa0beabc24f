"""Transactions held until their checkpoint, gathered into batches and committed by one
background thread: the Sink protocol's write/checkpoint/start_flush/flush/acknowledged for
a warehouse sink whose commit is one call (the BigQuery sink's load jobs, the DuckDB
sink's transactions).

A transaction's records are held until `checkpoint(lsn)` (its commit's end LSN), then join
the batch, unless the sink has it already (`stored`: the LSN the sink's own state holds,
read at open; a transaction at or below it was committed before this process started
and is dropped whole). `start_flush()` hands the batch to the background thread, which
calls `commit(records, lsn)`; `acknowledged()` is the LSN of the last commit that
returned, so PostgreSQL is never told of a change the sink does not hold. A commit's
SinkError fails the sink: every later call raises it.

Outages: a commit that raises SinkUnavailableError (its server unreachable, or answering
5xx) is called again with the same records and LSN, after about 1 s, 2 s, 4 s ... up to
RETRY_MAX_WAIT (pg2sink.retry, with jitter), for as long as the outage lasts: the sink
must load nothing twice when called again (BigQuery: the batch's deterministic job ids).
One WARNING when an outage starts, one INFO when the commit goes through. Meanwhile the
stream goes on: `flush()` does not wait for the retried commit (it returns what is
acknowledged), nothing new is acknowledged, and a batch grown to `max_records` behind it
raises SinkUnavailableError after dropping what the batch held (the service reconnects
once the wait is over and PostgreSQL sends those transactions again), so memory holds
two batches at most. `stop()` ends the retries: what the commit held is not
acknowledged, so the next start sends it again. `outages` (the delivery engine's
Outages) tells the stream's stats when an outage starts and ends (GET /status).

Spacing (`min_interval`, the BigQuery sink's --bigquery-load-interval): a batch that holds
records is committed at least `min_interval` seconds after the previous such commit
started; `start_flush()` before then leaves it to grow (BigQuery counts every load job
against a table's daily quota, whatever its size). A batch of checkpoints only (the
keepalive positions of an idle stream) is not held, nor is a full batch (`max_records`:
memory comes first), nor `flush()` (a stop).

Chunks (a sink that gives `Chunks`): a transaction of `chunk_records` records is not held
whole. The batch before it is committed first; then its records go to `Chunks.write_chunk` a
chunk at a time on the background thread (one chunk written while the next is held),
and its checkpoint's `commit` ends it. The sink keeps those chunks apart from what it
confirms (the DuckDB sink fences them off by position) until that commit, and
`Chunks.drop_chunks` removes them: when the transaction starts again (a reconnect replays it),
turns out to be one the sink has, or the sink closes before its commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Protocol

from pg2sink.changelog.records import Message, Modification, Record, Schema
from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.logical.lsn import format_lsn
from pg2sink.retry import Backoff
from pg2sink.sinks.delivery import Outages

__all__ = ["RECORD_BYTES", "BackgroundCommits", "Chunks"]

log = logging.getLogger(__name__)

#: pending_bytes' estimate of a record held in memory
RECORD_BYTES = 256
#: the waits between attempts of a commit in an outage double from the first to the
#: longest (short: each attempt has already waited out the client's own retries)
RETRY_FIRST_WAIT = 1.0
RETRY_MAX_WAIT = 10.0
#: the share of each wait left to chance
RETRY_JITTER = 0.2
#: how often a wait for the commit in flight looks whether an outage began
_WAIT_POLL = 0.2


class Chunks(Protocol):
    """What a sink does with the chunks of a large transaction (background thread)."""

    def write_chunk(self, records: Sequence[Record]) -> None:
        """Store a chunk of the open transaction, kept apart until its commit."""

    def drop_chunks(self) -> None:
        """Remove every stored chunk of the open transaction."""


class BackgroundCommits:
    """See the module docstring. `commit` runs on the background thread and returns the
    LSN it made durable; `where` names the sink's store in the log line of transactions
    it has already (none: no line)."""

    def __init__(
        self,
        commit: Callable[[Sequence[Record], int], int],
        name: str,
        max_records: int,
        *,
        chunks: Chunks | None = None,
        chunk_records: int = 0,
        where: str | None = None,
        min_interval: float = 0.0,
    ) -> None:
        self._commit = commit
        self._max_records = max_records
        self._min_interval = min_interval
        #: when the last commit of records started (monotonic; Spacing)
        self._last_records_commit = -float("inf")
        self._chunks = chunks
        self._chunk_records = chunk_records if chunks is not None else 0
        self._where = where
        self.stored = 0
        self._pending: list[Record] = []
        #: the open transaction's last Modification's sequence (-1: none yet)
        self._sequence = -1
        self._batch: list[Record] = []
        self._batch_lsn = 0
        #: the highest checkpoint taken into a batch (or already in the sink)
        self._taken = 0
        self._acked: int | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._in_flight: Future[int] | None = None
        self._in_flight_records = 0
        #: the LSN the commit in flight is of
        self._in_flight_lsn = 0
        self.failed: SinkError | None = None
        #: the commit in flight waits for its server to come back (the background thread
        #: tells it while it retries): logged once each way, the sink's health
        self.outages = Outages()
        self._stopping = threading.Event()
        #: the open transaction went to Chunks.write; the Schema records of its chunks
        #: (kept when it starts again); the chunk being written
        self._chunking = False
        self._chunked_schemas: list[Schema] = []
        self._chunk: Future[None] | None = None

    def start(self, stored: int) -> None:
        """The LSN the sink holds (read at open)."""
        self.stored = self._taken = stored

    def write(self, record: Record) -> None:
        """Hold the record with its transaction's (Messages are not stored); a chunk of a
        large transaction to the sink."""
        if record.__class__ is Message:
            return
        if isinstance(record, Modification):
            if record.sequence <= self._sequence:
                # the transaction starts again (a reconnect replays it): what was held or
                # stored of it is dropped, its Schema records kept (the builder sends
                # them once)
                schemas = [*self._chunked_schemas]
                self.drop_chunks()
                self._pending = [*schemas, *(r for r in self._pending if isinstance(r, Schema))]
            self._sequence = record.sequence
        self._pending.append(record)
        if self._chunk_records and len(self._pending) >= self._chunk_records:
            self._write_chunk()

    def checkpoint(self, lsn: int) -> None:
        """The held records are a transaction committed at `lsn`: into the batch, unless
        the sink (or a batch) has it already; a transaction written in chunks commits."""
        pending, self._pending = self._pending, []
        self._sequence = -1
        if self._chunking and lsn > self._taken:
            self._wait_chunk()
            self._chunking, self._chunked_schemas = False, []
            self._taken = lsn
            self._submit(pending, lsn)
            return
        if lsn <= self._taken:
            self.drop_chunks()  # a transaction in chunks that the sink has already
            if lsn <= self.stored and (self._acked is None or lsn > self._acked):
                if self._acked is None and self._where is not None:
                    log.info(
                        "transactions up to LSN %s are in %s already: skipped",
                        format_lsn(self.stored),
                        self._where,
                    )
                self._acked = lsn  # committed before this process started
            return
        self._batch.extend(pending)
        self._batch_lsn = self._taken = lsn
        if len(self._batch) >= self._max_records:
            # the sink is behind: wait for its commit and hand it this batch, so memory
            # holds two batches at most (the stream waits meanwhile)
            self._wait()
            if self.outages.down:
                self._drop_batch()
                raise SinkUnavailableError(
                    f"{self.outages.reason} (a full batch waits behind it: the stream starts again "
                    "from the last confirmed LSN once it is loaded)"
                )
            self._start(spaced=False)

    def start_flush(self) -> None:
        """Start committing the batch in the background, unless a commit is running or the
        batch waits for its turn (Spacing)."""
        self._start(spaced=True)

    def _start(self, spaced: bool) -> None:
        self._collect()
        if self._in_flight is not None or not self._batch_lsn:
            return
        if self._batch:
            now = time.monotonic()
            if spaced and now < self._last_records_commit + self._min_interval:
                return
            self._last_records_commit = now
        batch, lsn = self._batch, self._batch_lsn
        self._batch, self._batch_lsn = [], 0
        self._submit(batch, lsn)

    def flush(self) -> int | None:
        """Commit everything checkpointed, waiting for it (not while the commit in flight
        waits out an outage: then what is acknowledged so far)."""
        self._wait()
        if self._batch_lsn:
            self._start(spaced=False)
            self._wait()
        return self._acked

    def acknowledged(self) -> int | None:
        self._collect()
        return self._acked

    def pending_bytes(self) -> int:
        """An estimate: RECORD_BYTES per record held or being committed."""
        held = len(self._pending) + len(self._batch) + self._in_flight_records
        return held * RECORD_BYTES

    def drop_chunks(self) -> None:
        """Remove the stored chunks of the open transaction, if it has any."""
        if not self._chunking or self._chunks is None:
            return
        self._wait_chunk()
        self._chunking, self._chunked_schemas = False, []
        self._worker.submit(self._chunks.drop_chunks).result()

    def stop(self) -> None:
        """End the retries of a commit in an outage, wait for the background thread and
        end it."""
        self._stopping.set()
        self._worker.shutdown(wait=True)

    def _submit(self, records: list[Record], lsn: int) -> None:
        self._in_flight_records, self._in_flight_lsn = len(records), lsn
        self._in_flight = self._worker.submit(self._retried, records, lsn)

    def _retried(self, records: list[Record], lsn: int) -> int:
        """`commit(records, lsn)` on the background thread, called again after a wait
        while it raises SinkUnavailableError, until it returns, raises another error or
        the sink stops (module docstring: Outages)."""
        backoff = Backoff(RETRY_FIRST_WAIT, RETRY_MAX_WAIT, jitter=RETRY_JITTER)
        while True:
            try:
                done = self._commit(records, lsn)
            except SinkUnavailableError as e:
                if self.outages.trouble(str(e)):
                    log.warning(
                        "%s; retrying with backoff until it answers (nothing after LSN %s "
                        "is confirmed meanwhile)",
                        e,
                        format_lsn(self._acked or self.stored),
                    )
                else:
                    log.debug("still unavailable: %s", e)
                if self._stopping.wait(backoff.failed()):
                    log.warning(
                        "stopped while the sink was unavailable: the changes after LSN %s "
                        "are sent again at the next start",
                        format_lsn(self._acked or self.stored),
                    )
                    raise
                continue
            except SinkError:
                self.outages.recovered()  # not an outage any more: the sink failed
                raise
            ended = self.outages.recovered()
            if ended is not None:
                seconds, failures = ended
                log.info(
                    "the sink answers again after %.1fs (%d failed attempt%s): committed up "
                    "to LSN %s",
                    seconds,
                    failures,
                    "" if failures == 1 else "s",
                    format_lsn(done),
                )
            return done

    def _drop_batch(self) -> None:
        """Forget the batch and the open transaction (a full batch in an outage): the
        stream sends them again after the commit in flight."""
        self._batch, self._batch_lsn, self._pending, self._sequence = [], 0, [], -1
        self._taken = self._in_flight_lsn

    def _write_chunk(self) -> None:
        """The held records of the open transaction to Chunks.write_chunk on the background
        thread; the batch before it is committed first, so that dropping the chunks
        takes nothing else along. One chunk is written while the next is held."""
        assert self._chunks is not None
        if not self._chunking:
            self.flush()
            self._chunking = True
        self._wait_chunk()
        chunk, self._pending = self._pending, []
        self._chunked_schemas.extend(r for r in chunk if isinstance(r, Schema))
        self._chunk = self._worker.submit(self._chunks.write_chunk, chunk)

    def _wait_chunk(self) -> None:
        """Wait for the chunk being written (its error is the sink's from then on)."""
        chunk, self._chunk = self._chunk, None
        if chunk is None:
            return
        try:
            chunk.result()
        except SinkError as e:
            self.failed = e
            raise

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
        """Wait for the commit in flight (unless it waits out an outage) and take its
        result."""
        done = self._in_flight
        while done is not None and not done.done() and not self.outages.down:
            wait_futures([done], timeout=_WAIT_POLL)
        self._collect()
