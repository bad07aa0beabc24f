"""The DuckDB sink: every table's changes in an embedded DuckDB file, exactly once.

Records are held per transaction until its checkpoint (the commit's end LSN), then join
the batch. `start_flush()` hands the batch to a background thread, which writes it in
one DuckDB transaction together with its last checkpoint in `pg2sink_state`: the
Schema records become raw table DDL and views (layout.py), the Modifications rows of the
raw tables (values.py), numbered by `_pg2sink_position` in the order they came.
`acknowledged()` is the LSN of the last committed transaction, so PostgreSQL is never
told of a change DuckDB does not hold.

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
from pg2sink.sinks.duckdb.imports import schema_of, staged_files, unfinished_files
from pg2sink.sinks.duckdb.layout import (
    META,
    OPERATION,
    POSITION,
    Layout,
    evolve,
    new_layout,
    quote,
    raw_columns,
)
from pg2sink.sinks.duckdb.missing import missing_texts
from pg2sink.sinks.duckdb.toast import Toast
from pg2sink.sinks.duckdb.values import arrow_batch

log = logging.getLogger(__name__)

__all__ = ["STATE_KEY", "DuckDBSink"]

#: the `slot` of the file's pg2sink_state row when the stream does not tell its slot
#: (`use_slot`): a sink made outside the service
STATE_KEY = "pg2sink"

#: a batch this large is committed at the next checkpoint, after waiting for the one
#: being committed (memory stays bounded when the stream outruns DuckDB)
MAX_BATCH_RECORDS = 20_000

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
        """Hold the record with its transaction's (Messages are not stored)."""
        if record.__class__ is Message:
            return
        if isinstance(record, Modification) and self._pending:
            last = self._pending[-1]
            if isinstance(last, Modification) and record.sequence <= last.sequence:
                # the transaction starts again (a reconnect replays it): what was held of
                # it is dropped, its Schema records kept (the builder sends them once)
                self._pending = [r for r in self._pending if isinstance(r, Schema)]
        self._pending.append(record)

    def checkpoint(self, lsn: int) -> None:
        """The held records are a transaction committed at `lsn`: into the batch, unless
        the file (or a batch) already has it."""
        pending, self._pending = self._pending, []
        if lsn <= self._taken:
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
        """Commit what is checkpointed (unless a commit failed), close the file."""
        try:
            if self._con is not None and self._failed is None:
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

    def _commit(self, records: Sequence[Record], lsn: int) -> int:
        """One DuckDB transaction: the records' DDL and rows, and `lsn` as the state."""
        con = self._con
        if con is None:
            raise SinkError("the duckdb sink was not opened")
        writer = _Transaction(con, dict(self._layouts), self._position)
        staged = staged_files(self.path)
        try:
            loaded = self._loaded(staged)
            con.execute("BEGIN TRANSACTION")
            for file in staged:
                if file not in loaded:
                    writer.load(file)
            for record in records:
                writer.add(record)
            writer.finish()
            con.execute(
                "INSERT OR REPLACE INTO pg2sink_state VALUES (?, ?, ?)",
                [self.slot, lsn, writer.position],
            )
            con.execute("COMMIT")
        except (duckdb.Error, SinkError) as e:
            _rollback(con)
            if isinstance(e, SinkError):
                raise
            raise SinkError(f"cannot write to {self.path!r}: {_one_line(e)}") from None
        self._layouts, self._position, self._stored = writer.layouts, writer.position, lsn
        _remove(staged)
        return lsn

    def _loaded(self, files: Sequence[str]) -> set[str]:
        """Those of the staged `files` that the database holds already."""
        if not files or self._con is None:
            return set()
        rows = self._con.execute("SELECT file FROM pg2sink_loaded").fetchall()
        names = {name for (name,) in rows}
        return {f for f in files if os.path.basename(f) in names}


