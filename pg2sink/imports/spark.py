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
import glob
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
from pg2sink.imports.plan import ImportPlan
from pg2sink.imports.reads import binary_schema, jdbc_reader, text_query
from pg2sink.imports.writers import PartitionJob
from pg2sink.routing.masking import annotate_schema
from pg2sink.sinks.base import ImportTarget

__all__ = [
    "ImportTask",
    "SparkRunner",
    "default_jdbc_driver",
]

log = logging.getLogger(__name__)

#: How often the driver polls finished partitions for `progress`, in seconds.
PROGRESS_POLL = 1.0
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
#: The driver JVM's collector: the throughput one, not Java 17's default G1, whose
#: concurrent work and write barriers an import of short-lived rows pays for. bench-import
#: (5M rows, file sink, local[*] on 2 cores, where the driver runs the tasks), CPU of
#: the first import: G1 17.83, 18.54 s; Parallel 15.85, 15.29, 15.08 s; Serial 16.13,
#: 16.12 s (docs/benchmarks.md, "Session 9"). Executors on a cluster keep their own.
DRIVER_GC = "-XX:+UseParallelGC"
#: Its heap on transparent huge pages where the kernel gives them on request (Linux's
#: `madvise` or `always` mode): the same import, alternating, 16.91 and 16.48 s without,
#: 14.54, 15.59 and 15.24 s with. Not asked for where the kernel never gives them (the
#: JVM would print a warning for nothing).
DRIVER_HUGE_PAGES = "-XX:+UseTransparentHugePages"
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
#: The C2 compiler takes a method later than HotSpot's defaults (5,000 calls, 15,000
#: calls and loops, 40,000 loop iterations; three times those here): a session's first
#: import spent 2.1-2.3 s of CPU in C2 on methods that ran for planning or a moment, and
#: the rows' hot loops still reach C2 within the first partition. bench-import (5M rows,
#: file sink, 2 cores, four alternating pairs): C2 2.2-2.3 -> 1.5 s of CPU, pg2sink's CPU
#: 14.5-15.9 -> 13.2-14.7 s; the first import's time 10.4-11.5 -> 10.0-11.0 s, within
#: the noise in two of the pairs; the second import's unchanged (docs/benchmarks.md,
#: "Session 10").
DRIVER_JIT = (
    "-XX:Tier4InvocationThreshold=15000 -XX:Tier4CompileThreshold=20000 "
    "-XX:Tier4BackEdgeThreshold=120000"
)


def driver_java_options() -> str:
    """spark.driver.extraJavaOptions: the log configuration, the collector, the C2
    thresholds, huge pages."""
    options = [f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}", DRIVER_GC, DRIVER_JIT]
    try:
        huge_pages = "[never]" not in THP_SETTING.read_text()
    except OSError:  # not Linux, or no THP support
        huge_pages = False
    if huge_pages:
        options.append(DRIVER_HUGE_PAGES)
    return " ".join(options)


