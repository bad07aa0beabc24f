"""The DuckDB sink: every table's changes in an embedded DuckDB file, exactly once.

Records are held per transaction until its checkpoint (the commit's end LSN), then join
the batch. `start_flush()` hands the batch to a background thread, which writes it in
one DuckDB transaction together with its last checkpoint in `pg2sink_state`
(transaction.py): the Schema records become raw table DDL and views (layout.py), the
Modifications rows of the raw tables (values.py), numbered by `_pg2sink_position` in the
order they came. `acknowledged()` is the LSN of the last committed transaction, so
PostgreSQL is never told of a change DuckDB does not hold.

Memory: a PostgreSQL transaction of more than CHUNK_RECORDS records is not held whole.
The batch before it is committed first; then its records go to DuckDB a chunk at a time,
inside one DuckDB transaction left open, which commits at the transaction's checkpoint
with the state row, or rolls back when the transaction starts again (a reconnect), turns
out to be in the file already, or the sink closes before its commit. A crash leaves the
open DuckDB transaction uncommitted, which DuckDB discards: exactly once still.

Exactly once: at open the sink reads the LSN stored in the file. The stream restarts at
the slot's confirmed position, which may be before it (a crash between DuckDB's commit
and the confirmation): a transaction whose checkpoint is at or below the stored LSN is
already in the file and is dropped whole. The same holds after a reconnect within one
process (a transaction torn by the lost connection is dropped when it starts again).

Imports: executors stage Parquet files next to the database (imports.py); each commit
loads the staged files first, records them in `pg2sink_loaded` in the same transaction
and deletes them once committed. The import gate releases the changes it held for an
import only when every partition is staged, so they come after its rows.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import duckdb
import orjson

from pg2sink.changelog.records import Message, Modification, Record, Schema
from pg2sink.errors import SinkError
from pg2sink.logical.lsn import format_lsn
from pg2sink.sinks.duckdb.config import DuckDBConfig
from pg2sink.sinks.duckdb.imports import staged_files, unfinished_files
from pg2sink.sinks.duckdb.layout import Layout, quote
from pg2sink.sinks.duckdb.transaction import Transaction

log = logging.getLogger(__name__)

__all__ = ["STATE_KEY", "DuckDBSink"]

#: the `slot` of the file's pg2sink_state row when the stream does not tell its slot
#: (`use_slot`): a sink made outside the service
STATE_KEY = "pg2sink"

#: a batch this large is committed at the next checkpoint, after waiting for the one
#: being committed (memory stays bounded when the stream outruns DuckDB)
MAX_BATCH_RECORDS = 20_000

#: a PostgreSQL transaction holding this many records goes to DuckDB in chunks of this
#: size, in a DuckDB transaction left open until its commit (module docstring)
CHUNK_RECORDS = 5_000

#: DuckDB settings of the sink's connection (the file's readers have their own): a row
#: group of an open transaction is written to the file as soon as it is full (DuckDB's
#: default buffers five, 600,000 rows, before writing them)
MEMORY_SETTINGS = {"write_buffer_row_group_count": "1"}

#: pending_bytes' estimate of a record held in memory
RECORD_BYTES = 256

_INTERNAL = (
    "CREATE TABLE IF NOT EXISTS pg2sink_state "
    "(slot VARCHAR PRIMARY KEY, lsn BIGINT NOT NULL, position BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pg2sink_tables (namespace VARCHAR, name VARCHAR, "
    "layout JSON NOT NULL, PRIMARY KEY (namespace, name))",
    # the staged import files already loaded (deleted after their commit)
    "CREATE TABLE IF NOT EXISTS pg2sink_loaded (file VARCHAR PRIMARY KEY)",
)


class DuckDBSink:
    """The DuckDB sink; see the module docstring."""

    json_values = False

    def __init__(self, config: DuckDBConfig) -> None:
        self.path = config.duckdb_path
        self.slot = STATE_KEY
        self._con: duckdb.DuckDBPyConnection | None = None
        self._layouts: dict[tuple[str, str], Layout] = {}
        #: the last position given to a raw row, and the highest LSN the file holds
        self._position = 0
        self._stored = 0
        #: records of the open transaction; of the committed ones not yet handed over
        self._pending: list[Record] = []
        self._batch: list[Record] = []
        self._batch_lsn = 0
        #: the highest checkpoint taken into a batch (or already in the file)
        self._taken = 0
        self._acked: int | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg2sink-duckdb")
        self._in_flight: Future[int] | None = None
        self._in_flight_records = 0
        self._failed: SinkError | None = None
        #: the open transaction's last Modification's sequence (-1: none yet)
        self._sequence = -1
        #: the open transaction has chunks in the open DuckDB transaction; their Schema
        #: records (kept when the transaction starts again); the last chunk's write
        self._spilling = False
        self._spilled_schemas: list[Schema] = []
        self._chunk: Future[None] | None = None
        #: the open DuckDB transaction (the worker thread's alone)
        self._open: Transaction | None = None

    # --- the Sink protocol ---

    def use_slot(self, slot: str) -> None:
        """The stream's replication slot: the key of its row in pg2sink_state (UsesSlot)."""
        self.slot = slot

    def open(self) -> None:
        """Open (or create) the file, its internal tables, and read where it is."""
        try:
            con = duckdb.connect(self.path)
        except duckdb.Error as e:
            raise SinkError(f"cannot open --duckdb-path {self.path!r}: {_one_line(e)}") from None
        try:
            con.execute("SET TimeZone = 'UTC'")
            _limit_memory(con)
            for statement in _INTERNAL:
                con.execute(statement)
            # the LSN is the slot's; positions run over the whole file
            state = con.execute(
                "SELECT (SELECT lsn FROM pg2sink_state WHERE slot = ?), "
                "(SELECT coalesce(max(position), 0) FROM pg2sink_state)",
                [self.slot],
            ).fetchall()
            for (data,) in con.execute("SELECT layout FROM pg2sink_tables").fetchall():
                layout = Layout.from_json(orjson.loads(data))
                self._layouts[layout.namespace, layout.name] = layout
        except duckdb.Error as e:
            con.close()
            raise SinkError(f"cannot use --duckdb-path {self.path!r}: {_one_line(e)}") from None
        self._stored, self._position = int(state[0][0] or 0), int(state[0][1])
        self._con = con
        # a crash came before their removal; unfinished files belong to partitions that
        # were never marked done (their retry writes them again)
        _remove([*self._loaded(staged_files(self.path)), *unfinished_files(self.path)])
        self._taken = self._stored
        log.debug("duckdb sink writing to %s, from LSN %s", self.path, self._stored)

    def write(self, record: Record) -> None:
        """Hold the record with its transaction's (Messages are not stored); a chunk of a
        large transaction to DuckDB."""
        if record.__class__ is Message:
            return
        if isinstance(record, Modification):
            if record.sequence <= self._sequence:
                # the transaction starts again (a reconnect replays it): what was held of
                # it is dropped, its Schema records kept (the builder sends them once)
                schemas = [*self._spilled_schemas]
                self._drop_open()
                self._pending = [*schemas, *(r for r in self._pending if isinstance(r, Schema))]
            self._sequence = record.sequence
        self._pending.append(record)
        if len(self._pending) >= CHUNK_RECORDS:
            self._spill()

    def checkpoint(self, lsn: int) -> None:
        """The held records are a transaction committed at `lsn`: into the batch, unless
        the file (or a batch) already has it; a transaction written in chunks commits."""
        pending, self._pending = self._pending, []
        self._sequence = -1
        if self._spilling and lsn > self._taken:
            self._wait_chunk()
            self._spilling, self._spilled_schemas = False, []
            self._taken = lsn
            self._in_flight_records = len(pending)
            self._in_flight = self._worker.submit(self._commit, pending, lsn)
            return
        if lsn <= self._taken:
            self._drop_open()  # a transaction in chunks that the file holds already
            if lsn <= self._stored and (self._acked is None or lsn > self._acked):
                if self._acked is None:
                    log.info(
                        "transactions up to LSN %s are in %s already: skipped",
                        format_lsn(self._stored),
                        self.path,
                    )
                self._acked = lsn  # in the file before this process started
            return
        self._batch.extend(pending)
        self._batch_lsn = self._taken = lsn
        if len(self._batch) >= MAX_BATCH_RECORDS:
            # DuckDB is behind: wait for its commit and hand it this batch, so memory
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

    def close(self) -> None:
        """Commit what is checkpointed (unless a commit failed), close the file; a
        transaction begun in chunks and not committed in PostgreSQL's stream is dropped."""
        try:
            if self._con is not None and self._failed is None:
                self._drop_open()
                self.flush()
        finally:
            self._worker.shutdown(wait=True)
            if self._con is not None:
                self._con.close()
                self._con = None

    # --- commits ---

    def _collect(self) -> None:
        """Take the result of a finished background commit (raising its error)."""
        if self._failed is not None:
            raise self._failed
        done = self._in_flight
        if done is None or not done.done():
            return
        self._in_flight, self._in_flight_records = None, 0
        try:
            lsn = done.result()
        except SinkError as e:
            self._failed = e
            raise
        if self._acked is None or lsn > self._acked:
            self._acked = lsn

    def _wait(self) -> None:
        """Wait for the background commit, if any, and take its result."""
        if self._in_flight is not None:
            self._in_flight.exception()
        self._collect()

    def _spill(self) -> None:
        """The held records of the open transaction into the open DuckDB transaction, on
        the worker thread; the batch before it is committed first, so a rollback of the
        open one takes nothing else along. One chunk is written while the next is held."""
        if not self._spilling:
            self.flush()
            self._spilling = True
        self._wait_chunk()
        chunk, self._pending = self._pending, []
        self._spilled_schemas.extend(r for r in chunk if isinstance(r, Schema))
        self._chunk = self._worker.submit(self._write, chunk)

    def _wait_chunk(self) -> None:
        """Wait for the chunk being written (its error is the sink's from then on)."""
        chunk, self._chunk = self._chunk, None
        if chunk is None:
            return
        try:
            chunk.result()
        except SinkError as e:
            self._failed = e
            raise

    def _drop_open(self) -> None:
        """Roll the open DuckDB transaction of chunks back, if there is one."""
        if not self._spilling:
            return
        self._wait_chunk()
        self._spilling, self._spilled_schemas = False, []
        self._worker.submit(self._abort).result()

    # --- on the worker thread ---

    def _commit(self, records: Sequence[Record], lsn: int) -> int:
        """The records (after the chunks before them, if any) and `lsn` as the state, in
        one DuckDB transaction, committed."""
        self._write(records)
        writer = self._open
        assert writer is not None and self._con is not None
        try:
            self._con.execute(
                "INSERT OR REPLACE INTO pg2sink_state VALUES (?, ?, ?)",
                [self.slot, lsn, writer.position],
            )
            self._con.execute("COMMIT")
        except duckdb.Error as e:
            self._abort()
            raise SinkError(f"cannot write to {self.path!r}: {_one_line(e)}") from None
        self._open = None
        self._layouts, self._position, self._stored = writer.layouts, writer.position, lsn
        _remove(writer.staged)
        return lsn

    def _write(self, records: Sequence[Record]) -> None:
        """The records' DDL and rows into the open DuckDB transaction, begun (the staged
        import files loaded first) when there is none; rolled back on an error."""
        con = self._con
        if con is None:
            raise SinkError("the duckdb sink was not opened")
        try:
            writer = self._open
            if writer is None:
                writer = Transaction(con, dict(self._layouts), self._position)
                staged = staged_files(self.path)
                loaded = self._loaded(staged)
                con.execute("BEGIN TRANSACTION")
                self._open = writer
                for file in staged:
                    if file not in loaded:
                        writer.load(file)
                writer.staged = staged
            for record in records:
                writer.add(record)
            writer.finish()
        except (duckdb.Error, SinkError) as e:
            self._abort()
            if isinstance(e, SinkError):
                raise
            raise SinkError(f"cannot write to {self.path!r}: {_one_line(e)}") from None

    def _abort(self) -> None:
        """Roll the open DuckDB transaction back (if any): nothing of it is in the file."""
        self._open = None
        if self._con is not None:
            _rollback(self._con)

    def _loaded(self, files: Sequence[str]) -> set[str]:
        """Those of the staged `files` that the database holds already."""
        if not files or self._con is None:
            return set()
        rows = self._con.execute("SELECT file FROM pg2sink_loaded").fetchall()
        names = {name for (name,) in rows}
        return {f for f in files if os.path.basename(f) in names}


def _limit_memory(con: duckdb.DuckDBPyConnection) -> None:
    """The writer's DuckDB settings that bound its memory (MEMORY_SETTINGS), those this
    DuckDB version has."""
    names = {name for (name,) in con.execute("SELECT name FROM duckdb_settings()").fetchall()}
    for name, value in MEMORY_SETTINGS.items():
        if name in names:
            # SET takes no parameters: the name quoted, the value as a string literal
            con.execute("SET " + quote(name) + " = '" + value.replace("'", "''") + "'")


def _remove(files: Iterable[str]) -> None:
    """Delete loaded staged files (one already gone is fine)."""
    for file in files:
        with contextlib.suppress(FileNotFoundError):
            os.remove(file)


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll the open transaction back, if there is one."""
    with contextlib.suppress(duckdb.Error):  # no transaction open (BEGIN failed)
        con.execute("ROLLBACK")


def _one_line(e: BaseException) -> str:
    """An error's message on one line."""
    return " ".join(str(e).split())