class _Transaction:
    """What one commit writes: DDL for Schema records, rows per table in order."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, layouts: dict[tuple[str, str], Layout], position: int
    ) -> None:
        self.con = con
        self.layouts = layouts
        self.position = position
        self._rows: dict[tuple[str, str], list[tuple[int, Modification]]] = {}

    def add(self, record: Record) -> None:
        """A Schema record's DDL now (after the table's rows before it); a row queued."""
        if isinstance(record, Schema):
            table = (record.namespace, record.name)
            self._insert(table)
            self._apply(record)
        elif isinstance(record, Modification):
            table = (record.namespace, record.name)
            if table not in self.layouts:
                raise SinkError(f"a change of {record.namespace}.{record.name} before its Schema")
            self.position += 1
            self._rows.setdefault(table, []).append((self.position, record))

    def finish(self) -> None:
        """Insert every table's queued rows."""
        for table in list(self._rows):
            self._insert(table)

    def load(self, file: str) -> None:
        """A staged import file's rows into its table's raw table (imports.py), after the
        rows queued so far. A row whose key has an IMPORT row of the same or a newer
        snapshot already is not loaded: a partition staged twice (its executor died
        before marking it done), or a file of an abandoned attempt renamed late."""
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        schema, staged = schema_of(pq.read_schema(file).metadata)
        table = (schema.namespace, schema.name)
        layout = self.layouts.get(table)
        known = set() if layout is None else {c.column for c in layout.live()}
        if not {c.column for c in staged.live()} <= known:
            self._insert(table)
            self._apply(schema, keep=known)
        layout = self.layouts[table]
        by_column = {c.column: c for c in layout.columns}
        meta = [n for n, _ in META if n != POSITION]
        targets = [*meta, *(by_column[c.column].raw for c in staged.live())]
        sources = [*meta, *(c.raw for c in staged.live())]
        raw = quote(layout.raw)
        query = (
            f"INSERT INTO {raw} ({quote(POSITION)}, {', '.join(quote(t) for t in targets)}) "
            f"SELECT ? + row_number() OVER (), {', '.join(f's.{quote(c)}' for c in sources)} "
            "FROM read_parquet(?) AS s"
        )
        staged_by_column = {c.column: c for c in staged.live()}
        if layout.primary_key and staged.primary_key == layout.primary_key:
            same = " AND ".join(
                f"r.{quote(by_column[k].raw)} = s.{quote(staged_by_column[k].raw)}"
                for k in layout.primary_key
            )
            query += (
                f" WHERE NOT EXISTS (SELECT 1 FROM {raw} AS r WHERE r.{OPERATION} = 'IMPORT' "
                f"AND r._pg2sink_lsn >= s._pg2sink_lsn AND {same})"
            )
        ((count,),) = self.con.execute(query, [self.position, file]).fetchall()
        self.position += int(count)
        self.con.execute("INSERT INTO pg2sink_loaded VALUES (?)", [os.path.basename(file)])

    def _apply(self, schema: Schema, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Create or evolve the table's raw table and view; keep its Layout."""
        table = (schema.namespace, schema.name)
        layout = self.layouts.get(table)
        ddl: list[str] = []
        if layout is None:
            layout, ddl = new_layout(schema, self._taken_names())
        missing = missing_texts(self.con, schema)
        layout, more = evolve(layout, schema, keep, position=self.position, missing=missing)
        for statement in (*ddl, *more):
            self.con.execute(statement)
        if ddl or more:
            self.con.execute(
                "INSERT OR REPLACE INTO pg2sink_tables VALUES (?, ?, ?)",
                [schema.namespace, schema.name, orjson.dumps(layout.to_json()).decode()],
            )
        self.layouts[table] = layout

    def _taken_names(self) -> set[str]:
        """Every table and view name in the database, lower-cased."""
        rows = self.con.execute("SELECT table_name FROM information_schema.tables").fetchall()
        taken = {str(name).lower() for (name,) in rows}
        for layout in self.layouts.values():
            taken.update((layout.raw.lower(), layout.view.lower()))
        return taken

    def _insert(self, table: tuple[str, str]) -> None:
        """The queued rows of `table` into its raw table, unchanged TOAST filled in."""
        rows = self._rows.pop(table, None)
        if not rows:
            return
        layout = self.layouts[table]
        rows, unchanged = Toast(self.con, layout).fill(rows)
        batch = arrow_batch(layout, rows, unchanged)
        names = ", ".join(quote(n) for n in raw_columns(layout))
        self.con.register("_pg2sink_batch", batch)
        try:
            self.con.execute(
                f"INSERT INTO {quote(layout.raw)} ({names}) SELECT {names} FROM _pg2sink_batch"
            )
        finally:
            self.con.unregister("_pg2sink_batch")


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
