"""The Spark driver JVM's settings: its options, its heap, the bytes a task holds at once,
how many partitions an import asks for, and where the PostgreSQL JDBC driver is.

These are the machine tuning of imports (docs/imports.md, "Memory" and "The driver
JVM"): each default is a constant here with the reason it was chosen, and the heap is an
option (--spark-driver-memory).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

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
#: a local import of 200 KB rows ran out of on a busy machine before the task budgets
#: below bounded reads by bytes. More than 2g only costs the JVM CPU (its young
#: generation grows with the heap): `BENCH_CPU_BY_PROCESS=1 make bench-import
#: ARGS="--sink kafka --spark-driver-memory 6g"` against 2g.
DRIVER_MEMORY_SHARE = 4
DRIVER_MEMORY_MIN = 1 << 30
DRIVER_MEMORY_MAX = 2 << 30
#: Bytes one task reads (a JDBC fetch) or hands to its Python worker (an Arrow batch) at
#: once: the driver's heap over this many per task running at once, within the bounds
#: below. A task holds about three such buffers (the fetched rows, Spark's copies, the
#: Arrow batch being built).
TASK_BUFFER_SHARE = 8
TASK_BUFFER_MIN = 4 << 20
TASK_BUFFER_MAX = 64 << 20
#: A cluster's executors have their own heap (spark.executor.memory, 1g by default).
CLUSTER_TASK_BUFFER = 32 << 20


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
    if not is_local(master):
        return CLUSTER_TASK_BUFFER
    tasks = max(1, target_partitions(master) // PARTITIONS_PER_CORE)
    share = memory_bytes(heap) // (TASK_BUFFER_SHARE * tasks)
    return min(TASK_BUFFER_MAX, max(TASK_BUFFER_MIN, share))


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


def is_local(master: str) -> bool:
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
    if not is_local(master):
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
