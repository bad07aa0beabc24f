"""The Spark runner: one import job as a PySpark job (parallel JDBC reads, executor writes).

For a job (`ImportTask`) the driver:
1. has the sink's import target (sinks/base.py `ImportTarget`) write the table's Schema
   record (the Avro row schema the stream builds, from the same codecs) durably, which
   registers the Kafka subjects when the sink is Kafka Avro;
2. builds one JDBC scan per partition still to do: `SELECT <each published column as
   PostgreSQL text> FROM table WHERE (<the publication's row filter>) AND <the
   partition's predicate>` (plan.py: an import reads what the publication publishes),
   read by the PostgreSQL JDBC
   driver in a REPEATABLE READ transaction that first imports the job's exported
   snapshot (`sessionInitStatement`: SET TRANSACTION SNAPSHOT), with a fetch size so
   rows stream instead of being held in memory, and the session settings of the
   stream's walsender (DateStyle, TimeZone... catalog.server.REPLICATION_SESSION_SETTINGS) so
   every value's text is what pgoutput would send;
3. unions the scans (Spark partition i = the i-th partition left to do; the text read as
   bytes, reads.binary_schema) and hands them, as Arrow batches, to
   `writers.write_partition` through mapInArrow: executors
   decode, write, flush and mark their partition done; only a (partition, rows) pair per
   partition comes back to the driver.

The SparkSession starts lazily, on the first job with rows to read (a stream that
imports nothing never pays Spark's start-up, seconds of JVM), with Spark's console
quiet: log4j at ERROR (log4j2.properties next to this file), no progress bar, no UI.
`local[*]` runs everything in this machine's JVM and Python workers; any master URL
(spark://, yarn, k8s://) runs the same job on a cluster, whose executors need the
JDBC driver (shipped with spark.jars), pg2sink installed and a route to PostgreSQL.

Values are read with the type's output function, as pgoutput sends them (reads.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from subprocess import PIPE, STDOUT
from typing import IO, Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.catalog.catalog import unknown_type
from pg2sink.catalog.types import TypeCache
from pg2sink.changelog.batches import ImportTable
from pg2sink.changelog.records import Schema
from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for
from pg2sink.errors import ConfigError, ImportFailed, Pg2SinkError
from pg2sink.imports.class_archive import (
    CLASS_CACHE_ENV,
    ClassArchive,
    archive_key,
    default_cache_dir,
)
from pg2sink.imports.driver import (
    LOG4J_CONFIG,
    default_jdbc_driver,
    driver_heap,
    driver_java_options,
    is_local,
    services_cache,
    task_buffer_bytes,
)
from pg2sink.imports.plan import ImportPlan
from pg2sink.imports.reads import binary_schema, fetch_rows, jdbc_reader, row_width, text_query
from pg2sink.imports.supervision import (
    SparkSessionLost,
    Watchdog,
    check_java_home,
    discard_session,
    one_line,
    quiet_accumulator_server,
    quiet_py4j,
    session_death,
)
from pg2sink.imports.writers import PartitionJob
from pg2sink.routing.masking import annotate_schema
from pg2sink.sinks.base import ImportTarget

__all__ = [
    "ImportTask",
    "SparkRunner",
    "SparkSessionLost",
    "default_jdbc_driver",
]

log = logging.getLogger(__name__)

#: How often the driver polls finished partitions for `progress`, in seconds.
PROGRESS_POLL = 1.0


@dataclass(frozen=True)
class ImportTask:
    job_id: int
    plan: ImportPlan
    partitions: tuple[int, ...]
    """Partition numbers still to do."""
    snapshot: str
    """pg_export_snapshot() name."""
    source_dsn: str = dataclasses.field(repr=False)
    """Secret: never log it."""
    internal_schema: str
    target: ImportTarget = dataclasses.field(repr=False)
    """Where the rows go: the stream's sink's import target (may hold secrets)."""
    state_dsn: str = dataclasses.field(default="", repr=False)
    """Where the job's partitions are marked done, when not source_dsn: the primary
    while the source is a standby (secret too)."""

    @property
    def jobs_dsn(self) -> str:
        """The DSN of the server that keeps the job (state_dsn, else source_dsn)."""
        return self.state_dsn or self.source_dsn


class SparkRunner:
    """Runs ImportTasks on Spark; see the module docstring."""

    def __init__(
        self,
        master: str = "local[*]",
        *,
        app_name: str = "pg2sink-import",
        jdbc_driver: str | None = None,
        class_cache: str | None = None,
        driver_memory: str | None = None,
    ) -> None:
        self.master = master
        #: spark.driver.memory (--spark-driver-memory, else from the machine's memory)
        self.driver_memory = driver_heap(driver_memory)
        self.app_name = app_name
        self.jdbc_driver = jdbc_driver
        #: where the driver JVM's class archive lives (class_archive.py); None:
        #: $PG2SINK_SPARK_CLASS_CACHE (what --spark-class-cache reads too), else the
        #: default directory; "off": no archive
        self.class_cache = class_cache
        self._spark: Any = None
        #: seconds the last SparkSession took to start (bench-import reports it)
        self.startup_seconds = 0.0
        #: the driver JVM's -XX option on its class archive, "" without one
        self.class_archive_option = ""

    # -- session ---------------------------------------------------------------------

    def _driver_jar(self) -> str:
        jar = self.jdbc_driver or default_jdbc_driver()
        if not jar:
            raise ConfigError(
                "the PostgreSQL JDBC driver is missing: run `make setup` (it downloads it "
                f"into {services_cache() / 'jdbc'}) or pass --jdbc-driver PATH"
            )
        if not os.path.isfile(jar):
            raise ConfigError(f"--jdbc-driver {jar!r}: no such file")
        return jar

    def session(self) -> Any:
        """The SparkSession, started on first use."""
        if self._spark is not None:
            return self._spark
        jar = self._driver_jar()
        try:
            from pyspark import SparkConf, SparkContext
            from pyspark.java_gateway import launch_gateway
            from pyspark.sql import SparkSession
        except ImportError:
            raise ConfigError(
                "imports run on Spark: install pyspark (pip install 'pg2sink[spark]')"
            ) from None
        started = time.monotonic()
        quiet_py4j()
        java_options = driver_java_options()
        # (a session after close() reuses the running JVM: nothing to map or record)
        archive = None if SparkContext._gateway is not None else self._class_archive(java_options)
        if archive is not None:
            self.class_archive_option = archive.java_option() or ""
            java_options = f"{java_options} {self.class_archive_option}".rstrip()
        conf = (
            SparkConf()
            .setMaster(self.master)
            .setAppName(self.app_name)
            .set("spark.jars", jar)
            .set("spark.ui.enabled", "false")
            .set("spark.ui.showConsoleProgress", "false")
            .set("spark.driver.extraJavaOptions", java_options)
            .set("spark.driver.memory", self.driver_memory)
            .set(
                "spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
            )
        )
        if is_local(self.master):
            # Python workers run this interpreter (it has pg2sink), and Spark binds to
            # loopback instead of warning about the host name
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            # workers import pyspark's compiled modules, not pyspark.zip's source
            conf.set("spark.python.daemon.module", "pg2sink.imports.spark_daemon")
        log.info("starting Spark (master %s)", self.master)
        # The JVM (and the local Python workers it forks) write to a pipe that pg2sink
        # reads into its own log, instead of to pg2sink's stderr: a --log-format json
        # log stays all JSON, and a worker's traceback still reaches the user.
        # (once per process: a session started again after close() reuses that JVM)
        try:
            if SparkContext._gateway is None:
                check_java_home()
                recording = "ArchiveClassesAtExit" in self.class_archive_option
                popen = _gateway_popen(archive if recording else None)
                gateway: Any = launch_gateway(conf, popen_kwargs=popen)  # type: ignore[no-untyped-call]
                threading.Thread(
                    target=_log_console,
                    args=(gateway.proc.stdout,),
                    name="spark-console",
                    daemon=True,
                ).start()
                if recording and archive is not None:
                    archive.release_at_exit(gateway.proc)
                SparkContext(gateway=gateway, conf=conf)
            spark = SparkSession.builder.config(conf=conf).getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            quiet_accumulator_server(spark.sparkContext)
        except SparkSessionLost:
            self.discard()
            raise
        except Exception as e:
            why = self._death(e) or one_line(e)
            self.discard()
            raise SparkSessionLost(f"Spark's driver JVM did not start: {why}") from None
        self.startup_seconds = time.monotonic() - started
        log.info("Spark started in %.1fs", self.startup_seconds)
        self._spark = spark
        return spark

    def _class_archive(self, java_options: str) -> ClassArchive | None:
        """The driver JVM's class archive; None if it is off."""
        where = self.class_cache or os.environ.get(CLASS_CACHE_ENV) or None
        if where == "off":
            return None
        directory = Path(where) if where else default_cache_dir()
        return ClassArchive(directory, archive_key(java_options))

    def close(self) -> None:
        spark, self._spark = self._spark, None
        if spark is not None:
            spark.stop()

    def discard(self) -> None:
        """Drop the session and its driver JVM, dead or alive, so that the next session()
        starts a new one."""
        spark, self._spark = self._spark, None
        discard_session(spark)

    def _death(self, error: BaseException) -> str | None:
        """What died, in one line, when `error` means the session is lost; None for a
        failure of the job itself (supervision.session_death)."""
        return session_death(error, self.master, self.driver_memory)

    # -- a job -----------------------------------------------------------------------

    def run(self, task: ImportTask, progress: Callable[[int], None] | None = None) -> int:
        """Import the task's partitions; rows written. ImportFailed (one line) on failure.

        `progress(rows)` is called, from a thread of the runner, with the rows of the
        partitions finished since its last call."""
        problem = task.target.problem()
        if problem is not None:
            raise ImportFailed(problem)
        if not task.partitions:
            return 0
        secrets = _secrets(task.source_dsn) + _secrets(task.jobs_dsn)
        watchdog: Watchdog | None = None
        try:
            spark = self.session()
            watchdog = Watchdog(self.master, spark) if not is_local(self.master) else None
            return self._run(task, spark, progress)
        except (SparkSessionLost, ConfigError):
            raise
        except Exception as e:
            died = (watchdog.lost if watchdog is not None else None) or self._death(e)
            if died is not None:
                self.discard()
                raise SparkSessionLost(_redact(died, secrets)) from None
            if isinstance(e, ImportFailed):
                raise
            if isinstance(e, Pg2SinkError):
                raise ImportFailed(_redact(str(e), secrets)) from None
            raise ImportFailed(
                f"import of {task.plan.schema}.{task.plan.table} failed: "
                + _redact(one_line(e), secrets)
            ) from None
        finally:
            if watchdog is not None:
                watchdog.stop()

    def _run(self, task: ImportTask, spark: Any, progress: Callable[[int], None] | None) -> int:
        t0 = time.monotonic()
        budget = task_buffer_bytes(self.master, self.driver_memory)
        with psycopg.connect(
            task.source_dsn, autocommit=True, application_name="pg2sink import"
        ) as conn:
            job = self._partition_job(conn, task)
            width = row_width(conn, task.plan)
            url, props = jdbc_reader(conn, task.snapshot, fetch_rows(width, budget))
            queries = [
                text_query(conn, task.plan, task.plan.predicates[n]) for n in task.partitions
            ]
        log.debug(
            "import of %s.%s: rows up to ~%d bytes, %s rows a fetch, %d bytes a batch",
            *_name(task),
            width,
            props["fetchsize"],
            budget,
        )
        # an Arrow batch to a Python worker: at most `budget` bytes, whatever the rows
        spark.conf.set("spark.sql.execution.arrow.maxBytesPerBatch", str(budget))
        # the Schema record, durable before any row; the target the executors get
        job = dataclasses.replace(job, target=task.target.begin(job.table.schema))
        reader = (
            spark.read.format("jdbc")
            .option("url", url)
            .options(**props)
            .option("customSchema", binary_schema(len(task.plan.columns)))
        )
        frames = [reader.option("dbtable", f"({q}) AS t").load() for q in queries]
        frame = functools.reduce(lambda a, b: a.union(b), frames)
        from pg2sink.imports.writers import write_partition

        out = frame.mapInArrow(functools.partial(write_partition, job), "partition int, rows long")
        log.debug("import of %s.%s: Spark job ready in %.2fs", *_name(task), time.monotonic() - t0)
        poller = _ProgressPoller(task, progress) if progress is not None else None
        try:
            results = out.collect()
        finally:
            if poller is not None:
                poller.stop()
        rows = sum(int(r["rows"]) for r in results)
        log.info(
            "import of %s.%s: %d rows in %d partitions written",
            task.plan.schema,
            task.plan.table,
            rows,
            len(results),
        )
        return rows

    def _partition_job(self, conn: psycopg.Connection[TupleRow], task: ImportTask) -> PartitionJob:
        plan = task.plan
        cache = TypeCache(conn)
        types = tuple(cache.get(c.type_oid) or unknown_type(c.type_oid) for c in plan.columns)
        typmods = tuple(c.typmod for c in plan.columns)
        key = set(plan.primary_key)
        schema = avro_row_schema(
            plan.schema,
            plan.table,
            [
                RowColumn(c.name, codec_for(t, c.typmod), c.name in key)
                for c, t in zip(plan.columns, types, strict=True)
            ],
            primary_key=plan.primary_key,
        )
        masks = {c.name: c.mask for c in plan.columns if c.mask is not None}
        if masks:  # as the stream's Schema records say (routing.rules.Rules.annotate)
            schema = annotate_schema(schema, masks)
        when, lsn = _snapshot_position(conn, task)
        record = Schema(
            timestamp=when,
            lsn=lsn,
            namespace=plan.schema,
            name=plan.table,
            schema=schema,
            primary_key=plan.primary_key,
        )
        return PartitionJob(
            job_id=task.job_id,
            internal_schema=task.internal_schema,
            state_dsn=task.jobs_dsn,
            table=ImportTable(record, types, typmods),
            target=task.target,
            partitions=task.partitions,
        )


