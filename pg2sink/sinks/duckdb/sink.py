"""The DuckDB sink: every table's changes in an embedded DuckDB file, exactly once.

Records are held per transaction until its checkpoint (the commit's end LSN), then join
the batch; `start_flush()` hands the batch to a background thread (sinks/warehouse/commits.py,
BackgroundCommits), which writes it in one DuckDB transaction together with its last
checkpoint in `pg2sink_state` (transaction.py): the Schema records become raw table DDL
and views (layout.py), the Modifications rows of the raw tables (values.py), numbered by
`_pg2sink_position` in the order they came. `acknowledged()` is the LSN of the last
committed transaction, so PostgreSQL is never told of a change DuckDB does not hold.

The fence: `pg2sink_state.position` is the last raw row of a committed transaction. A
PostgreSQL transaction of CHUNK_RECORDS records is not held whole: the batch before it is
committed first, then its records go to DuckDB a chunk at a time, in DuckDB transactions
committed every COMMIT_ROWS rows (DuckDB holds memory per row of an open transaction until
its commit), beyond the fence. The views leave rows beyond the fence out (layout.py), and
the transaction's checkpoint moves the fence past them together with the state's LSN.
When the transaction starts again (a reconnect), turns out to be in the file already, or
the sink closes before its commit, its rows are deleted; so are those a crash left,
when the file is opened again. Positions, not LSNs, mark them: a transaction's changes
may have LSNs below an earlier-committed transaction's commit (interleaved
transactions), but its positions are above every committed row's.

Exactly once: at open the sink reads the LSN stored in the file. The stream restarts at
the slot's confirmed position, which may be before it (a crash between DuckDB's commit
and the confirmation): a transaction whose checkpoint is at or below the stored LSN is
already in the file and is dropped whole. The same holds after a reconnect within one
process (a transaction torn by the lost connection is dropped when it starts again).

Imports: executors stage Parquet files next to the database (imports.py); a DuckDB
transaction that follows a committed one (a batch, a large transaction's first chunk)
loads the staged files first, inside the fence, records them in `pg2sink_loaded` in the
same transaction and deletes them once committed. The import gate releases the changes
it held for an import only when every partition is staged, so they come after its rows.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import Callable, Iterable, Sequence

import duckdb
import orjson

from pg2sink.changelog.records import Record
from pg2sink.errors import SinkError
from pg2sink.sinks.duckdb.config import DuckDBConfig
from pg2sink.sinks.duckdb.imports import staged_files, unfinished_files
from pg2sink.sinks.duckdb.transaction import Transaction
from pg2sink.sinks.warehouse.commits import RECORD_BYTES, BackgroundCommits
from pg2sink.sinks.warehouse.layout import FENCE, POSITION, Layout, quote
from pg2sink.sinks.warehouse.values import without_pandas

log = logging.getLogger(__name__)

__all__ = ["RECORD_BYTES", "STATE_KEY", "DuckDBSink"]

#: the `slot` of the file's pg2sink_state row when the stream does not tell its slot
#: (`use_slot`): a sink made outside the service
STATE_KEY = "pg2sink"

#: a batch this large is committed at the next checkpoint, after waiting for the one
#: being committed: memory holds two batches at most when the stream outruns DuckDB
MAX_BATCH_RECORDS = 5_000

#: a PostgreSQL transaction holding this many records goes to DuckDB in chunks of this
#: size, each committed beyond the fence (module docstring)
CHUNK_RECORDS = 5_000

#: the chunks' DuckDB transaction commits once it holds this many rows (four chunks):
#: DuckDB keeps memory per row of an open transaction until its commit, and each commit
#: syncs its WAL: a commit per chunk takes more memory and time than this
#: (`make bench-stream ARGS="--sink duckdb"`)
COMMIT_ROWS = 20_000

#: DuckDB settings of the sink's connection (the file's readers have their own): a row
#: group of a transaction is written to the file as soon as it is full (DuckDB's
#: default buffers five, 600,000 rows, before writing them); one thread: a batch of a few
#: thousand rows gains nothing from DuckDB's parallel operators, which cost CPU to
#: coordinate, and the cores are the stream's and PostgreSQL's walsender's too
#: (`make bench-stream ARGS="--sink duckdb"`)
SETTINGS = {"write_buffer_row_group_count": "1", "threads": "1"}

#: the cyclic garbage collector's first threshold while the sink is open (Python's default
#: is 700): the records held in batches and chunks outlive young collections, so each
#: collection went through thousands of live records and moved them to the older
#: generations, whose full collections then went through them again (`make bench-stream
#: ARGS="--sink duckdb"`); records hold no reference cycles, reference counting frees them
GC_THRESHOLD = 20_000

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

    #: BackgroundCommits' own write and checkpoint, bound at init: the stream calls them
    #: per change and per transaction, with no call of this class's in between
    write: Callable[[Record], None]
    checkpoint: Callable[[int], None]

    def __init__(self, config: DuckDBConfig) -> None:
        self.path = config.duckdb_path
        self.slot = STATE_KEY
        self._con: duckdb.DuckDBPyConnection | None = None
        self._layouts: dict[tuple[str, str], Layout] = {}
        #: the table and view names of the file as of the last commit (Transaction.taken)
        self._taken: set[str] | None = None
        #: the last position of a committed transaction's raw row (the fence)
        self._position = 0
        #: the transaction written in chunks, committed up to its last chunk (its layouts
        #: and next position; the worker thread's alone)
        self._open: Transaction | None = None
        #: a DuckDB transaction is open: the position before its first row
        self._begun: int | None = None
        #: DuckDB's threads: its default (staged files load with them), the stream's
        #: (SETTINGS), the number set now
        self._threads_default = self._threads_stream = self._threads_now = 1
        #: the garbage collector's thresholds before open() (GC_THRESHOLD)
        self._gc_threshold: tuple[int, ...] | None = None
        self._commits = BackgroundCommits(
            self._commit,
            "pg2sink-duckdb",
            MAX_BATCH_RECORDS,
            chunks=self,
            chunk_records=CHUNK_RECORDS,
            where=self.path,
        )
        self.write = self._commits.write
        self.checkpoint = self._commits.checkpoint

    # --- the Sink protocol ---

    def use_slot(self, slot: str) -> None:
        """The stream's replication slot: the key of its row in pg2sink_state (UsesSlot)."""
        self.slot = slot

    def open(self) -> None:
        """Open (or create) the file, its internal tables, and read where it is; the rows
        of a transaction a crash left unfinished are removed."""
        try:
            con = duckdb.connect(self.path)
        except duckdb.Error as e:
            raise SinkError(f"cannot open --duckdb-path {self.path!r}: {_one_line(e)}") from None
        try:
            con.execute("SET TimeZone = 'UTC'")
            self._threads_default = _threads(con)
            _configure(con)
            self._threads_stream = self._threads_now = _threads(con)
            for statement in _INTERNAL:
                con.execute(statement)
            # the LSN is the slot's; positions run over the whole file
            state = con.execute(
                f"SELECT (SELECT lsn FROM pg2sink_state WHERE slot = ?), ({FENCE})",
                [self.slot],
            ).fetchall()
            for (data,) in con.execute("SELECT layout FROM pg2sink_tables").fetchall():
                layout = Layout.from_json(orjson.loads(data))
                self._layouts[layout.namespace, layout.name] = layout
            stored, self._position = int(state[0][0] or 0), int(state[0][1])
            self._con = con
            self._delete_unfinished()
        except duckdb.Error as e:
            self._con = None
            con.close()
            raise SinkError(f"cannot use --duckdb-path {self.path!r}: {_one_line(e)}") from None
        # a crash came before their removal; unfinished files belong to partitions that
        # were never marked done (their retry writes them again)
        _remove([*self._loaded(staged_files(self.path)), *unfinished_files(self.path)])
        self._commits.start(stored)
        without_pandas()
        self._gc_threshold = gc.get_threshold()
        if self._gc_threshold[0] < GC_THRESHOLD:
            gc.set_threshold(GC_THRESHOLD, *self._gc_threshold[1:])
        log.debug("duckdb sink writing to %s, from LSN %s", self.path, stored)

    # held, batched and committed in the background (sinks/warehouse/commits.py)
    def start_flush(self) -> None:
        self._commits.start_flush()

    def flush(self) -> int | None:
        return self._commits.flush()

    def acknowledged(self) -> int | None:
        return self._commits.acknowledged()

    def pending_bytes(self) -> int:
        return self._commits.pending_bytes()

    def close(self) -> None:
        """Commit what is checkpointed (unless a commit failed), close the file; a
        transaction begun in chunks and not committed in PostgreSQL's stream is dropped."""
        try:
            if self._con is not None and self._commits.failed is None:
                self._commits.drop_chunks()
                self._commits.flush()
        finally:
            self._commits.stop()
            if self._con is not None:
                self._con.close()
                self._con = None
            if self._gc_threshold is not None:
                gc.set_threshold(*self._gc_threshold)
                self._gc_threshold = None

    # --- on the worker thread ---

    def _commit(self, records: Sequence[Record], lsn: int) -> int:
        """The records (after the chunks before them, if any) and `lsn` with the position
        of their last row as the state, in one DuckDB transaction: committed, the fence
        moves past the chunks too."""
        writer = self._write(records, lambda w: self._set_state(lsn, w.position))
        self._open = None
        self._layouts, self._position, self._commits.stored = writer.layouts, writer.position, lsn
        self._taken = writer.taken
        _remove(writer.staged)
        return lsn

    def write_chunk(self, records: Sequence[Record]) -> None:
        """A chunk of a large transaction beyond the fence (Chunks): the views leave its
        rows out until the transaction's commit moves the fence past them. Its DuckDB
        transaction commits once it holds COMMIT_ROWS rows."""
        writer = self._write(records, None)
        self._open = writer
        if self._begun is None:  # committed: its DDL and loaded staged files with it
            self._layouts, self._position = dict(writer.layouts), writer.fence
            self._taken = None if writer.taken is None else set(writer.taken)
            _remove(writer.staged)
            writer.staged = []

    def drop_chunks(self) -> None:
        """Delete the chunks of the open transaction (Chunks)."""
        self._open = None
        try:
            self._delete_unfinished()
        except duckdb.Error as e:
            raise SinkError(f"cannot write to {self.path!r}: {_one_line(e)}") from None

    def _write(
        self, records: Sequence[Record], finish: Callable[[Transaction], None] | None
    ) -> Transaction:
        """The records' DDL and rows in a DuckDB transaction, after the chunks of the
        open transaction, if any, else after the staged import files (loaded first,
        inside the fence: `writer.fence`). With `finish` (a checkpoint), `finish` and a
        commit follow; a chunk commits at COMMIT_ROWS rows. Rolled back on an error."""
        con = self._con
        if con is None:
            raise SinkError("the duckdb sink was not opened")
        writer = self._open
        try:
            if self._begun is None:
                con.execute("BEGIN TRANSACTION")
                self._begun = self._position if writer is None else writer.position
            if writer is None:
                taken = None if self._taken is None else set(self._taken)
                writer = Transaction(con, dict(self._layouts), self._position, taken)
                self._load_staged(writer)
                if writer.staged and finish is None:
                    self._set_state(self._commits.stored, writer.fence)
            writer.add(records)
            writer.finish()
            if finish is not None:
                finish(writer)
            if finish is not None or writer.position - self._begun >= COMMIT_ROWS:
                con.execute("COMMIT")
                self._begun = None
            self._set_threads(self._threads_stream)
        except (duckdb.Error, SinkError) as e:
            self._rollback()
            if isinstance(e, SinkError):
                raise
            raise SinkError(f"cannot write to {self.path!r}: {_one_line(e)}") from None
        return writer

    def _rollback(self) -> None:
        """Roll the open DuckDB transaction back, if there is one."""
        if self._begun is not None and self._con is not None:
            self._begun = None
            _rollback(self._con)

    def _load_staged(self, writer: Transaction) -> None:
        """The staged import files not loaded yet into the raw tables (imports.py), at
        the start of a transaction: complete rows, so the fence may include them."""
        staged = staged_files(self.path)
        loaded = self._loaded(staged)
        fresh = [file for file in staged if file not in loaded]
        if fresh:  # an import's rows: DuckDB's own threads read and compress them
            self._set_threads(self._threads_default)
        for file in fresh:
            writer.load(file)
        writer.staged = staged
        writer.fence = writer.position

    def _set_threads(self, threads: int) -> None:
        """DuckDB's threads for the statements from now on."""
        assert self._con is not None
        if threads != self._threads_now:
            self._con.execute("SET threads = ?", [threads])
            self._threads_now = threads

    def _set_state(self, lsn: int, position: int) -> None:
        """The slot's state row: `lsn` committed, raw rows up to `position` complete."""
        assert self._con is not None
        self._con.execute(
            "INSERT OR REPLACE INTO pg2sink_state VALUES (?, ?, ?)", [self.slot, lsn, position]
        )

    def _delete_unfinished(self) -> None:
        """Delete the raw rows beyond the fence: a transaction whose chunks were committed
        and which never was (the stream sends it again from its start)."""
        assert self._con is not None
        self._rollback()  # chunks not committed yet
        removed = 0
        self._con.execute("BEGIN TRANSACTION")
        try:
            for layout in self._layouts.values():
                ((count,),) = self._con.execute(
                    f"DELETE FROM {quote(layout.raw)} WHERE {POSITION} > ?", [self._position]
                ).fetchall()
                removed += int(count)
            self._con.execute("COMMIT")
        except duckdb.Error:
            _rollback(self._con)
            raise
        if removed:
            log.info("%s rows of a transaction not committed removed from %s", removed, self.path)

    def _loaded(self, files: Sequence[str]) -> set[str]:
        """Those of the staged `files` that the database holds already."""
        if not files or self._con is None:
            return set()
        rows = self._con.execute("SELECT file FROM pg2sink_loaded").fetchall()
        names = {name for (name,) in rows}
        return {f for f in files if os.path.basename(f) in names}


def _configure(con: duckdb.DuckDBPyConnection) -> None:
    """The writer's DuckDB settings (SETTINGS), those this DuckDB version has."""
    names = {name for (name,) in con.execute("SELECT name FROM duckdb_settings()").fetchall()}
    for name, value in SETTINGS.items():
        if name in names:
            # SET takes no parameters: the name quoted, the value as a string literal
            con.execute("SET " + quote(name) + " = '" + value.replace("'", "''") + "'")


def _threads(con: duckdb.DuckDBPyConnection) -> int:
    """The connection's number of threads."""
    ((threads,),) = con.execute("SELECT current_setting('threads')").fetchall()
    return int(threads)


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
