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
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import duckdb
import orjson

from pg2sink.changelog.pgvalues import PgText
from pg2sink.changelog.records import Message, Modification, Operation, Record, Schema
from pg2sink.errors import SinkError
from pg2sink.logical.lsn import format_lsn
from pg2sink.logical.messages import UNCHANGED_TOAST
from pg2sink.sinks.duckdb.config import DuckDBConfig
from pg2sink.sinks.duckdb.layout import (
    OPERATION,
    POSITION,
    Column,
    Layout,
    evolve,
    new_layout,
    quote,
    raw_columns,
)
from pg2sink.sinks.duckdb.values import arrow_batch

log = logging.getLogger(__name__)

__all__ = ["STATE_KEY", "DuckDBSink"]

#: the `slot` of the file's pg2sink_state row: sinks are not told the stream's slot, so a
#: file belongs to one stream (docs/sinks/duckdb.md)
STATE_KEY = "pg2sink"

#: pending_bytes' estimate of a record held in memory
RECORD_BYTES = 256

_INTERNAL = (
    "CREATE TABLE IF NOT EXISTS pg2sink_state "
    "(slot VARCHAR PRIMARY KEY, lsn BIGINT NOT NULL, position BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pg2sink_tables (namespace VARCHAR, name VARCHAR, "
    "layout JSON NOT NULL, PRIMARY KEY (namespace, name))",
)


class DuckDBSink:
    """The DuckDB sink; see the module docstring."""

    json_values = False

    def __init__(self, config: DuckDBConfig) -> None:
        self.path = config.duckdb_path
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
            state = con.execute(
                "SELECT lsn, position FROM pg2sink_state WHERE slot = ?", [STATE_KEY]
            ).fetchall()
            for (data,) in con.execute("SELECT layout FROM pg2sink_tables").fetchall():
                layout = Layout.from_json(orjson.loads(data))
                self._layouts[layout.namespace, layout.name] = layout
        except duckdb.Error as e:
            con.close()
            raise SinkError(f"cannot use --duckdb-path {self.path!r}: {_one_line(e)}") from None
        if state:
            self._stored, self._position = int(state[0][0]), int(state[0][1])
        self._taken = self._stored
        self._con = con
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
        try:
            con.execute("BEGIN TRANSACTION")
            for record in records:
                writer.add(record)
            writer.finish()
            con.execute(
                "INSERT OR REPLACE INTO pg2sink_state VALUES (?, ?, ?)",
                [STATE_KEY, lsn, writer.position],
            )
            con.execute("COMMIT")
        except (duckdb.Error, SinkError) as e:
            _rollback(con)
            if isinstance(e, SinkError):
                raise
            raise SinkError(f"cannot write to {self.path!r}: {_one_line(e)}") from None
        self._layouts, self._position, self._stored = writer.layouts, writer.position, lsn
        return lsn


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

    def _apply(self, schema: Schema) -> None:
        """Create or evolve the table's raw table and view; keep its Layout."""
        table = (schema.namespace, schema.name)
        layout = self.layouts.get(table)
        ddl: list[str] = []
        if layout is None:
            layout, ddl = new_layout(schema, self._taken_names())
        layout, more = evolve(layout, schema)
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
        rows, unchanged = _Toast(self.con, layout).fill(rows)
        batch = arrow_batch(layout, rows, unchanged)
        names = ", ".join(quote(n) for n in raw_columns(layout))
        self.con.register("_pg2sink_batch", batch)
        try:
            self.con.execute(
                f"INSERT INTO {quote(layout.raw)} ({names}) SELECT {names} FROM _pg2sink_batch"
            )
        finally:
            self.con.unregister("_pg2sink_batch")