def services_cache() -> Path:
    """The download cache of scripts/services.py (same environment variables)."""
    explicit = os.environ.get("PG2SINK_SERVICES_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pg2sink-services"


def default_jdbc_driver() -> str | None:
    """The PostgreSQL JDBC driver `make setup` put in the cache (scripts/jdbc_driver.py)."""
    found = sorted(glob.glob(str(services_cache() / "jdbc" / "postgresql-*.jar")))
    return found[-1] if found else None


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


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


#: Partitions of an import on a cluster master (at most; small tables get fewer).
CLUSTER_PARTITIONS = 16
#: Partitions per core of a local master: two keep every core busy while the last ones
#: finish; each more costs a task (~0.17 s of JVM and 0.1 s of Python CPU, measured).
#: bench-import, 5M rows on 2 cores: 4 partitions 0.31x COPY for the first import of a
#: fresh JVM and 0.47x for the next, 8 partitions 0.30x and 0.46x, 16 (the old fixed
#: number) 0.29x and 0.42x.
PARTITIONS_PER_CORE = 2


def target_partitions(master: str) -> int:
    """How many partitions an import asks for under Spark master `master`.

    A local master runs as many tasks at once as it has cores (`local[N]`, `local[*]`:
    all of this machine's, `local`: one), so twice that; a cluster's size is not known
    before its session starts, so CLUSTER_PARTITIONS. plan.plan_import still splits a
    big table further, so that a restarted import re-reads at most a few million rows
    per partition that was in flight."""
    if not _is_local(master):
        return CLUSTER_PARTITIONS
    spec = master[len("local[") : -1] if master.startswith("local[") else "1"
    if spec == "*":
        cores = os.cpu_count() or 1
    else:
        try:
            cores = int(spec.split(",")[0])  # local[N] or local[N,maxFailures]
        except ValueError:
            cores = os.cpu_count() or 1
    return PARTITIONS_PER_CORE * max(1, cores)


class SparkRunner:
    """Runs ImportTasks on Spark; see the module docstring."""

    def __init__(
        self,
        master: str = "local[*]",
        *,
        app_name: str = "pg2sink-import",
        jdbc_driver: str | None = None,
        class_cache: str | None = None,
    ) -> None:
        self.master = master
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
            .set(
                "spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
            )
        )
        if _is_local(self.master):
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
        if SparkContext._gateway is None:
            gateway: Any = launch_gateway(  # type: ignore[no-untyped-call]
                conf, popen_kwargs={"stdout": PIPE, "stderr": STDOUT}
            )
            threading.Thread(
                target=_log_console, args=(gateway.proc.stdout,), name="spark-console", daemon=True
            ).start()
            if archive is not None and "ArchiveClassesAtExit" in self.class_archive_option:
                archive.finish_at_exit(gateway.proc)
            SparkContext(gateway=gateway, conf=conf)
        spark = SparkSession.builder.config(conf=conf).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
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
        try:
            return self._run(task, progress)
        except (ImportFailed, ConfigError):
            raise
        except Pg2SinkError as e:
            raise ImportFailed(_redact(str(e), secrets)) from None
        except Exception as e:
            raise ImportFailed(
                f"import of {task.plan.schema}.{task.plan.table} failed: "
                + _redact(_one_line(e), secrets)
            ) from None

    def _run(self, task: ImportTask, progress: Callable[[int], None] | None) -> int:
        t0 = time.monotonic()
        with psycopg.connect(
            task.source_dsn, autocommit=True, application_name="pg2sink import"
        ) as conn:
            job = self._partition_job(conn, task)
            url, props = jdbc_reader(conn, task.snapshot)
            queries = [
                text_query(conn, task.plan, task.plan.predicates[n]) for n in task.partitions
            ]
        spark = self.session()
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


_ERROR_LINE = re.compile(
    r"(pg2sink\.errors\.\w+|org\.postgresql\.util\.PSQLException|psycopg\.[\w.]+): (.+)"
)


def _name(task: ImportTask) -> tuple[str, str]:
    return task.plan.schema, task.plan.table


def _one_line(e: BaseException) -> str:
    """The cause of a Spark failure in one line (Spark wraps executor errors in pages of
    Java and Python stack traces)."""
    text = str(e)
    found = _ERROR_LINE.search(text)
    if found:
        return f"{found.group(1).rsplit('.', 1)[-1]}: {found.group(2).strip()}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _secrets(dsn: str) -> list[str]:
    """The DSN's password and sslpassword (both reach the JDBC readers)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return []
    return [str(params[k]) for k in ("password", "sslpassword") if params.get(k)]


#: Lines of Spark's console output worth a warning; the rest (start-up notes) is debug.
_CONSOLE_PROBLEM = re.compile(rb"\b(ERROR|FATAL|Exception|Error|Traceback)\b")


def _log_console(stream: IO[bytes]) -> None:
    """Spark's JVM console output, a line at a time, into pg2sink's log (a thread)."""
    for raw in stream:
        line = raw.rstrip().decode(errors="replace")
        if line:
            level = logging.WARNING if _CONSOLE_PROBLEM.search(raw) else logging.DEBUG
            log.log(level, "spark: %s", line)


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