def _snapshot_position(
    conn: psycopg.Connection[TupleRow], task: ImportTask
) -> tuple[datetime, int]:
    """The job's snapshot time and WAL position (jobs.record_snapshot); now and 0 if none."""
    row = conn.execute(
        sql.SQL("SELECT snapshot_time, snapshot_lsn - '0/0' FROM {} WHERE id = %s").format(
            sql.Identifier(task.internal_schema, "import_jobs")
        ),
        (task.job_id,),
    ).fetchone()
    when = row[0] if row is not None and row[0] is not None else datetime.now(UTC)
    lsn = int(row[1]) if row is not None and row[1] is not None else 0
    return when.astimezone(UTC), lsn


class _ProgressPoller:
    """Calls progress with the rows of partitions marked done since the last call."""

    def __init__(self, task: ImportTask, progress: Callable[[int], None]) -> None:
        self._task = task
        self._progress = progress
        self._reported = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="pg2sink-import-progress", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        try:
            with psycopg.connect(self._task.jobs_dsn, autocommit=True) as conn:
                while not self._stop.wait(PROGRESS_POLL):
                    self._poll(conn)
                self._poll(conn)
        except psycopg.Error as e:
            log.debug("import progress polling stopped: %s", type(e).__name__)

    def _poll(self, conn: psycopg.Connection[TupleRow]) -> None:
        row = conn.execute(
            sql.SQL(
                "SELECT coalesce(sum(rows), 0) FROM {} WHERE job_id = %s AND done"
                " AND partition = ANY(%s)"
            ).format(sql.Identifier(self._task.internal_schema, "import_partitions")),
            (self._task.job_id, list(self._task.partitions)),
        ).fetchone()
        done = int(row[0]) if row is not None else 0
        if done > self._reported:
            self._progress(done - self._reported)
            self._reported = done

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _name(task: ImportTask) -> tuple[str, str]:
    return task.plan.schema, task.plan.table


