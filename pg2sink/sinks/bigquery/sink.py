"""The BigQuery sink: every table's changes as rows of a raw table in a BigQuery dataset,
with a latest-state view per table (docs/sinks/bigquery.md).

Records are held per transaction until its checkpoint, batched and handed to a
background thread (pg2sink.sinks.warehouse.commits.BackgroundCommits), a batch with changes at
most once per --bigquery-load-interval (BigQuery's daily load-job quota per table), one of
checkpoints only confirmed without a load: Schema records become
raw tables and views (the DuckDB sink's layouts, schema.py), Modifications become rows
(the DuckDB sink's values.py), numbered by `_pg2sink_position`; each table's rows go in one
Parquet load job whose id is derived from (slot, table, the batch's LSN range), then a
state row (slot, LSN, last position) in a load job of its own. `acknowledged()` is the
batch's LSN only once every job is DONE without errors.

Delivery: a batch retried within the process takes the same job ids; a job already DONE
is not loaded again. BigQuery unreachable or answering 5xx for longer than
--bigquery-retry-deadline: the batch is retried with backoff until it answers
(BackgroundCommits), from the layouts and staging tables it started with (every DDL step
is done once). After a crash the stream restarts at the slot's confirmed LSN; the
transactions up to the stored LSN are dropped, and the rest are numbered from the stored
position again, so rows loaded before the crash come again at the same positions, which
the view reads once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from google.cloud import bigquery

from pg2sink.changelog.records import Modification, Record, Schema
from pg2sink.errors import SinkError
from pg2sink.logical.lsn import format_lsn
from pg2sink.sinks.bigquery.config import BigQueryConfig
from pg2sink.sinks.bigquery.rows import BigQueryToast, state_rows, table_rows
from pg2sink.sinks.bigquery.schema import quote
from pg2sink.sinks.bigquery.warehouse import STATE_TABLE, StagedImport, Warehouse
from pg2sink.sinks.warehouse.commits import BackgroundCommits
from pg2sink.sinks.warehouse.layout import META, OPERATION, POSITION, Layout, evolve, new_layout

if TYPE_CHECKING:
    from pg2sink.observability.stats import StreamStats

log = logging.getLogger(__name__)

__all__ = ["STATE_KEY", "BigQuerySink"]

#: the slot of the state rows when the stream does not tell its slot (`use_slot`)
STATE_KEY = "pg2sink"
#: a batch this large is loaded at the next checkpoint, after the one being loaded
MAX_BATCH_RECORDS = 50_000


class BigQuerySink:
    """The BigQuery sink; see the module docstring."""

    def __init__(self, config: BigQueryConfig) -> None:
        self.config = config
        self.slot = STATE_KEY
        self._warehouse: Warehouse | None = None
        self._layouts: dict[tuple[str, str], Layout] = {}
        self._names: set[str] = set()
        self._position = 0
        #: the staging tables of imports already in the raw tables
        self._imported: set[str] = set()
        #: the staging tables a batch (by its LSN) loads: the same when it is retried,
        #: so its rows get the same positions and job ids
        self._staged: tuple[int, list[StagedImport]] = (0, [])
        self._commits = BackgroundCommits(
            self._load,
            "pg2sink-bigquery",
            MAX_BATCH_RECORDS,
            min_interval=config.bigquery_load_interval,
        )

    def report_health(self, stats: StreamStats) -> None:
        """Tell `stats` when BigQuery is away and when a batch loads again (GET /status),
        as the background commits find out (ReportsHealth)."""
        self._commits.outages.report_to(stats.sink_outage)

    def use_slot(self, slot: str) -> None:
        """The stream's replication slot: the key of its state rows (UsesSlot)."""
        self.slot = slot

    def open(self) -> None:
        """Connect, create the dataset when missing, read the layouts and where it is."""
        warehouse = Warehouse(self.config, self.slot)
        self._layouts, self._names, stored, self._position = warehouse.open()
        self._imported = warehouse.loaded_imports()
        self._warehouse = warehouse
        self._commits.start(stored)
        log.info("bigquery sink writing to %s, from LSN %s", warehouse.dataset, format_lsn(stored))

    # held, batched and loaded in the background by BackgroundCommits (sinks/warehouse/commits.py)
    def write(self, record: Record) -> None:
        self._commits.write(record)

    def checkpoint(self, lsn: int) -> None:
        self._commits.checkpoint(lsn)

    def start_flush(self) -> None:
        self._commits.start_flush()

    def flush(self) -> int | None:
        return self._commits.flush()

    def acknowledged(self) -> int | None:
        return self._commits.acknowledged()

    def pending_bytes(self) -> int:
        return self._commits.pending_bytes()

    def close(self) -> None:
        """Load what is checkpointed (unless a load failed, or BigQuery is away: then it
        is sent again at the next start), close the client."""
        try:
            if self._warehouse is not None and self._commits.failed is None:
                self._commits.flush()
        finally:
            self._commits.stop()
            if self._warehouse is not None:
                self._warehouse.close()
                self._warehouse = None

    def _load(self, records: Sequence[Record], lsn: int) -> int:
        """`_load_batch`; on an error the layouts and names are as before it, so that the
        batch retried (an outage) evolves them the same way."""
        layouts, names = dict(self._layouts), set(self._names)
        try:
            return self._load_batch(records, lsn)
        except BaseException:
            self._layouts, self._names = layouts, names
            raise

    def _load_batch(self, records: Sequence[Record], lsn: int) -> int:
        """The batch's DDL, its rows per table, then the state row; `lsn` once all are
        DONE."""
        warehouse = self._warehouse
        if warehouse is None:
            raise SinkError("the bigquery sink was not opened")
        start, position = self._commits.stored, self._position
        if self._staged[0] != lsn:
            self._staged = (lsn, warehouse.staged_imports(self._imported))
        staged = self._staged[1]
        if not staged and not records:
            # checkpoints only (keepalive positions): nothing to load, and no state row,
            # which would spend a load job of the state table's daily quota; a restart
            # from here finds no change between the stored LSN and `lsn` to skip
            return lsn
        for staged_import in staged:
            position = self._load_import(warehouse, staged_import, position, (start, lsn))
        rows: dict[tuple[str, str], list[tuple[int, Modification]]] = {}
        for record in records:
            if isinstance(record, Schema):
                table = (record.namespace, record.name)
                self._flush_table(warehouse, table, rows.pop(table, []), start, lsn)
                self._apply(warehouse, record, position)
            elif isinstance(record, Modification):
                table = (record.namespace, record.name)
                if table not in self._layouts:
                    raise SinkError(
                        f"a change of {record.namespace}.{record.name} before its Schema"
                    )
                position += 1
                rows.setdefault(table, []).append((position, record))
        for table, queued in rows.items():
            self._flush_table(warehouse, table, queued, start, lsn)
        loaded = [s.name for s in staged]
        warehouse.load(
            STATE_TABLE,
            state_rows(self.slot, lsn, position, loaded),
            warehouse.job_id(STATE_TABLE, start, lsn),
        )
        self._commits.stored, self._position = lsn, position
        self._imported.update(loaded)
        for name in loaded:  # in the raw tables now, and named in the state row
            warehouse.drop(name)
        return lsn

    def _load_import(
        self, warehouse: Warehouse, staged: StagedImport, position: int, batch: tuple[int, int]
    ) -> int:
        """A staging table's rows into its table's raw table after `position` (the
        layout gains the columns the import's snapshot has); the next position. A row
        whose key has an IMPORT row of the same or a newer snapshot is not loaded (a
        partition staged twice). The DML job's id is derived from the staging table,
        `position` and the `batch`'s LSN range: the batch retried in this run finds it DONE
        and reads its count."""
        table = (staged.schema.namespace, staged.schema.name)
        layout = self._layouts.get(table)
        known = set() if layout is None else {c.column for c in layout.live()}
        if not {c.column for c in staged.layout.live()} <= known:
            self._apply(warehouse, staged.schema, position, keep=known)
        layout = self._layouts[table]
        by_column = {c.column: c for c in layout.columns}
        meta = [n for n, _ in META if n != POSITION]
        targets = [*meta, *(by_column[c.column].raw for c in staged.layout.live())]
        sources = [*meta, *(c.raw for c in staged.layout.live())]
        raw = quote(f"{warehouse.dataset}.{layout.raw}")
        values = ", ".join(f"s.{quote(c)}" for c in sources)
        sql = (
            f"INSERT INTO {raw} ({POSITION}, {', '.join(quote(t) for t in targets)}) "
            f"SELECT @position + ROW_NUMBER() OVER (), {values} "
            f"FROM {quote(f'{warehouse.dataset}.{staged.name}')} AS s"
        )
        if layout.primary_key and staged.layout.primary_key == layout.primary_key:
            staged_by_column = {c.column: c for c in staged.layout.live()}
            same = " AND ".join(
                f"r.{quote(by_column[k].raw)} = s.{quote(staged_by_column[k].raw)}"
                for k in layout.primary_key
            )
            sql += (
                f" WHERE NOT EXISTS (SELECT 1 FROM {raw} AS r WHERE r.{OPERATION} = 'IMPORT' "
                f"AND r._pg2sink_lsn >= s._pg2sink_lsn AND {same})"
            )
        param = bigquery.ScalarQueryParameter("position", "INT64", position)
        job_id = warehouse.job_id(f"insert {staged.name} {position}", *batch)
        count = warehouse.dml(sql, [param], job_id)
        log.info("bigquery: %s rows of an import of %s.%s loaded", count, table[0], table[1])
        return position + count

    def _flush_table(
        self,
        warehouse: Warehouse,
        table: tuple[str, str],
        rows: list[tuple[int, Modification]],
        start: int,
        lsn: int,
    ) -> None:
        """A table's queued rows in one load job (unchanged TOAST filled in); a table's
        rows before and after a Schema record of it are two jobs, told apart by their
        first position."""
        if not rows:
            return
        layout = self._layouts[table]
        filled, unchanged = BigQueryToast(warehouse, layout).fill(rows)
        what = f"{layout.raw}\0{rows[0][0]}"
        warehouse.load(
            layout.raw, table_rows(layout, filled, unchanged), warehouse.job_id(what, start, lsn)
        )

    def _apply(
        self,
        warehouse: Warehouse,
        schema: Schema,
        position: int,
        keep: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """Create or evolve the table's raw table and view; keep its Layout."""
        from pg2sink.sinks.bigquery.rows import missing_values

        table = (schema.namespace, schema.name)
        layout = self._layouts.get(table)
        created = layout is None
        if layout is None:
            layout, _ = new_layout(schema, self._names)
        evolved, ddl = evolve(
            layout, schema, keep, position=position, missing=missing_values(schema)
        )
        if created or ddl:
            warehouse.apply(evolved, created)
        self._layouts[table] = evolved
