"""The BigQuery calls of the sink: the client, the dataset, raw tables and views, load
jobs with deterministic ids, the state table (docs/sinks/bigquery.md).

A raw table keeps its Layout (the DuckDB sink's, pg2sink.sinks.warehouse.layout) as JSON in
its description, patched together with its schema in one tables.patch, so a restarted
stream finds the same names and columns. The state table `_pg2sink_state` gets a row
(slot, LSN, last position) per batch, loaded after the batch's rows.

Every request is retried by the Google client for --bigquery-retry-deadline while it
fails for want of the server; then it raises SinkUnavailableError (the batch is retried
by sinks/warehouse/commits.py). A refusal is a SinkError.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
from google.api_core import exceptions as google_errors
from google.cloud import bigquery

from pg2sink.changelog.records import Schema
from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.sinks.bigquery.api import (
    QUOTA_HINT,
    QUOTA_REASON,
    client,
    field_of,
    one_line,
    request_error,
    schema_fields,
    upload_retries,
)
from pg2sink.sinks.bigquery.config import BigQueryConfig
from pg2sink.sinks.bigquery.schema import (
    Field,
    alter_sql,
    clustering,
    retyped,
    table_fields,
    view_sql,
    widens,
)
from pg2sink.sinks.warehouse.layout import Layout
from pg2sink.sinks.warehouse.staging import LAYOUT_KEY, SCHEMA_KEY, schema_of

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

log = logging.getLogger(__name__)

__all__ = ["IMPORTS_TABLE", "STATE_TABLE", "StagedImport", "Warehouse", "client"]

STATE_TABLE = "_pg2sink_state"
#: the staging tables imports recorded (imports.py)
IMPORTS_TABLE = "_pg2sink_imports"
#: the description of a raw table starts with this, then its Layout as JSON
LAYOUT_MARK = "pg2sink layout: "
#: a load job id that failed is spent (BigQuery keeps it): the next attempt gets `_<n+1>`
MAX_ATTEMPTS = 5
#: how long a load job may take before the batch fails (retried by the stream)
JOB_TIMEOUT = 600.0
_NOT_IN_ID = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class StagedImport:
    """A partition of an import in its staging table (imports.py)."""

    name: str
    schema: Schema
    layout: Layout
    """The staging table's columns (imports.staging_layout)."""


