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
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from subprocess import PIPE, STDOUT, TimeoutExpired
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
from pg2sink.imports.reads import binary_schema, fetch_rows, jdbc_reader, row_width, text_query
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
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
#: The driver JVM's collector: the throughput one, not Java 17's default G1, whose
#: concurrent work and write barriers an import of short-lived rows pays for (about 15%
#: less CPU for a local import; `make bench-import`). Executors on a cluster keep their own.
DRIVER_GC = "-XX:+UseParallelGC"
#: Its heap on transparent huge pages where the kernel gives them on request (Linux's
#: `madvise` or `always` mode): a local import about 8% less CPU. Not asked for where the
#: kernel never gives them (the JVM would print a warning for nothing).
DRIVER_HUGE_PAGES = "-XX:+UseTransparentHugePages"
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
#: The C2 compiler takes a method at three times HotSpot's default thresholds: a
#: session's first import otherwise spends seconds of CPU compiling methods that ran for
#: planning or a moment, while the rows' hot loops still reach C2 within the first
#: partition (`make bench-import`).
DRIVER_JIT = (
    "-XX:Tier4InvocationThreshold=15000 -XX:Tier4CompileThreshold=20000 "
    "-XX:Tier4BackEdgeThreshold=120000"
)
#: An OutOfMemoryError in any of the driver's threads ends the JVM at once (exit code 3):
#: otherwise a heap that is nearly full can keep it collecting garbage for minutes
#: ("GC overhead limit exceeded" in a heartbeat thread) while the import stalls, where a
#: JVM that exits is found lost and replaced.
DRIVER_OOM = "-XX:+ExitOnOutOfMemoryError"
#: The driver's heap without --spark-driver-memory: this share of the machine's memory
#: (or of the cgroup's limit), within the bounds below. Spark's own default (1g) is what
#: a local import of 200 KB rows ran out of on a busy machine.
DRIVER_MEMORY_SHARE = 4
DRIVER_MEMORY_MIN = 1 << 30
DRIVER_MEMORY_MAX = 16 << 30
#: Bytes one task reads (a JDBC fetch) or hands to its Python worker (an Arrow batch) at
#: once: the driver's heap over this many per task running at once, within the bounds
#: below. A task holds about three such buffers (the fetched rows, Spark's copies, the
#: Arrow batch being built).
TASK_BUFFER_SHARE = 8
TASK_BUFFER_MIN = 4 << 20
TASK_BUFFER_MAX = 64 << 20
#: A cluster's executors have their own heap (spark.executor.memory, 1g by default).
CLUSTER_TASK_BUFFER = 32 << 20
#: How often the watchdog looks at a cluster session during a job, in seconds, and how
#: long it waits for an unreachable master or a session without executors.
WATCH_INTERVAL = 2.0
MASTER_LOST_AFTER = 6.0
NO_EXECUTORS_AFTER = 90.0


def driver_java_options() -> str:
    """spark.driver.extraJavaOptions: the log configuration, the collector, the C2
    thresholds, the exit on OutOfMemoryError, huge pages."""
    options = [
        f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
        DRIVER_GC,
        DRIVER_JIT,
        DRIVER_OOM,
    ]
    try:
        huge_pages = "[never]" not in THP_SETTING.read_text()
    except OSError:  # not Linux, or no THP support
        huge_pages = False
    if huge_pages:
        options.append(DRIVER_HUGE_PAGES)
    return " ".join(options)


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return int(total)


def driver_heap(configured: str | None) -> str:
    """spark.driver.memory: --spark-driver-memory, else a share of the machine's memory."""
    if configured:
        return configured
    share = machine_memory() // DRIVER_MEMORY_SHARE
    return f"{min(DRIVER_MEMORY_MAX, max(DRIVER_MEMORY_MIN, share)) >> 20}m"


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_bytes(size: str) -> int:
    """A JVM memory size (options.parse_jvm_memory's form) in bytes."""
    unit = size[-1] if size[-1] in _UNITS else ""
    return int(size[: len(size) - len(unit)]) * _UNITS[unit]