def _secrets(dsn: str) -> list[str]:
    """The DSN's password and sslpassword (both reach the JDBC readers)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return []
    return [str(params[k]) for k in ("password", "sslpassword") if params.get(k)]


#: Lines of Spark's console output worth a warning; the rest (start-up notes) is debug.
_CONSOLE_PROBLEM = re.compile(rb"\b(ERROR|FATAL|Exception|Error|Traceback)\b")


#: Lines of a Java or Python stack trace past its first: debug (the first says it).
_TRACE_LINE = re.compile(rb"^\s+(at |\.\.\. \d+ (more|common frames)|File \")|^Caused by: ")


def _log_console(stream: IO[bytes]) -> None:
    """Spark's JVM console output, a line at a time, into pg2sink's log (a thread); the
    pipe closed once the JVM and its workers are gone (a lost session leaks no file)."""
    with stream:
        for raw in stream:
            line = raw.rstrip().decode(errors="replace")
            if line:
                problem = _CONSOLE_PROBLEM.search(raw) and not _TRACE_LINE.match(raw)
                log.log(logging.WARNING if problem else logging.DEBUG, "spark: %s", line)


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _gateway_popen(recording: ClassArchive | None) -> dict[str, Any]:
    """launch_gateway's Popen arguments: the console into a pipe, and for a JVM that
    records the class archive its keeper (class_archive.py) in spark-submit's place."""
    popen: dict[str, Any] = {"stdout": PIPE, "stderr": STDOUT}
    if recording is not None:
        from pyspark.find_spark_home import _find_spark_home

        submit = os.path.join(_find_spark_home(), "bin", "spark-submit")
        popen["executable"] = recording.keeper(submit)
    return popen