class Warehouse:
    """One dataset: its raw tables, views, load jobs and state."""

    def __init__(self, config: BigQueryConfig, slot: str) -> None:
        self.config = config
        self.slot = slot
        self.client = client(config)
        self.dataset = f"{config.bigquery_project}.{config.bigquery_dataset}"
        #: every job id of this slot's stream starts so (unfinished_jobs)
        self.prefix = f"pg2sink_{_NOT_IN_ID.sub('_', slot)[:200]}_"
        #: this process's part of its job ids: a restart removes what a batch without
        #: its state row loaded (open), so it must not find that batch's jobs DONE
        self.run = uuid.uuid4().hex[:8]
        #: every request's retries (--bigquery-retry-deadline); a failed query job is
        #: not run again by the client (job_retry=None: its retry of the job's insert
        #: lasts 10 minutes whatever this says), a batch is (sinks/warehouse/commits.py)
        self.retry = bigquery.DEFAULT_RETRY.with_timeout(config.bigquery_retry_deadline)
        #: a load's upload is retried by google-resumable-media, which counts attempts
        self.upload_retries = upload_retries(config.bigquery_retry_deadline)

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)`; BigQuery's refusals as SinkError, an unreachable server
        or a server error as SinkUnavailableError (`_error`)."""
        try:
            return fn(*args, **kwargs)
        except (google_errors.GoogleAPIError, OSError) as e:
            raise request_error(what, e) from None

    # --- the dataset, its layouts and state ---

    def prepare(self) -> None:
        """Create the dataset, the state table and the imports table when missing."""
        dataset = bigquery.Dataset(self.dataset)
        if self.config.bigquery_location:
            dataset.location = self.config.bigquery_location
        self.call(
            "create dataset",
            self.client.create_dataset,
            dataset,
            exists_ok=True,
            retry=self.retry,
        )
        tables = {
            STATE_TABLE: [
                Field("slot", "STRING"),
                Field("lsn", "INT64"),
                Field("position", "INT64"),
                Field("imports", "STRING", repeated=True),
            ],
            IMPORTS_TABLE: [
                Field("name", "STRING"),
                Field("lsn", "INT64"),
                Field("schema", "STRING"),
                Field("layout", "STRING"),
            ],
        }
        for name, fields in tables.items():
            table = bigquery.Table(f"{self.dataset}.{name}", schema=schema_fields(fields))
            self.call(
                f"create {name}", self.client.create_table, table, exists_ok=True, retry=self.retry
            )

    def staged_imports(self, done: set[str]) -> list[StagedImport]:
        """The staging tables imports recorded and no batch loaded yet, oldest snapshot
        first."""
        rows = self.query(
            f"SELECT name, schema, layout FROM `{self.dataset}.{IMPORTS_TABLE}` ORDER BY lsn, name"
        )
        out = []
        for name, schema, layout in rows:
            if name not in done:
                metadata = {SCHEMA_KEY: schema.encode(), LAYOUT_KEY: layout.encode()}
                out.append(StagedImport(name, *schema_of(metadata)))
        return out

    def loaded_imports(self) -> set[str]:
        """The staging tables a batch has loaded (named in its state row)."""
        rows = self.query(
            f"SELECT name FROM `{self.dataset}.{STATE_TABLE}`, UNNEST(imports) AS name"
        )
        return {name for (name,) in rows}

    def dml(self, sql: str, params: Sequence[Any], job_id: str) -> int:
        """The rows a DML query job `job_id` changed; a job of that id already DONE (a
        retried batch) is not run again: its count is read."""
        job = self._job(job_id)
        if job is None:
            config = bigquery.QueryJobConfig(query_parameters=list(params))

            def run() -> Any:
                return self.client.query(
                    sql, job_config=config, job_id=job_id, retry=self.retry, job_retry=None
                )

            job = self.call("query", run)
        self.call(f"wait for {job_id}", _wait, job, self.retry)
        if job.error_result is not None:
            raise SinkError(f"bigquery: {job_id}: {one_line(Exception(job.error_result))}")
        return int(job.num_dml_affected_rows or 0)

    def drop(self, table: str) -> None:
        self.call(
            f"drop {table}",
            self.client.delete_table,
            f"{self.dataset}.{table}",
            not_found_ok=True,
            retry=self.retry,
        )

    def create_table(self, layout: Layout, name: str) -> None:
        """A table of `layout`'s raw columns (an import's staging table)."""
        table = bigquery.Table(f"{self.dataset}.{name}", schema=schema_fields(table_fields(layout)))
        self.call(f"create {name}", self.client.create_table, table, retry=self.retry)

    def open(self) -> tuple[dict[tuple[str, str], Layout], set[str], int, int]:
        """Create the dataset and state table when missing; the layouts of its raw
        tables, every table name (lower-cased), and the slot's stored LSN and the last
        position given to a raw row."""
        self.prepare()
        self._finish_unfinished()
        layouts: dict[tuple[str, str], Layout] = {}
        names: set[str] = set()
        listed = self.call(
            "list tables", lambda: list(self.client.list_tables(self.dataset, retry=self.retry))
        )
        for item in listed:
            names.add(str(item.table_id).lower())
            if item.table_type != "TABLE" or item.table_id == STATE_TABLE:
                continue
            table = self.call("get table", self.client.get_table, item.reference, retry=self.retry)
            description = table.description or ""
            if description.startswith(LAYOUT_MARK):
                layout = Layout.from_json(orjson.loads(description[len(LAYOUT_MARK) :]))
                layouts[layout.namespace, layout.name] = layout
        rows = self.query(
            f"SELECT (SELECT MAX(lsn) FROM `{self.dataset}.{STATE_TABLE}` WHERE slot = @slot), "
            f"(SELECT MAX(position) FROM `{self.dataset}.{STATE_TABLE}`)",
            [bigquery.ScalarQueryParameter("slot", "STRING", self.slot)],
        )
        position = int(rows[0][1] or 0)
        self._remove_uncommitted([layout.raw for layout in layouts.values()], position)
        return layouts, names, int(rows[0][0] or 0), position

    def _finish_unfinished(self) -> None:
        """Wait for the jobs a killed run of this slot's stream left pending or running
        (BigQuery runs a job to its end whoever waits for it): their rows count as
        loaded only once they are DONE."""
        since = datetime.now(UTC) - timedelta(days=1)
        for state in ("pending", "running"):
            listed = self.call(
                "list jobs",
                lambda state=state: list(
                    self.client.list_jobs(
                        state_filter=state, min_creation_time=since, retry=self.retry
                    )
                ),
            )
            for job in listed:
                if str(job.job_id).startswith(self.prefix):
                    log.info("bigquery: waiting for job %s of an earlier run", job.job_id)
                    self.call(f"wait for {job.job_id}", _wait, job, self.retry)

    def _remove_uncommitted(self, raws: Sequence[str], position: int) -> None:
        """Delete the raw rows after `position` (the last one a state row holds): a run
        killed after some load jobs of its batch, before the batch's state row, loaded
        them; the stream sends those changes again and they are loaded again, once."""
        if not raws:
            return
        counts = " UNION ALL ".join(
            f"SELECT {i}, COUNT(*) FROM `{self.dataset}.{raw}` WHERE _pg2sink_position > @position"
            for i, raw in enumerate(raws)
        )
        param = [bigquery.ScalarQueryParameter("position", "INT64", position)]
        for i, count in self.query(counts, param):
            raw = raws[i]
            if count:
                log.info(
                    "bigquery: %s rows of %s after position %s were loaded in part of a batch "
                    "without its state row: removed, they are loaded again",
                    count, raw, position,
                )  # fmt: skip
                self.query(
                    f"DELETE FROM `{self.dataset}.{raw}` WHERE _pg2sink_position > @position",
                    param,
                )

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of a query job (DDL: none)."""
        config = bigquery.QueryJobConfig(query_parameters=list(params))

        def run() -> list[Any]:
            job = self.client.query(sql, job_config=config, retry=self.retry, job_retry=None)
            result = job.result(retry=self.retry, job_retry=None, timeout=JOB_TIMEOUT)
            return list(result)

        return list(self.call("query", run))

    def apply(self, layout: Layout, created: bool) -> None:
        """The raw table as `layout` has it (created, or its widened types changed, then
        its new columns added and its layout kept, in one tables.patch), then its view.
        Each step is done once when the batch is retried (a table there already, a type
        or a column BigQuery has already)."""
        fields = table_fields(layout)
        description = LAYOUT_MARK + orjson.dumps(layout.to_json()).decode()
        ref = f"{self.dataset}.{layout.raw}"
        if created:
            table = bigquery.Table(ref, schema=schema_fields(fields))
            # a day per partition by the commit time; clustered by the key
            table.time_partitioning = bigquery.TimePartitioning(
                type_=bigquery.TimePartitioningType.DAY, field="_pg2sink_timestamp"
            )
            table.clustering_fields = clustering(layout) or None
            table.description = description
            self.call(
                f"create {layout.raw}",
                self.client.create_table,
                table,
                exists_ok=True,  # by this batch's earlier attempt (the names are ours)
                retry=self.retry,
            )
        else:
            table = self.call(f"get {layout.raw}", self.client.get_table, ref, retry=self.retry)
            if self._widen(layout, table, fields):
                table = self.call(f"get {layout.raw}", self.client.get_table, ref, retry=self.retry)
            have = {f.name for f in table.schema}
            added = [f for f in schema_fields(fields) if f.name not in have]
            table.schema = [*table.schema, *added]
            table.description = description
            self.call(
                f"alter {layout.raw}",
                self.client.update_table,
                table,
                ["schema", "description"],
                retry=self.retry,
            )
        self.query(view_sql(layout, self.dataset))

    def _widen(self, layout: Layout, table: Any, fields: Sequence[Field]) -> bool:
        """Change the raw table's columns whose type the layout widened (schema.retyped),
        one ALTER COLUMN SET DATA TYPE query job each; whether there were any. A change
        BigQuery cannot make, or its refusal, is a SinkError: nothing after it is
        confirmed."""
        had = [field_of(f) for f in table.schema]
        changes = retyped(had, fields)
        for old, new in changes:
            what = (
                f"column {new.name!r} of {layout.raw} ({layout.namespace}.{layout.name}) from "
                f"{old.ddl_type()} to {new.ddl_type()}"
            )
            if not widens(old, new):
                raise SinkError(
                    f"bigquery: cannot change {what}: BigQuery widens only NUMERIC and "
                    "BIGNUMERIC columns to more digits; nothing after it is confirmed "
                    "(docs/sinks/bigquery.md, Type changes)"
                )
            log.info("bigquery: changing %s", what)
            try:
                self.query(alter_sql(self.dataset, layout.raw, new))
            except SinkUnavailableError:
                raise
            except SinkError as e:
                raise SinkError(
                    f"bigquery refused to change {what} (ALTER COLUMN SET DATA TYPE): "
                    f"{str(e).removeprefix('bigquery: query: ')}; nothing after it is "
                    "confirmed (docs/sinks/bigquery.md, Type changes)"
                ) from None
        return bool(changes)

    # --- loads ---

    def job_id(self, what: str, start: int, end: int) -> str:
        """The load job id of `what` (a table, the state, an import's move) for the batch
        of LSNs after `start` up to `end`: the same for the batch retried in this run,
        unique per dataset, slot and run."""
        scope = hashlib.sha256(f"{self.dataset}\0{self.slot}\0{what}".encode()).hexdigest()[:16]
        return f"{self.prefix}{self.run}_{start:X}_{end:X}_{scope}"

    def load(self, table: str, rows: pa.Table, job_id: str) -> None:
        """`rows` appended to `table` by a Parquet load job `job_id` (`_<attempt>` added),
        waiting until it is DONE; a job of that id already DONE without errors is the
        same rows loaded before (a retried batch): nothing more is loaded."""
        for attempt in range(MAX_ATTEMPTS):
            jid = f"{job_id}_{attempt}"
            job = self._job(jid)
            if job is None:
                job = self._start_load(table, rows, jid)
            if job is None:
                job = self._job(jid)  # started by an earlier try of ours meanwhile
            if job is None:
                continue
            self.call(f"wait for {jid}", _wait, job, self.retry)
            if job.error_result is None:
                return
            if job.error_result.get("reason") == QUOTA_REASON:
                # another attempt now would fail the same way, and count against the quota
                raise SinkError(
                    f"bigquery: load job {jid} into {table}: "
                    f"{one_line(Exception(job.error_result))} ({QUOTA_HINT})"
                )
            log.warning("bigquery load job %s failed: %s", jid, job.error_result)
        raise SinkError(
            f"bigquery: loading {table} failed {MAX_ATTEMPTS} times; last: "
            f"{one_line(Exception(job.error_result if job else 'no job'))}"
        )

    def _job(self, jid: str) -> Any:
        try:
            return self.client.get_job(jid, project=self.config.bigquery_project, retry=self.retry)
        except google_errors.NotFound:
            return None
        except (google_errors.GoogleAPIError, OSError) as e:
            raise request_error(f"get job {jid}", e) from None

    def _start_load(self, table: str, rows: pa.Table, jid: str) -> Any:
        """Start the load job (None: the id is taken, 409)."""
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        buffer = io.BytesIO()
        pq.write_table(rows, buffer)
        buffer.seek(0)
        config = bigquery.LoadJobConfig(
            source_format=bigquery.SourceFormat.PARQUET,
            write_disposition=bigquery.WriteDisposition.WRITE_APPEND,
        )
        options = bigquery.ParquetOptions()  # type: ignore[no-untyped-call]
        options.enable_list_inference = True  # LIST columns into REPEATED fields
        config.parquet_options = options
        try:
            return self.client.load_table_from_file(
                buffer,
                f"{self.dataset}.{table}",
                job_id=jid,
                job_config=config,
                num_retries=self.upload_retries,
            )
        except google_errors.Conflict:
            return None
        except (google_errors.GoogleAPIError, OSError) as e:
            raise request_error(f"load {table}", e) from None

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]


def _wait(job: Any, retry: Any) -> None:
    """Poll the job until DONE (errors stay in `error_result`)."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while True:
        job.reload(retry=retry)
        if job.state == "DONE":
            return
        if time.monotonic() > deadline:
            raise SinkError(f"bigquery: job {job.job_id} not done after {JOB_TIMEOUT:.0f}s")
        time.sleep(0.2)