class _Toast:
    """Fills unchanged TOASTed values (UNCHANGED_TOAST) from the key's previous row: an
    earlier row of the same batch, else the raw table's last row of the key. For a
    key-changing UPDATE the previous row is the old key's."""

    def __init__(self, con: duckdb.DuckDBPyConnection, layout: Layout) -> None:
        self.con = con
        self.layout = layout
        self.keys = [c.column for c in layout.key_columns()]

    def fill(
        self, rows: list[tuple[int, Modification]]
    ) -> tuple[list[tuple[int, Modification]], list[list[str] | None]]:
        """The rows with their values filled in, and per row the filled columns."""
        unchanged: list[list[str] | None] = [None] * len(rows)
        if not any(_unchanged(m.after) for _, m in rows):
            return rows, unchanged
        latest: dict[tuple[object, ...], dict[str, object] | None] = {}
        out: list[tuple[int, Modification]] = []
        for i, (position, m) in enumerate(rows):
            if m.operation is Operation.TRUNCATE:
                latest.clear()
                latest[()] = None  # nothing from before the TRUNCATE
            elif m.after is None:
                latest[self._key(m.before)] = None
            else:
                columns = _unchanged(m.after)
                if columns:
                    source = m.before if m.before and self._has_key(m.before) else m.after
                    previous = self._previous(self._key(source), latest)
                    after = {
                        c: (previous or {}).get(c) if v is UNCHANGED_TOAST else v
                        for c, v in m.after.items()
                    }
                    m = dataclasses.replace(m, after=after)
                    unchanged[i] = columns
                latest[self._key(m.after)] = m.after
            out.append((position, m))
        return out, unchanged

    def _has_key(self, values: dict[str, object]) -> bool:
        return bool(self.keys) and all(values.get(k) is not None for k in self.keys)

    def _key(self, values: dict[str, object] | None) -> tuple[object, ...]:
        return tuple((values or {}).get(k) for k in self.keys)

    def _previous(
        self, key: tuple[object, ...], latest: dict[tuple[object, ...], dict[str, object] | None]
    ) -> dict[str, object] | None:
        """The key's row before this one: in the batch, else the raw table's."""
        if key in latest:
            return latest[key]
        if () in latest or not self.keys:  # truncated in this batch, or no key to look by
            return None
        return self._stored_row(key)

    def _stored_row(self, key: tuple[object, ...]) -> dict[str, object] | None:
        """The key's last INSERT/UPDATE/IMPORT row since the last TRUNCATE, values as the
        stream gives them (PostgreSQL's text as PgText where the column has NULL)."""
        layout = self.layout
        live: list[Column] = layout.live()
        raw = quote(layout.raw)
        where = " AND ".join(f"{quote(c.raw)} = ?" for c in layout.key_columns())
        query = (
            f"SELECT _pg2sink_text, {', '.join(quote(c.raw) for c in live)} FROM {raw} "
            f"WHERE {OPERATION} IN ('INSERT', 'UPDATE', 'IMPORT') AND {where} AND {POSITION} > "
            f"coalesce((SELECT max({POSITION}) FROM {raw} WHERE {OPERATION} = 'TRUNCATE'), -1) "
            f"ORDER BY {POSITION} DESC LIMIT 1"
        )
        # fetchall: DuckDB wants a result read to its end before the next statement
        found = self.con.execute(query, [_param(v) for v in key]).fetchall()
        if not found:
            return None
        row = found[0]
        texts: dict[str, str] = row[0] or {}
        values = {}
        for c, value in zip(live, row[1:], strict=True):
            text = texts.get(c.column)
            values[c.column] = PgText(text) if text is not None else _stream_value(value)
        return values


def _unchanged(after: dict[str, object] | None) -> list[str]:
    """The columns of `after` holding UNCHANGED_TOAST."""
    if after is None:
        return []
    return [c for c, v in after.items() if v is UNCHANGED_TOAST]


def _stream_value(value: Any) -> object:
    """A value read back from DuckDB as the stream has it (a UUID is its text)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [_stream_value(v) for v in value]
    return value


def _param(value: object) -> object:
    """A key value as a query parameter."""
    return str(value) if isinstance(value, PgText) else value


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll the open transaction back, if there is one."""
    with contextlib.suppress(duckdb.Error):  # no transaction open (BEGIN failed)
        con.execute("ROLLBACK")


def _one_line(e: BaseException) -> str:
    """An error's message on one line."""
    return " ".join(str(e).split())
