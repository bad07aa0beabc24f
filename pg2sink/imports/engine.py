"""The import engine: a thread of `pg2sink stream` that runs the import jobs, one at a time.

Per job (docs/imports.md has the argument):
1. claim it (jobs.claim: SKIP LOCKED + a session advisory lock held while it runs);
2. wait until every transaction running now has ended (those in flight when the table
   joined must be entirely visible to the snapshot);
3. hold the table's changes in the stream (gate.hold), wait once more for the
   transactions running at that moment, then export a snapshot and tell the gate
   which transactions it sees (gate.open_snapshot);
4. plan the partitions at that snapshot (first attempt only: they are stored with the
   job), run the not-yet-done ones with the Spark runner, which marks each partition
   done once its rows are durable;
5. mark the job done and open the gate; on failure record the error, schedule the
   next attempt with exponential backoff and open the gate.

Spark is supervised: a session found dead (spark.SparkSessionLost: its driver JVM
exited or was killed, its py4j gateway broke, its heap ran out, its cluster master or
executors were lost) is dropped and a new one started at once, and the job goes on with
its partitions not marked done, at the same snapshot with the gate still held; one
warning line says what died and what happens next. After --spark-session-failures
sessions in a row died without a partition done, the attempt fails as any other (the
error in `pg2sink import --list`, `status`, /status, the metrics; the next attempt after
the backoff). Meanwhile a stream held at the table's gate says why once a minute.

Progress is a rich progress bar on an interactive stderr, one log line per job
otherwise, and StreamStats.imports (the pg2sink_import_* metrics) either way; the rows
of each partition durably written count as IMPORT changes (pg2sink_changes_total).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.catalog.server import connect
from pg2sink.catalog.standby import primary_position, wait_for_replay
from pg2sink.changelog.records import Operation
from pg2sink.config import SecretDsn, StreamConfig
from pg2sink.errors import ImportFailed, Pg2SinkError
from pg2sink.imports import jobs
from pg2sink.imports.gate import ImportGate
from pg2sink.imports.snapshot import ExportedSnapshot, use_snapshot, wait_for_transactions
from pg2sink.observability.stats import ImportProgress, StreamStats
from pg2sink.sinks.base import ImportTarget

log = logging.getLogger(__name__)

_KEY = """
SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
       OR c.relreplident = 'i'
FROM pg_class c WHERE c.oid = to_regclass(%s)
"""


def table_keyless(conn: psycopg.Connection[TupleRow], schema: str, table: str) -> bool | None:
    """Whether the table has neither a primary key nor a replica-identity index; None if
    it does not exist."""
    row = conn.execute(_KEY, (sql.Identifier(schema, table).as_string(conn),)).fetchone()
    return None if row is None else not row[0]


def _has_rows(conn: psycopg.Connection[TupleRow], schema: str, table: str) -> bool:
    """Whether the table's heap has any page (cheap; a partitioned root has none)."""
    row = conn.execute(
        "SELECT pg_relation_size(%s::regclass) > 0 OR EXISTS (SELECT 1 FROM pg_inherits "
        "WHERE inhparent = %s::regclass)",
        (sql.Identifier(schema, table).as_string(conn),) * 2,
    ).fetchone()
    return bool(row and row[0])


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if isinstance(error, Pg2SinkError) else f"{type(error).__name__}: {text}"


class _Progress:
    """A rich progress bar on a terminal, else a log line at the end of each job."""

    def __init__(self) -> None:
        self._bar: Any = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("import {task.description}"),
                BarColumn(),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f} rows"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )

    def start(self, table: str, total: int | None) -> Any:
        if self._bar is None:
            return None
        self._bar.start()
        return self._bar.add_task(table, total=total)

    def advance(self, task: Any, rows: int) -> None:
        if self._bar is not None and task is not None:
            self._bar.update(task, advance=rows)

    def stop(self, task: Any) -> None:
        if self._bar is not None and task is not None:
            self._bar.remove_task(task)
            self._bar.stop()