def task_buffer_bytes(master: str, heap: str) -> int:
    """The bytes a task reads or batches at once (TASK_BUFFER_SHARE)."""
    if not _is_local(master):
        return CLUSTER_TASK_BUFFER
    tasks = max(1, target_partitions(master) // PARTITIONS_PER_CORE)
    share = memory_bytes(heap) // (TASK_BUFFER_SHARE * tasks)
    return min(TASK_BUFFER_MAX, max(TASK_BUFFER_MIN, share))


class SparkSessionLost(ImportFailed):
    """The Spark session is gone (its driver JVM died, its py4j gateway broke, its
    context was stopped, its cluster master or executors were lost, its heap ran out):
    the runner dropped it, and the next session() starts a new one. The message says
    what died, in one line."""


#: py4j's errors for a call that got no answer from the JVM (their type names).
_PY4J_BROKEN = frozenset({"Py4JNetworkError", "Py4JError"})
#: Exit codes of a JVM that an OutOfMemoryError ended: Spark's (SparkExitCode.OOM) and
#: HotSpot's under -XX:+ExitOnOutOfMemoryError (DRIVER_OOM).
OOM_EXIT_CODES = (52, 3)
#: Seconds a JVM whose session is lost gets to exit, so that its exit code says why.
EXIT_WAIT = 10.0
#: Texts of errors that mean the session is lost, and what to say about them.
_LOST_MARKERS = (
    ("Answer from Java side is empty", "the py4j gateway to Spark's driver JVM broke"),
    ("SparkContext was shut down", "Spark's context was shut down"),
    ("stopped SparkContext", "Spark's context was stopped"),
    ("Master removed our application", "the Spark master removed pg2sink's application"),
    ("All masters are unresponsive", "the Spark master is unreachable"),
    ("JAVA_GATEWAY_EXITED", "the JVM exited before it started (see the spark: lines above)"),
    ("Java gateway process exited", "the JVM exited before it started (see the spark: lines)"),
)


class _Py4jQuiet(logging.Filter):
    """py4j's own log records (a traceback per broken call, INFO to ERROR, some through
    the root logger) as one DEBUG line each: the runner says in one line what died and
    what happens next."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("py4j") and _PY4J_SOURCE not in record.pathname:
            return True
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.getMessage()}: {_one_line(record.exc_info[1])}"
            record.args = None
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        # a handler without a level would still print it: only when pg2sink logs debug
        return log.isEnabledFor(logging.DEBUG)


_PY4J_LOGGERS = ("py4j", "py4j.java_gateway", "py4j.clientserver", "py4j.protocol", "")
_PY4J_SOURCE = f"{os.sep}py4j{os.sep}"


def _quiet_py4j() -> None:
    """Install _Py4jQuiet on py4j's loggers (a logger's filter sees its own records only)."""
    for name in _PY4J_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Py4jQuiet) for f in logger.filters):
            logger.addFilter(_Py4jQuiet())


def _quiet_accumulator_server(context: Any) -> None:
    """pyspark's accumulator server (a socketserver) prints a traceback to stderr when
    the JVM's connection to it breaks (the JVM died): one debug line instead."""
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:

        def handle_error(request: Any, address: Any) -> None:
            log.debug("Spark's accumulator connection from %s broke", address)

        server.handle_error = handle_error


