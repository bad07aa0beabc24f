"""What one DuckDB transaction of the sink writes (sink.py runs it on its thread).

A `Transaction` turns records into statements on the sink's connection, inside a
DuckDB transaction the sink began: a Schema record's DDL (layout.py) after the rows of its
table queued before it, Modifications queued per table and inserted through Arrow
(values.py, unchanged TOAST filled by toast.py) at `finish()`, staged import files loaded
(imports.py). The sink may call `add` and `finish` several times in one transaction (a
large PostgreSQL transaction is written in chunks); `position` numbers the raw rows on.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import duckdb
import orjson

from pg2sink.changelog.records import Modification, Record, Schema
from pg2sink.errors import SinkError
from pg2sink.sinks.duckdb.missing import missing_texts
from pg2sink.sinks.warehouse.layout import (
    META,
    OPERATION,
    POSITION,
    Layout,
    evolve,
    new_layout,
    quote,
    raw_columns,
)
from pg2sink.sinks.warehouse.staging import schema_of
from pg2sink.sinks.warehouse.toast import Toast
from pg2sink.sinks.warehouse.values import UnfilledError, arrow_batch, arrow_rows, json_marked

__all__ = ["Transaction"]


class Transaction:
    """What one commit writes: DDL for Schema records, rows per table in order."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        layouts: dict[tuple[str, str], Layout],
        position: int,
        taken: set[str] | None = None,
    ) -> None:
        self.con = con
        self.layouts = layouts
        #: every table and view name in the database, lower-cased: read once (None: not
        #: yet), then kept as new layouts take names; the sink hands it to the next
        #: transaction, as no other connection writes the file. Reading the catalog for
        #: each new table made 10,000 new tables quadratic (`make bench-tables ARGS="--sink
        #: duckdb"`)
        self.taken = taken
        self.position = position
        #: the staged import files loaded (deleted once the transaction committed)
        self.staged: list[str] = []
        #: the position after the staged files' rows (the rows before the records')
        self.fence = position
        #: per table, the queued rows' positions and Modifications
        self._rows: dict[tuple[str, str], tuple[list[int], list[Modification]]] = {}
        #: the tables whose layout changed since the last `finish()`: their pg2sink_tables
        #: rows are written there in one statement, as DuckDB's INSERT OR REPLACE costs
        #: about as much for one row as for thousands (`make bench-tables ARGS="--sink
        #: duckdb"`)
        self._changed: set[tuple[str, str]] = set()

    def add(self, records: Iterable[Record]) -> None:
        """Each Schema record's DDL when it comes (after its table's rows before it); the
        rows queued, numbered on from `position`."""
        position = self.position
        namespace = name = ""
        positions: list[int] | None = None  # the lists of the last row's table
        rows: list[Modification] = []
        for record in records:
            if isinstance(record, Modification):
                if positions is None or record.name != name or record.namespace != namespace:
                    namespace, name = table = record.namespace, record.name
                    if table not in self.layouts:
                        raise SinkError(f"a change of {namespace}.{name} before its Schema")
                    positions, rows = self._rows.setdefault(table, ([], []))
                position += 1
                positions.append(position)
                rows.append(record)
            elif isinstance(record, Schema):
                self.position = position
                self._insert((record.namespace, record.name))
                self._apply(record)
                positions = None  # _insert took the table's lists
        self.position = position

    def finish(self) -> None:
        """Insert every table's queued rows; store the layouts that changed."""
        for table in list(self._rows):
            self._insert(table)
        if self._changed:
            changed = [self.layouts[table] for table in sorted(self._changed)]
            self._changed.clear()
            self.con.execute(
                "INSERT OR REPLACE INTO pg2sink_tables SELECT unnest(?), unnest(?), unnest(?)",
                [
                    [layout.namespace for layout in changed],
                    [layout.name for layout in changed],
                    [orjson.dumps(layout.to_json()).decode() for layout in changed],
                ],
            )

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
        if ddl:
            ddl, more = _with_columns(ddl, more, layout.raw)
        for statement in (*ddl, *more):
            self.con.execute(statement)
        if ddl or more:
            self._changed.add(table)
        self.layouts[table] = layout

    def _taken_names(self) -> set[str]:
        """Every table and view name in the database, lower-cased (`taken`); new_layout
        adds the names it takes."""
        if self.taken is None:
            rows = self.con.execute("SELECT table_name FROM information_schema.tables").fetchall()
            self.taken = {str(name).lower() for (name,) in rows}
            for layout in self.layouts.values():
                self.taken.update((layout.raw.lower(), layout.view.lower()))
        return self.taken

    def _insert(self, table: tuple[str, str]) -> None:
        """The queued rows of `table` into its raw table, unchanged TOAST filled in."""
        positions, rows = self._rows.pop(table, ([], []))
        if not rows:
            return
        layout = self.layouts[table]
        try:
            batch = arrow_rows(layout, positions, rows)
        except UnfilledError:  # rarely: then the whole batch is filled and converted again
            numbered = list(zip(positions, rows, strict=True))
            filled, unchanged = Toast(self.con, layout).fill(numbered)
            batch = arrow_batch(layout, filled, unchanged)
        batch = json_marked(batch, layout)
        names = ", ".join(quote(n) for n in raw_columns(layout))
        self.con.register("_pg2sink_batch", batch)
        try:
            self.con.execute(
                f"INSERT INTO {quote(layout.raw)} ({names}) SELECT {names} FROM _pg2sink_batch"
            )
        finally:
            self.con.unregister("_pg2sink_batch")


def _with_columns(
    create: list[str], statements: list[str], raw: str
) -> tuple[list[str], list[str]]:
    """A new raw table's CREATE TABLE with the columns `evolve` adds to it, and the
    statements left: one statement instead of one per column, for the same table (each
    DDL statement costs DuckDB milliseconds, and a stream may meet thousands of tables:
    `make bench-tables ARGS="--sink duckdb"`)."""
    (statement,) = create
    add = f"ALTER TABLE {quote(raw)} ADD COLUMN "
    columns = [s.removeprefix(add) for s in statements if s.startswith(add)]
    rest = [s for s in statements if not s.startswith(add)]
    return [statement.removesuffix(")") + "".join(", " + c for c in columns) + ")"], rest
