"""`make bench-import`: a Spark snapshot import next to `COPY ... TO STDOUT` of the same table.

Method
------
1. Start a throwaway PostgreSQL (scripts/services.py, as bench-stream does) in a
   temporary directory and fill one table with bench-stream's column mix

       bench (id int8 primary key, name text, amount numeric(12,2),
              at timestamptz, flag bool, doc jsonb)

   with `--rows` rows (default 5,000,000; bench/stream.py's row expressions), then
   VACUUM ANALYZE it (hint bits and the visibility map set, so no reader pays for
   them) and read it once to warm the cache.
2. COPY: `psql -c "COPY (SELECT * FROM bench) TO STDOUT"` into /dev/null, the server's
   fastest way to hand a table's text to a client; timed from process start to exit.
3. pg2sink to the file sink: what the import engine does for a job (internal schema,
   job, exported snapshot, plan_import with `--partitions` partitions, partitions
   saved), then SparkRunner.run (`--spark-master`, default local[*]) into a JSON-lines
   file. Spark's start-up (the SparkSession, one JVM) is started and timed before the
   run and reported on its own line, with what the driver JVM did with its class
   archive (imports/class_archive.py: mapped, or recorded by this run for the next;
   `--spark-class-cache off`: none); the import's time is run() from call to return:
   every row durably written (fsynced) and every partition marked done. The file
   must hold exactly one Modification line per row.
4. `--sink kafka` (in the default, `both`: file and kafka): a Kafka broker and Apicurio
   Registry (scripts/services.py, started after the file run so they do not compete
   with it) and the same import with the Kafka sink (Avro, acks=all, idempotent
   producers, one per task); timed the same way (every message acknowledged); the topic
   must then hold exactly one message per row. The broker's CPU seconds during the run
   are reported beside pg2sink's.
5. `--sink duckdb`: the same import with the DuckDB sink's import target
   (sinks/duckdb/imports.py): each task stages its partition as a Parquet file next to
   the database, fsynced and renamed; timed the same way (every file staged, every
   partition marked done). The stream's sink loads staged files at its next commit: not
   part of the import's time. The staged files must hold exactly one row per row.
   `--sink` takes a comma-separated list (file,kafka,duckdb); `both` is file,kafka.

Report: rows/s of each, and the ratio of each import's rows/s to COPY's (issue #16's
targets: file sink >= 0.5, Kafka sink >= 0.25; issue #13's: DuckDB sink >= 0.3), Spark's
start-up separately, and the CPU seconds per row of pg2sink's processes (this one, the
driver, and Spark's JVM with its Python workers; not the broker and registry it
started) and PostgreSQL's (from /proc: load-proof, unlike the times);
BENCH_CPU_BY_PROCESS=1 also splits pg2sink's CPU by process kind (driver, java: Spark's
JVM, python: its Python workers) and BENCH_CPU_BY_THREAD=1 the JVM's by thread name.
`--repeat` runs COPY and each import that many times (alternating) and reports
medians. The machine's other load counts: the script prints the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from common import (
    CLOCK_TICKS,
    ROW_EXPRESSIONS,
    BenchError,
    Conn,
    KafkaTarget,
    count_modifications,
    cpu_seconds,
    create_bench_table,
    load_services,
    machine_info,
    pg_binary,
    run_benchmark,
    start_kafka,
    start_postgres,
    topic_message_count,
)
from psycopg import sql

from pg2sink.config import SecretDsn
from pg2sink.imports import jobs
from pg2sink.imports.driver import target_partitions
from pg2sink.imports.migrate import apply_migrations
from pg2sink.imports.plan import plan_import
from pg2sink.imports.snapshot import ExportedSnapshot, use_snapshot
from pg2sink.imports.spark import ImportTask, SparkRunner
from pg2sink.sinks.base import ImportTarget
from pg2sink.sinks.file.imports import FileImportTarget
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.imports import KafkaImportTarget

TABLE = "bench"
INTERNAL = "pg2sink"
PUBLICATION = "bench_pub"
DEFAULT_ROWS = 5_000_000
#: issues #16's and #13's targets: an import's rows/s over COPY's
TARGETS = {
    "pg2sink import, file sink": 0.5,
    "pg2sink import, Kafka sink": 0.25,
    "pg2sink import, DuckDB sink": 0.3,
}
SINKS = ("file", "kafka", "duckdb")


@dataclass
class Run:
    name: str
    seconds: float
    rows: int
    cpu: float | None = None
    """CPU seconds of this process tree (Spark's JVM and Python workers) during the run."""
    server_cpu: float | None = None
    """CPU seconds of the PostgreSQL server's process tree (its backends) during the run."""
    broker_cpu: float | None = None
    """CPU seconds of the Kafka broker during the run (Kafka runs only)."""

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def fill(conn: Conn, rows: int) -> None:
    create_bench_table(conn)
    t0 = time.monotonic()
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT {} FROM generate_series(1, {}::int8) AS g(i)").format(
            sql.Identifier(TABLE), ROW_EXPRESSIONS, sql.Literal(rows)
        )
    )
    conn.execute(sql.SQL("VACUUM (ANALYZE, FREEZE) {}").format(sql.Identifier(TABLE)))
    conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(TABLE)))
    print(f"  {rows:,} rows written and vacuumed in {time.monotonic() - t0:.1f}s", flush=True)