def _check_java_home() -> None:
    """A JAVA_HOME without bin/java: SparkSessionLost saying so (Spark's launcher would
    fail with pages of shell errors)."""
    home = os.environ.get("JAVA_HOME")
    if home and not os.access(os.path.join(home, "bin", "java"), os.X_OK):
        raise SparkSessionLost(
            f"Spark's driver JVM cannot start: JAVA_HOME={home} has no bin/java "
            "(set JAVA_HOME to a Java 17+ installation, or unset it to use the java on PATH)"
        )


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
#: finish; each more costs a task (a fraction of a second of JVM and Python CPU) for no
#: faster import (docs/benchmarks.md).
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
        _quiet_py4j()
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
        try:
            if SparkContext._gateway is None:
                _check_java_home()
                gateway: Any = launch_gateway(  # type: ignore[no-untyped-call]
                    conf, popen_kwargs={"stdout": PIPE, "stderr": STDOUT}
                )
                threading.Thread(
                    target=_log_console,
                    args=(gateway.proc.stdout,),
                    name="spark-console",
                    daemon=True,
                ).start()
                if archive is not None and "ArchiveClassesAtExit" in self.class_archive_option:
                    archive.finish_at_exit(gateway.proc)
                SparkContext(gateway=gateway, conf=conf)
            spark = SparkSession.builder.config(conf=conf).getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            _quiet_accumulator_server(spark.sparkContext)
        except SparkSessionLost:
            self.discard()
            raise
        except Exception as e:
            why = self._death(e) or _one_line(e)
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
        starts a new one (pyspark keeps the JVM's gateway in class attributes)."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        spark, self._spark = self._spark, None
        gateway: Any = SparkContext._gateway
        proc = getattr(gateway, "proc", None)
        if spark is not None and proc is not None and proc.poll() is None:
            try:
                with warnings.catch_warnings():  # pyspark warns of a JVM that is dying
                    warnings.simplefilter("ignore")
                    spark.stop()
            except Exception as e:  # a broken gateway: the JVM is killed below
                log.debug("stopping the Spark session: %s", type(e).__name__)
        if gateway is not None:
            try:
                gateway.close()
            except Exception as e:
                log.debug("closing the py4j gateway: %s", type(e).__name__)
        if proc is not None and proc.poll() is None:
            proc.kill()
            try:
                proc.wait(30)
            except TimeoutExpired:
                log.warning("Spark's driver JVM (pid %d) did not exit after SIGKILL", proc.pid)
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()  # the JVM's end of life signal, of no use to a dead one
        SparkContext._gateway = None
        SparkContext._jvm = None
        SparkContext._active_spark_context = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None

    def _death(self, error: BaseException) -> str | None:
        """What died, in one line, when `error` means the session is lost (its JVM dead,
        its gateway broken, its context stopped, its cluster gone, its heap exhausted);
        None for a failure of the job itself (the sink, the data, PostgreSQL)."""
        from pyspark import SparkContext

        text = str(error)
        proc = getattr(SparkContext._gateway, "proc", None)
        code = proc.poll() if proc is not None else None
        # py4j gives a call whose connection broke as Py4JNetworkError, or, once it
        # logged that, as a bare Py4JError ("An error occurred while calling o50.conf");
        # a Py4JJavaError is an answer from a live JVM
        broken = isinstance(error, OSError) or type(error).__name__ in _PY4J_BROKEN
        marked = any(marker in text for marker, _ in _LOST_MARKERS)
        if proc is not None and code is None and (broken or marked):
            # a broken gateway or a stopped context a moment before the JVM exits (after
            # an OutOfMemoryError Spark stops the context, then exits with 52): say what
            # ended it rather than what broke on the way
            try:
                code = proc.wait(EXIT_WAIT)
            except TimeoutExpired:
                code = None
        if "OutOfMemoryError" in text or code in OOM_EXIT_CODES:
            if _is_local(self.master):
                return (
                    f"Spark's driver JVM ran out of memory (heap {self.driver_memory}): "
                    "raise --spark-driver-memory"
                )
            return (
                "a Spark JVM ran out of memory: raise --spark-driver-memory, or the "
                "cluster's spark.executor.memory if an executor's heap ran out"
            )
        if proc is not None and code is not None:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            return f"Spark's driver JVM (pid {proc.pid}) {how}"
        try:
            from py4j.protocol import Py4JNetworkError  # type: ignore[import-untyped]
        except ImportError:  # no pyspark: session() said so
            return None
        if isinstance(error, Py4JNetworkError | ConnectionError):
            return f"the py4j gateway to Spark's driver JVM broke ({_one_line(error)})"
        for marker, what in _LOST_MARKERS:
            if marker in text:
                return what
        return None

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
        watchdog: _Watchdog | None = None
        try:
            spark = self.session()
            watchdog = _Watchdog(self.master, spark) if not _is_local(self.master) else None
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
                + _redact(_one_line(e), secrets)
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


class _Watchdog:
    """Watches a cluster session during a job: a master that stops accepting connections
    (MASTER_LOST_AFTER) or a session left without executors (NO_EXECUTORS_AFTER) is
    lost, and its jobs are cancelled, which ends the job's collect() (Spark itself would
    wait for the master or for resources forever)."""

    def __init__(self, master: str, spark: Any) -> None:
        self.lost: str | None = None
        self._master = master
        self._context = spark.sparkContext
        self._address = _master_address(master)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="spark-watchdog", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        unreachable_since: float | None = None
        idle_since: float | None = None
        while not self._stop.wait(WATCH_INTERVAL):
            now = time.monotonic()
            if self._address is not None and not _accepts(self._address):
                unreachable_since = unreachable_since or now
                if now - unreachable_since >= MASTER_LOST_AFTER:
                    self._lose(f"the Spark master {self._master} stopped accepting connections")
                    return
            else:
                unreachable_since = None
            try:
                executors = int(self._context._jsc.sc().getExecutorIds().size())
            except Exception:  # the JVM is gone: the job's own call says so
                return
            if executors == 0:
                idle_since = idle_since or now
                if now - idle_since >= NO_EXECUTORS_AFTER:
                    self._lose(
                        f"the Spark session had no executor for {NO_EXECUTORS_AFTER:.0f}s "
                        "(the cluster lost its workers)"
                    )
                    return
            else:
                idle_since = None

    def _lose(self, why: str) -> None:
        self.lost = why
        try:
            self._context.cancelAllJobs()
        except Exception as e:
            log.debug("cancelling the lost session's jobs: %s", type(e).__name__)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WATCH_INTERVAL + 5)


def _master_address(master: str) -> tuple[str, int] | None:
    """(host, port) of a spark:// master URL (the first of a list); None for others."""
    if not master.startswith("spark://"):
        return None
    first = master[len("spark://") :].split(",")[0]
    host, _, port = first.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def _accepts(address: tuple[str, int]) -> bool:
    """Whether a TCP connection to `address` opens within a second."""
    try:
        with socket.create_connection(address, timeout=1.0):
            return True
    except OSError:
        return False


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