class ImportEngine:
    """Runs the publication's import jobs in a background thread."""

    def __init__(
        self,
        cfg: StreamConfig,
        stats: StreamStats,
        gate: ImportGate,
        target: ImportTarget | None,
        *,
        poll_interval: float = 1.0,
        state_dsn: SecretDsn | None = None,
    ) -> None:
        """`target`: where the stream's sink takes import rows (its `import_target()`);
        None for a sink that cannot import. `state_dsn`: where the jobs are kept, when not
        on --source (--primary, while --source is a standby: catalog/standby.py)."""
        self.cfg = cfg
        self.src = cfg.source
        #: where the jobs are: --source, or --primary while --source is a standby (the
        #: service sets it again at each session: a promoted standby keeps them itself)
        self.state_dsn = state_dsn or cfg.source.dsn
        self.stats = stats
        self.gate = gate
        self.target = target
        #: why jobs cannot run (they stay pending, with one warning), or None
        self.problem = (
            target.problem() if target is not None else f"the {cfg.sink} sink takes no imports"
        )
        self.poll_interval = poll_interval
        self.backoff = jobs.Backoff(
            cfg.import_backoff_base, cfg.import_backoff_factor, cfg.import_backoff_max
        )
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._progress = _Progress()
        self._warned_stdout = False

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        # daemon: a stop never waits for a Spark job; the job stays `running`, its
        # advisory lock ends with the process, and the next start resumes it
        self._thread = threading.Thread(target=self._main, name="pg2sink-imports", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look for due jobs now (a table just joined)."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        runner, self._runner = self._runner, None
        if runner is not None:
            try:
                runner.close()
            except Exception as e:  # stopping anyway
                log.debug("closing the Spark runner: %s", e)

    @property
    def standby(self) -> bool:
        """Whether the jobs live on another server than the one the imports read."""
        return self.state_dsn is not self.src.dsn

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def can_write(self) -> bool:
        """Whether executors can write to the sink (not to standard output, say)."""
        return self.problem is None

    # -- the loop -----------------------------------------------------------------

    def _main(self) -> None:
        conn: psycopg.Connection[TupleRow] | None = None
        opened = self.state_dsn
        while not self.stopping:
            try:
                if conn is not None and opened is not self.state_dsn:
                    conn.close()  # the jobs moved: the standby --source names was promoted
                if conn is None or conn.closed:
                    opened = self.state_dsn
                    conn = connect(opened, application_name="pg2sink import")
                self._refresh(conn)
                if not self.can_write():
                    self._wait(self.poll_interval * 10)
                    continue
                job = jobs.claim(conn, self.src.internal_schema, self.src.publication)
                if job is None:
                    self._wait(self.poll_interval)
                    continue
                self._run_job(conn, job)
            except Exception as e:  # the loop survives lost connections and the like
                if self.stopping:
                    break
                log.warning("import engine: %s; retrying", _one_line(e))
                if conn is not None:
                    conn.close()
                conn = None
                self._wait(max(self.poll_interval, 1.0))
        if conn is not None:
            conn.close()

    def _wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _refresh(self, conn: psycopg.Connection[TupleRow]) -> None:
        """Jobs into StreamStats.imports; pending gates for keyless tables with a job."""
        live = jobs.list_jobs(conn, self.src.internal_schema, self.src.publication)
        gated = set(self.gate.tables())
        seen = set()
        for job in live:
            key = (job.schema, job.table)
            seen.add(key)
            progress = self.stats.imports.get(key)
            if progress is None or job.state != "running":
                self.stats.imports[key] = ImportProgress(
                    job.rows_processed,
                    job.rows_estimated,
                    "pending" if job.state == "expired" else job.state,
                    job.error if job.state == "failed" else None,
                )
            if (
                job.state in jobs.LIVE_STATES
                and key not in gated
                and table_keyless(conn, job.schema, job.table)
            ):
                self.gate.pending(job.schema, job.table)
        if not self.can_write() and not self._warned_stdout:
            pending = [j for j in live if j.state in jobs.LIVE_STATES]
            if pending:
                self._warned_stdout = True
                log.warning("%d import job(s) stay pending: %s", len(pending), self.problem)
        for key in list(self.stats.imports):
            if key not in seen:
                del self.stats.imports[key]

    def _run_job(self, conn: psycopg.Connection[TupleRow], job: jobs.Job) -> None:
        schema, table = job.schema, job.table
        internal = self.src.internal_schema
        key = (schema, table)
        progress = self.stats.imports.setdefault(key, ImportProgress())
        progress.state = "running"
        exporter: ExportedSnapshot | None = None
        task: Any = None
        started = time.monotonic()
        # the server the import reads: the jobs' own, or the standby --source names
        reader = conn
        try:
            if self.standby:
                reader = connect(self.src.dsn, application_name="pg2sink import")
                # the table's join (committed before the claim) replayed there first
                lsn = primary_position(conn)
                if not wait_for_replay(reader, lsn, stop=lambda: self.stopping):
                    return
            keyless = table_keyless(reader, schema, table)
            if keyless is None:
                raise ImportFailed(f"table {job.qualified} does not exist")
            log.info(
                "import of %s started (job %d, attempt %d)", job.qualified, job.id, job.attempts
            )
            if not wait_for_transactions(reader, stop=lambda: self.stopping):
                return
            if _has_rows(reader, schema, table):
                # start Spark (seconds of JVM) before the gate may pause the stream
                self._start_spark(job)
            self.gate.hold(schema, table, keyless=keyless)
            # a transaction whose changes the stream received before the gate took hold
            # may still be in the server's list of running ones for a moment: a snapshot
            # taken before it left would not see it
            if not wait_for_transactions(reader, stop=lambda: self.stopping):
                return
            exporter = ExportedSnapshot.open(self.src.dsn)
            self.gate.open_snapshot(schema, table, exporter.visibility, exporter.lsn)
            jobs.record_snapshot(conn, internal, job.id, exporter)
            plan, todo = self._plan(conn, job, exporter)
            progress.rows_estimated = plan.rows_estimated
            progress.rows_read = job.rows_processed
            task = self._progress.start(job.qualified, plan.rows_estimated)
            rows = 0
            if todo:
                # pg2sink_changes_total{operation="IMPORT"}: the table's counters (the
                # stream never writes IMPORT, so this thread alone updates that one)
                changes = self.stats.table_changes(schema, table)

                def advance(n: int) -> None:
                    """Rows of partitions marked done: durable in the sink."""
                    progress.rows_read += n
                    changes[Operation.IMPORT] += n
                    self._progress.advance(task, n)

                rows = self._run_spark(conn, job, plan, todo, exporter.name, advance)
            jobs.finish(conn, internal, job.id)
            self.gate.finish(schema, table)
            progress.state = "done"
            progress.error = None
            elapsed = time.monotonic() - started
            log.info(
                "import of %s done: %d rows in %.1fs (%.0f rows/s), %d of %d partitions this run",
                job.qualified,
                rows,
                elapsed,
                rows / elapsed if elapsed > 0 else 0.0,
                len(todo),
                len(plan.predicates),
            )
        except Exception as e:
            self._failed(conn, job, progress, e)
        finally:
            self._progress.stop(task)
            if exporter is not None:
                exporter.close()
            if reader is not conn:
                reader.close()
            if not conn.closed:
                jobs.release(conn, internal, job.id)

    def _failed(
        self,
        conn: psycopg.Connection[TupleRow],
        job: jobs.Job,
        progress: ImportProgress,
        error: Exception,
    ) -> None:
        """A job that raised: retried later with backoff, unless the process stops (the
        job then stays `running` and resumes at the next start)."""
        if self.stopping:
            self.gate.finish(job.schema, job.table, retry=True)
            return
        message = _one_line(error)
        delay = jobs.fail(conn, self.src.internal_schema, job.id, message, self.backoff)
        self.gate.finish(job.schema, job.table, retry=True)
        progress.state = "failed"
        progress.error = message
        self.stats.count_error(error)
        log.warning(
            "import of %s failed (attempt %d): %s; next attempt in %.0fs",
            job.qualified,
            job.attempts,
            message,
            delay,
        )

    def _plan(
        self, conn: psycopg.Connection[TupleRow], job: jobs.Job, exporter: ExportedSnapshot
    ) -> tuple[Any, list[int]]:
        """The job's plan at the snapshot, with the partitions stored at its first
        planning (on `conn`, where the jobs are), and the numbers of those not done yet."""
        from pg2sink.imports.driver import target_partitions
        from pg2sink.imports.plan import plan_import

        internal = self.src.internal_schema
        planner = connect(self.src.dsn, application_name="pg2sink import plan")
        try:
            use_snapshot(planner, exporter.name)
            plan = plan_import(
                planner,
                job.schema,
                job.table,
                target_partitions=target_partitions(self.cfg.spark_master),
                publication=job.publication,
                rules=self.cfg.routing.rules(),
            )
            # A table empty in the snapshot has nothing to import: no Spark job (whose JVM
            # start would hold the gate, and with it the stream, for seconds).
            row = planner.execute(
                sql.SQL("SELECT EXISTS (SELECT FROM {})").format(
                    sql.Identifier(job.schema, job.table)
                )
            ).fetchone()
            empty = not (row and row[0])
            planner.execute("COMMIT")
            stored = jobs.load_partitions(conn, internal, job.id)
            if not stored:
                jobs.save_partitions(conn, internal, job.id, plan.predicates, plan.rows_estimated)
                stored = jobs.load_partitions(conn, internal, job.id)
            else:
                plan = dataclasses.replace(plan, predicates=tuple(p.predicate for p in stored))
        finally:
            planner.close()
        return plan, [] if empty else [p.number for p in stored if not p.done]

    def _start_spark(self, job: jobs.Job) -> None:
        """The runner's session, started anew while it dies (module docstring)."""
        from pg2sink.imports.spark import SparkSessionLost

        failures = 0
        while True:
            try:
                self._spark_runner().session()
                return
            except SparkSessionLost as e:
                failures += 1
                self._session_lost(job, str(e), failures, None)

    def _run_spark(
        self,
        conn: psycopg.Connection[TupleRow],
        job: jobs.Job,
        plan: Any,
        todo: list[int],
        snapshot: str,
        advance: Any,
    ) -> int:
        """Rows written by the session that finished the partitions `todo`; a session
        that dies is replaced and the partitions it left undone run on the next one."""
        from pg2sink.imports.spark import ImportTask, SparkSessionLost

        assert self.target is not None  # can_write()
        failures = 0
        while True:
            task = ImportTask(
                job_id=job.id,
                plan=plan,
                partitions=tuple(todo),
                snapshot=snapshot,
                source_dsn=self.src.dsn.reveal(),
                state_dsn=self.state_dsn.reveal(),
                internal_schema=self.src.internal_schema,
                target=self.target,
            )
            try:
                return int(self._spark_runner().run(task, advance))
            except SparkSessionLost as e:
                stored = jobs.load_partitions(conn, self.src.internal_schema, job.id)
                left = [p.number for p in stored if not p.done and p.number in todo]
                # a session that got partitions done before it died is not a failure in
                # a row: a big import on a flaky cluster still progresses
                failures = failures + 1 if len(left) == len(todo) else 1
                todo = left
                self._session_lost(job, str(e), failures, (len(left), len(stored)))
                if not todo:
                    return 0

    def _session_lost(
        self, job: jobs.Job, why: str, failures: int, left: tuple[int, int] | None
    ) -> None:
        """One line on a dead Spark session and what comes next; ImportFailed when it
        was the last allowed in a row (or pg2sink stops)."""
        self.stats.spark_sessions_lost += 1
        limit = self.cfg.spark_session_failures
        if failures >= limit or self.stopping:
            raise ImportFailed(f"{why} ({failures} Spark session(s) in a row lost)")
        where = f", {left[0]} of {left[1]} partitions left" if left is not None else ""
        log.warning(
            "import of %s: %s; starting a new Spark session (failure %d of %d in a row%s)",
            job.qualified,
            why,
            failures,
            limit,
            where,
        )
        self.gate.note(
            job.schema, job.table, f"its import goes on in a new Spark session after: {why}"
        )
        self._stopping.wait(min(float(failures), 5.0))

    def _spark_runner(self) -> Any:
        if self._runner is None:
            from pg2sink.imports.spark import SparkRunner

            # pyspark 4 starts local Python workers with PYSPARK_PYTHON, not with the
            # spark.pyspark.python setting: without it they run the system python3,
            # which has no pg2sink
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            self._runner = SparkRunner(
                self.cfg.spark_master,
                jdbc_driver=self.cfg.jdbc_driver,
                class_cache=self.cfg.spark_class_cache,
                driver_memory=self.cfg.spark_driver_memory,
            )
        return self._runner