def tree_times(root: int) -> dict[int, tuple[str, float]]:
    """CPU seconds of `root` and every live descendant, each with its reaped children
    (utime + stime + cutime + cstime of /proc/<pid>/stat), by pid with the process name:
    a backend that ended is counted in its postmaster's cutime, a finished Python worker
    in its daemon's."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                text = f.read()
                fields = text.rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after "(comm)": ppid is [1], utime [11], stime [12], cutime [13], cstime [14]
        parents[int(entry)] = int(fields[1])
        names[int(entry)] = text.split("(", 1)[1].rsplit(")", 1)[0]
        times[int(entry)] = sum(int(x) for x in fields[11:15]) / CLOCK_TICKS
    found: dict[int, tuple[str, float]] = {}
    for pid, t in times.items():
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root:
            found[pid] = (names[pid], t)
    return found


def pg2sink_times(me: int) -> dict[int, tuple[str, float]]:
    """tree_times() of pg2sink's processes: this one (the driver) and Spark's JVM with
    its Python workers, not the Kafka broker and registry this process also started."""
    from pyspark import SparkContext

    gateway: Any = SparkContext._gateway
    times = tree_times(gateway.proc.pid)
    times[me] = tree_times(me)[me]
    return times


def cpu_by_process(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], root: int
) -> str:
    """CPU seconds spent between two tree_times() by kind of process: 'driver' for
    `root`, else the process name (java: Spark's JVM; python: its Python workers and
    their daemon; postgres: the server)."""
    kinds: dict[str, float] = {}
    for pid, (name, t) in after.items():
        kind = "driver" if pid == root else name
        kinds[kind] = kinds.get(kind, 0.0) + t
    # a process that ended moved its time into its parent's cutime, counted above
    for pid, (name, t) in before.items():
        kind = "driver" if pid == root else name
        kinds[kind] = kinds.get(kind, 0.0) - t
    return ", ".join(f"{kind} {t:.2f}s" for kind, t in sorted(kinds.items()) if t >= 0.005)


def java_threads(root: int) -> dict[str, float]:
    """CPU seconds of the threads of Spark's JVM (pg2sink_times' `java`), summed by
    thread name (as the kernel keeps it: 15 characters) with its numbers dropped (C2
    CompilerThread, GC Thread, Executor task launch worker, Thread-N: py4j's, the
    driver's planning and code generation...): where a JVM's time goes, without a
    profiler. A pool thread keeps the name it started with."""
    import re

    kinds: dict[str, float] = {}
    for pid, (name, _) in pg2sink_times(root).items():
        if name != "java":
            continue
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
                    text = f.read()
            except OSError:
                continue
            # numbers dropped, but C1's and C2's compiler threads told apart
            comm = re.sub(r"(?<!^C)[0-9]+", "#", text.split("(", 1)[1].rsplit(")", 1)[0]).strip()
            fields = text.rsplit(")", 1)[1].split()
            kinds[comm] = kinds.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return kinds


def thread_text(before: dict[str, float], after: dict[str, float]) -> str:
    """The JVM threads that used 0.05 s or more between two java_threads(), busiest first."""
    spent = {k: t - before.get(k, 0.0) for k, t in after.items()}
    return ", ".join(
        f"{k} {t:.2f}s" for k, t in sorted(spent.items(), key=lambda x: -x[1]) if t >= 0.05
    )


def postmaster_pid(conn: Conn) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    with open(f"/proc/{row[0]}/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def run_copy(psql: str, dsn: str, rows: int) -> Run:
    query = f"COPY (SELECT * FROM {TABLE}) TO STDOUT"
    t0 = time.monotonic()
    with open(os.devnull, "wb") as devnull:
        res = subprocess.run(
            [psql, "-X", "-q", "-d", dsn, "-c", query],
            stdout=devnull,
            stderr=subprocess.PIPE,
            check=False,
        )
    seconds = time.monotonic() - t0
    if res.returncode != 0:
        raise BenchError(f"psql COPY exited {res.returncode}: {res.stderr.decode().strip()}")
    return Run("COPY TO STDOUT (psql)", seconds, rows)


def run_import(
    runner: SparkRunner,
    dsn: str,
    sink: ImportTarget,
    partitions: int,
    name: str,
    broker_pid: int | None = None,
) -> Run:
    """One job as the engine runs it: job, snapshot, plan, partitions, then run();
    `broker_pid`: the Kafka broker whose CPU is counted too."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        job_id = jobs.request_import(conn, INTERNAL, PUBLICATION, "public", TABLE)
        snap = ExportedSnapshot.open(SecretDsn(dsn))
        try:
            jobs.record_snapshot(conn, INTERNAL, job_id, snap)
            with psycopg.connect(dsn, autocommit=True) as reader:
                use_snapshot(reader, snap.name)
                plan = plan_import(reader, "public", TABLE, target_partitions=partitions)
                reader.execute("ROLLBACK")
            jobs.save_partitions(conn, INTERNAL, job_id, plan.predicates, plan.rows_estimated)
            task = ImportTask(
                job_id,
                plan,
                tuple(range(len(plan.predicates))),
                snap.name,
                dsn,
                INTERNAL,
                sink,
            )
            server, me = postmaster_pid(conn), os.getpid()
            mine0, server0 = pg2sink_times(me), tree_times(server)
            broker0 = cpu_seconds(broker_pid) if broker_pid else None
            threads0 = java_threads(me) if os.environ.get("BENCH_CPU_BY_THREAD") else None
            t0 = time.monotonic()
            rows = runner.run(task)
            seconds = time.monotonic() - t0
            mine, server_times = pg2sink_times(me), tree_times(server)
            broker1 = cpu_seconds(broker_pid) if broker_pid else None
            cpu = sum(t for _, t in mine.values()) - sum(t for _, t in mine0.values())
            server_cpu = sum(t for _, t in server_times.values()) - sum(
                t for _, t in server0.values()
            )
            if os.environ.get("BENCH_CPU_BY_PROCESS"):
                print(f"    cpu by process: {cpu_by_process(mine0, mine, me)}", flush=True)
            if threads0 is not None:
                print(f"    JVM threads: {thread_text(threads0, java_threads(me))}", flush=True)
        finally:
            snap.close()
    broker = broker1 - broker0 if broker0 is not None and broker1 is not None else None
    return Run(name, seconds, rows, cpu, server_cpu, broker)


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    services = load_services()
    psql = pg_binary(services, "psql")
    use_file, use_kafka, use_duckdb = (s in args.sink for s in ("file", "kafka", "duckdb"))
    copies: list[Run] = []
    imports: dict[str, list[Run]] = {}
    with contextlib.ExitStack() as stack:
        server = start_postgres(services, tmp, stack)
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            info = machine_info(conn, "pg_recvlogical")
            print(f"table: {args.rows:,} rows of bench-stream's column mix ...", flush=True)
            fill(conn, args.rows)
        apply_migrations(SecretDsn(dsn), INTERNAL)
        runner = SparkRunner(
            args.spark_master,
            class_cache=args.spark_class_cache,
            driver_memory=args.spark_driver_memory,
        )
        stack.callback(runner.close)
        print(f"starting Spark ({args.spark_master}) ...", flush=True)
        runner.session()
        startup = runner.startup_seconds
        print(f"  Spark started in {startup:.1f}s ({archive_text(runner)})", flush=True)
        kafka: KafkaTarget | None = None
        for run in range(1, args.repeat + 1):
            step = f"run {run}/{args.repeat}"
            copy = run_copy(psql, dsn, args.rows)
            copies.append(copy)
            print(f"{step}: COPY {copy.seconds:.2f}s", flush=True)
            if use_file:
                out = tmp / f"import_{run}.jsonl"
                r = run_import(runner, dsn, FileImportTarget(str(out)), args.partitions, "file")
                mods, _lines = count_modifications(out)
                if mods != args.rows:
                    raise BenchError(f"{out} holds {mods} Modification lines, not {args.rows}")
                out.unlink()
                imports.setdefault("pg2sink import, file sink", []).append(r)
                print(
                    f"{step}: import to the file sink {r.seconds:.2f}s, {cpu_text(r)}", flush=True
                )
            if use_kafka:
                if kafka is None:
                    kafka = start_kafka(services, tmp, stack)
                prefix = f"bench{run}_{uuid.uuid4().hex[:8]}"
                cfg = KafkaConfig(
                    kafka.bootstrap_servers,
                    schema_registry_url=kafka.registry_url,
                    topic_prefix=prefix,
                )
                r = run_import(
                    runner, dsn, KafkaImportTarget(cfg), args.partitions, "kafka", kafka.broker_pid
                )
                topic = f"{prefix}.public.{TABLE}"
                n = topic_message_count(kafka.bootstrap_servers, topic)
                if n != args.rows:
                    raise BenchError(f"topic {topic} holds {n} messages, not {args.rows}")
                imports.setdefault("pg2sink import, Kafka sink", []).append(r)
                print(f"{step}: import to Kafka {r.seconds:.2f}s, {cpu_text(r)}", flush=True)
            if use_duckdb:
                r = run_duckdb(runner, dsn, tmp / f"import_{run}.duckdb", args)
                imports.setdefault("pg2sink import, DuckDB sink", []).append(r)
                print(f"{step}: import to DuckDB {r.seconds:.2f}s, {cpu_text(r)}", flush=True)
    return report(args, copies, imports, startup, runner.class_archive_option, info)


def run_duckdb(runner: SparkRunner, dsn: str, path: Path, args: argparse.Namespace) -> Run:
    """The import into the DuckDB sink's staging directory; checks the staged rows."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    from pg2sink.sinks.duckdb.imports import DuckDBImportTarget, staged_files, staging_dir

    r = run_import(runner, dsn, DuckDBImportTarget(str(path)), args.partitions, "duckdb")
    files = staged_files(str(path))
    staged = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    if staged != args.rows:
        raise BenchError(f"{len(files)} staged files hold {staged} rows, not {args.rows}")
    shutil.rmtree(staging_dir(str(path)))
    return r


def archive_text(runner: SparkRunner) -> str:
    """What the driver JVM did with its class archive (imports/class_archive.py)."""
    option = runner.class_archive_option
    if "SharedArchiveFile" in option:
        return "class archive mapped"
    if "ArchiveClassesAtExit" in option:
        return "recording the class archive: written at exit, later runs map it"
    return "no class archive"


def cpu_text(r: Run) -> str:
    """CPU per row of the run: pg2sink's process tree, PostgreSQL's and the broker's."""
    us = 1e6 / r.rows if r.rows else 0.0
    text = (
        f"CPU {r.cpu or 0.0:.2f}s pg2sink ({(r.cpu or 0.0) * us:.2f} us/row)"
        f" + {r.server_cpu or 0.0:.2f}s PostgreSQL ({(r.server_cpu or 0.0) * us:.2f} us/row)"
    )
    if r.broker_cpu is not None:
        text += f" + {r.broker_cpu:.2f}s Kafka broker ({r.broker_cpu * us:.2f} us/row)"
    return text


def report(
    args: argparse.Namespace,
    copies: list[Run],
    imports: dict[str, list[Run]],
    startup: float,
    class_archive_option: str,
    info: dict[str, Any],
) -> dict[str, Any]:
    copy_rate = statistics.median(r.rows_per_second for r in copies)
    print()
    print(
        f"bench-import: {args.rows:,} rows, {args.partitions} partitions, "
        f"--spark-master {args.spark_master}, {info['nproc']} CPUs ({info['cpu']}), "
        f"PostgreSQL {info['postgresql']}, load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'':32} {'seconds':>9} {'rows/s':>12} {'x COPY':>7}")
    print(
        f"{'COPY TO STDOUT (psql)':32} {statistics.median(r.seconds for r in copies):9.2f}"
        f" {copy_rate:12,.0f} {1.0:7.2f}"
    )
    figures: dict[str, Any] = {
        "rows": args.rows,
        "partitions": args.partitions,
        "spark_master": args.spark_master,
        "spark_startup_seconds": startup,
        "spark_class_archive_option": class_archive_option,
        "copy": {"seconds": [r.seconds for r in copies], "rows_per_second": copy_rate},
        "machine": info,
    }
    for name, runs in imports.items():
        rate = statistics.median(r.rows_per_second for r in runs)
        seconds = statistics.median(r.seconds for r in runs)
        print(f"{name:32} {seconds:9.2f} {rate:12,.0f} {rate / copy_rate:7.2f}")
        figures[name] = {
            "seconds": [r.seconds for r in runs],
            "cpu_seconds": [r.cpu for r in runs],
            "server_cpu_seconds": [r.server_cpu for r in runs],
            "broker_cpu_seconds": [r.broker_cpu for r in runs],
            "rows_per_second": rate,
            "ratio_to_copy": rate / copy_rate,
        }
    print(f"{'Spark start-up (once)':32} {startup:9.2f}")
    for name, target in TARGETS.items():
        if name in imports:
            ratio = statistics.median(r.rows_per_second for r in imports[name]) / copy_rate
            verdict = "met" if ratio >= target else "NOT met"
            print(f"target: {name[16:]} >= {target}x COPY: {verdict} ({ratio:.2f}x)")
    return figures


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="pg2sink's Spark snapshot import next to COPY TO STDOUT (see bench/README.md)."
    )
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="table size (default 5M)")
    p.add_argument(
        "--partitions",
        type=int,
        help="target partitions of the import (default: pg2sink's own choice for the "
        "master, spark.target_partitions: 2 per core of a local master)",
    )
    p.add_argument(
        "--sink",
        type=_sinks,
        default="both",
        help="comma-separated: file, kafka, duckdb; both = file,kafka (the default)",
    )
    p.add_argument("--spark-master", default="local[*]", help="default local[*]")
    p.add_argument(
        "--spark-class-cache",
        metavar="DIR",
        help="pg2sink's --spark-class-cache (default: $PG2SINK_SPARK_CLASS_CACHE, else "
        "pg2sink's default directory; off: start the driver JVM without a class archive)",
    )
    p.add_argument(
        "--spark-driver-memory",
        metavar="SIZE",
        help="the driver's heap (pg2sink's --spark-driver-memory; default: as pg2sink's)",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs of each (default 1)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args(argv)
    if args.partitions is None:
        args.partitions = target_partitions(args.spark_master)
    if args.rows < 1 or args.repeat < 1 or args.partitions < 1:
        p.error("--rows, --repeat and --partitions must be at least 1")
    return args


def _sinks(text: str) -> tuple[str, ...]:
    names = ("file", "kafka") if text == "both" else tuple(s.strip() for s in text.split(","))
    unknown = [n for n in names if n not in SINKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown sink {unknown}: choose from {SINKS}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench-import", parse_args(argv), bench, "pg2sink-import-")


if __name__ == "__main__":
    sys.exit(main())
