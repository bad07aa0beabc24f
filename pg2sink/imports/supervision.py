"""How a lost Spark session is told apart from a failed job, and said in one line.

The import engine owns the Spark session's life (docs/imports.md, "When Spark dies"):
SparkRunner raises SparkSessionLost when the driver JVM died, its py4j gateway broke, its
context was stopped, a cluster's master or executors were lost (the _Watchdog of a
cluster session), or its heap ran out; the engine then starts a new session. py4j's and
pyspark's own tracebacks are kept out of the log (_Py4jQuiet), so that each failure is
one line that says what died and what happens next.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import warnings
from subprocess import TimeoutExpired
from typing import Any

from pg2sink.errors import ImportFailed
from pg2sink.imports.driver import is_local

log = logging.getLogger(__name__)

#: How often the watchdog looks at a cluster session during a job, in seconds, and how
#: long it waits for an unreachable master or a session without executors.
WATCH_INTERVAL = 2.0
MASTER_LOST_AFTER = 6.0
NO_EXECUTORS_AFTER = 90.0


class SparkSessionLost(ImportFailed):
    """The Spark session is gone (its driver JVM died, its py4j gateway broke, its
    context was stopped, its cluster master or executors were lost, its heap ran out):
    the runner dropped it, and the next session() starts a new one. The message says
    what died, in one line."""


#: py4j's errors for a call that got no answer from the JVM (their type names).
PY4J_BROKEN = frozenset({"Py4JNetworkError", "Py4JError"})
#: Exit codes of a JVM that an OutOfMemoryError ended: Spark's (SparkExitCode.OOM) and
#: HotSpot's under -XX:+ExitOnOutOfMemoryError (DRIVER_OOM).
OOM_EXIT_CODES = (52, 3)
#: Seconds a JVM whose session is lost gets to exit, so that its exit code says why.
EXIT_WAIT = 10.0
#: Texts of errors that mean the session is lost, and what to say about them.
LOST_MARKERS = (
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
            record.msg = f"{record.getMessage()}: {one_line(record.exc_info[1])}"
            record.args = None
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        # a handler without a level would still print it: only when pg2sink logs debug
        return log.isEnabledFor(logging.DEBUG)


_PY4J_LOGGERS = ("py4j", "py4j.java_gateway", "py4j.clientserver", "py4j.protocol", "")
_PY4J_SOURCE = f"{os.sep}py4j{os.sep}"


def quiet_py4j() -> None:
    """Install _Py4jQuiet on py4j's loggers (a logger's filter sees its own records only)."""
    for name in _PY4J_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Py4jQuiet) for f in logger.filters):
            logger.addFilter(_Py4jQuiet())


def quiet_accumulator_server(context: Any) -> None:
    """pyspark's accumulator server (a socketserver) prints a traceback to stderr when
    the JVM's connection to it breaks (the JVM died): one debug line instead."""
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:

        def handle_error(request: Any, address: Any) -> None:
            log.debug("Spark's accumulator connection from %s broke", address)

        server.handle_error = handle_error


def check_java_home() -> None:
    """A JAVA_HOME without bin/java: SparkSessionLost saying so (Spark's launcher would
    fail with pages of shell errors)."""
    home = os.environ.get("JAVA_HOME")
    if home and not os.access(os.path.join(home, "bin", "java"), os.X_OK):
        raise SparkSessionLost(
            f"Spark's driver JVM cannot start: JAVA_HOME={home} has no bin/java "
            "(set JAVA_HOME to a Java 17+ installation, or unset it to use the java on PATH)"
        )


_ERROR_LINE = re.compile(
    r"(pg2sink\.errors\.\w+|org\.postgresql\.util\.PSQLException|psycopg\.[\w.]+): (.+)"
)


def one_line(e: BaseException) -> str:
    """The cause of a Spark failure in one line (Spark wraps executor errors in pages of
    Java and Python stack traces)."""
    text = str(e)
    found = _ERROR_LINE.search(text)
    if found:
        return f"{found.group(1).rsplit('.', 1)[-1]}: {found.group(2).strip()}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


class Watchdog:
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


def discard_session(spark: Any) -> None:
    """Drop the session `spark` (None when it never started) and its driver JVM, dead
    or alive, so that the next session() starts a new one (pyspark keeps the JVM's
    gateway in class attributes)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

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


def session_death(error: BaseException, master: str, driver_memory: str) -> str | None:
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
    broken = isinstance(error, OSError) or type(error).__name__ in PY4J_BROKEN
    marked = any(marker in text for marker, _ in LOST_MARKERS)
    if proc is not None and code is None and (broken or marked):
        # a broken gateway or a stopped context a moment before the JVM exits (after
        # an OutOfMemoryError Spark stops the context, then exits with 52): say what
        # ended it rather than what broke on the way
        try:
            code = proc.wait(EXIT_WAIT)
        except TimeoutExpired:
            code = None
    if "OutOfMemoryError" in text or code in OOM_EXIT_CODES:
        if is_local(master):
            return (
                f"Spark's driver JVM ran out of memory (heap {driver_memory}): "
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
        return f"the py4j gateway to Spark's driver JVM broke ({one_line(error)})"
    for marker, what in LOST_MARKERS:
        if marker in text:
            return what
    return None
