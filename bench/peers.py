"""`make bench-peers`: pg2sink next to Debezium Server, into the same Kafka broker.

Method
------
1. Start a throwaway PostgreSQL, a Kafka broker and Apicurio Registry
   (scripts/services.py through bench/common.py, as bench-stream does) in a temporary
   directory and warm the broker up (common.warm_up_broker). Debezium Server
   (`io.debezium:debezium-server-dist`, fetched once into the services cache by
   scripts/debezium.py) runs on the newest JDK >= 21 there, named explicitly
   (JAVA_HOME and PATH of its run.sh), with an application.properties written per run:
   the PostgreSQL connector (plugin.name=pgoutput, a slot and a publication of its own,
   publication.autocreate.mode=filtered, table.include.list=public.bench, offsets in a
   file flushed every second) and the Kafka sink (debezium.sink.type=kafka, the
   broker's address, String key/value serializers as its documentation configures
   them). Everything else is Debezium's default: JSON with schemas.enable=true,
   max.batch.size 2048, the JVM's default heap.
2. Snapshot (first, so that no streaming state is left in the database): one table
   `bench` of `--rows` rows (default 1,000,000) of bench-import's column mix
   (bench/import.py's fill: VACUUM FREEZE, read once), then
   - COPY TO STDOUT through psql into /dev/null, the floor (bench/import.py);
   - pg2sink's import into Kafka exactly as bench/import.py runs it (job, exported
     snapshot, plan, SparkRunner on local[*], Avro, acks=all), timed from run() to
     its return; Spark's start-up is printed on its own line and not counted;
   - Debezium Server's initial snapshot (snapshot.mode=initial, its own slot,
     publication and offsets file; JSON), timed from process start until the topic
     holds every row; the time to its first message shows its start-up.
   rows/s and CPU per row (pg2sink: the bench's own process tree, i.e. the Spark JVM
   and its Python workers; Debezium: its JVM), and ratios to Debezium's.
3. Streaming: the table is created again with bench-stream's workload (bench/stream.py:
   one 500,000-row INSERT transaction, one 250,000-row UPDATE transaction, 50,000
   single-row transactions; `--scale` multiplies all three, default 0.4). Every
   consumer's slot (pgoutput) and both publications (`bench_pub` for pg2sink, `dbz_pub`
   for Debezium) exist before the first change, so each consumer reads exactly the same
   changes. Then, one after the other, each on its own slot and topic prefix:
   - Debezium Server, JSON (snapshot.mode=no_data: only the slot's changes);
   - Debezium Server, Avro through Apicurio's converter against the bench's registry
     (Apicurio's v3 API; the distribution lacks Apache Avro's jar, which
     scripts/debezium.py fetches and the run puts on run.sh's lib/* class path;
     `--no-debezium-avro` skips it);
   - `pg2sink --sink kafka` with `--format avro` (acks=all, idempotent), `json`, and
     `debezium` when this pg2sink has that format.
   Each is timed from process start until its table topic holds every change (sum of
   the partitions' high watermarks, polled every 0.2 s); the tool's CPU seconds are
   utime+stime (with reaped children) of its process tree from /proc, read at that
   moment, before it is stopped; its peak RSS is VmHWM of its main process (the JVM:
   run.sh execs java). Printed: changes/s, CPU µs per change, RSS, the broker's CPU
   during the run, the topic's size on disk, and each line's ratios to Debezium JSON
   (changes/s over Debezium's; Debezium's CPU per change over its own).

Only the tools' own CPU is compared: PostgreSQL (walsenders, backends) and the broker
do similar work for both and share the two cores with them. The machine's load
average is printed: other work on it stretches the wall-clock times, much less the CPU
seconds. One run of each; nothing is asserted but the counts (exit 1 if a topic holds
a wrong number of messages or a tool fails).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import platform
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import stream
from common import (
    TABLE,
    BenchError,
    Child,
    KafkaTarget,
    cpu_seconds,
    create_bench_table,
    create_publication,
    drop_slot,
    kafka_sink_args,
    load_services,
    machine_info,
    pg2sink_argv,
    pg_binary,
    run_benchmark,
    start_kafka,
    start_postgres,
    tail,
    topic_bytes,
    vm_hwm_kib,
    warm_up_broker,
)
from psycopg import sql

PG2SINK_PUBLICATION = "bench_pub"
DEBEZIUM_PUBLICATION = "dbz_pub"
#: Defaults that finish in about ten minutes on 2 cores, Debezium being the slow part:
#: 320,000 changes and 1,000,000 rows (the issue asks 800,000 and 5,000,000).
DEFAULT_SCALE = 0.4
DEFAULT_SNAPSHOT_ROWS = 1_000_000
WATERMARK_POLL_SECONDS = 0.2

#: bench/import.py, whose module name is a keyword (`import import` cannot be written)
bench_import = importlib.import_module("import")


def load_debezium() -> ModuleType:
    """scripts/debezium.py (scripts/ is not a package; see common.load_services)."""
    load_services()  # puts scripts/ on sys.path
    return importlib.import_module("debezium")


# --- measuring one tool -------------------------------------------------------


@dataclass
class Result:
    """One run of one tool: `count` changes or rows in `seconds`."""

    name: str
    count: int
    seconds: float
    cpu: float | None
    rss_mib: float | None = None
    broker_cpu: float | None = None
    topic_mib: float | None = None
    startup: float | None = None

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us(self) -> float | None:
        return None if self.cpu is None else self.cpu * 1e6 / self.count


def tree_cpu(root: int) -> float:
    """CPU seconds of `root`'s process tree so far (bench/import.py's tree_times)."""
    times: dict[int, tuple[str, float]] = bench_import.tree_times(root)
    return sum(t for _, t in times.values())


class Watermarks:
    """Messages in a topic (high minus low watermark over its partitions), polled
    through one consumer; 0 while the topic does not exist (no auto-creation)."""

    def __init__(self, bootstrap_servers: str) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": f"pg2sink-peers-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "allow.auto.create.topics": False,
            }
        )

    def count(self, topic: str) -> int:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            meta = self.consumer.list_topics(topic, timeout=10)
        except KafkaException:
            return 0
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return 0
        total = 0
        for p in found.partitions:
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=10, cached=False
            )
            total += high - low
        return total

    def close(self) -> None:
        self.consumer.close()


def watch(
    name: str,
    child: Child,
    stderr: Path,
    topic: str,
    expected: int,
    kafka: KafkaTarget,
    timeout: float,
) -> Result:
    """Wait until `topic` holds `expected` messages; the tool's figures at that moment,
    then stop it. More messages than expected, or an exit first, fails the run."""
    marks = Watermarks(kafka.bootstrap_servers)
    broker0 = cpu_seconds(kafka.broker_pid) if kafka.broker_pid else None
    first: float | None = None
    try:
        while True:
            n = marks.count(topic)
            now = time.monotonic()
            if n and first is None:
                first = now - child.started
            if n >= expected:
                seconds = now - child.started
                cpu = tree_cpu(child.pid)
                rss = vm_hwm_kib(child.pid)
                broker1 = cpu_seconds(kafka.broker_pid) if kafka.broker_pid else None
                break
            if child.poll() is not None:
                raise BenchError(f"{name} exited with {child.returncode}:\n{tail(stderr)}")
            if now - child.started > timeout:
                raise BenchError(f"{name}: {n} of {expected} messages after {timeout}s")
            time.sleep(WATERMARK_POLL_SECONDS)
    finally:
        child.stop()
        marks.close()
    final = Watermarks(kafka.bootstrap_servers)
    try:
        n = final.count(topic)
    finally:
        final.close()
    if n != expected:
        raise BenchError(f"{name}: topic {topic} holds {n} messages, expected {expected}")
    return Result(
        name,
        expected,
        seconds,
        cpu,
        rss_mib=rss / 1024 if rss else None,
        broker_cpu=broker1 - broker0 if broker0 is not None and broker1 is not None else None,
        topic_mib=topic_bytes(kafka.data, topic) / 2**20,
        startup=first,
    )


# --- Debezium Server ----------------------------------------------------------


@dataclass(frozen=True)
class Debezium:
    """Debezium Server's distribution and the JDK it runs on."""

    dist: Path
    java_home: Path
    avro_jar: Path
    version: str
    java: str


def debezium_properties(
    dsn_port: int,
    kafka: KafkaTarget,
    run_dir: Path,
    slot: str,
    publication: str,
    snapshot_mode: str,
    prefix: str,
    avro: bool,
) -> dict[str, str]:
    """application.properties of one run: the PostgreSQL connector on its own slot and
    publication, offsets in a file of the run, the Kafka sink; JSON (Debezium's default
    converter and schemas.enable) or Avro through Apicurio's converter."""
    src = "debezium.source."
    props = {
        "debezium.sink.type": "kafka",
        "debezium.sink.kafka.producer.bootstrap.servers": kafka.bootstrap_servers,
        "debezium.sink.kafka.producer.key.serializer": (
            "org.apache.kafka.common.serialization.StringSerializer"
        ),
        "debezium.sink.kafka.producer.value.serializer": (
            "org.apache.kafka.common.serialization.StringSerializer"
        ),
        src + "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        src + "offset.storage.file.filename": str(run_dir / "offsets.dat"),
        src + "offset.flush.interval.ms": "1000",
        src + "database.hostname": "127.0.0.1",
        src + "database.port": str(dsn_port),
        src + "database.user": "postgres",
        src + "database.password": "postgres",  # trust authentication: not checked
        src + "database.dbname": "postgres",
        src + "topic.prefix": prefix,
        src + "table.include.list": f"public.{TABLE}",
        src + "plugin.name": "pgoutput",
        src + "slot.name": slot,
        src + "publication.name": publication,
        src + "publication.autocreate.mode": "filtered",
        src + "snapshot.mode": snapshot_mode,
        "quarkus.http.port": str(load_services().free_port()),
        "quarkus.log.level": "INFO",
        "quarkus.log.console.json": "false",
    }
    if avro:
        # Apicurio's own API (v3) of the registry the bench started for pg2sink
        registry = kafka.registry_url.replace("/apis/ccompat/v7", "/apis/registry/v3")
        props["debezium.sink.kafka.producer.key.serializer"] = (
            "org.apache.kafka.common.serialization.ByteArraySerializer"
        )
        props["debezium.sink.kafka.producer.value.serializer"] = (
            "org.apache.kafka.common.serialization.ByteArraySerializer"
        )
        for part in ("key", "value"):
            props[f"debezium.format.{part}"] = "avro"
            props[f"debezium.format.{part}.apicurio.registry.url"] = registry
            props[f"debezium.format.{part}.apicurio.registry.auto-register"] = "true"
            props[f"debezium.format.{part}.apicurio.registry.find-latest"] = "true"
    return props


def debezium_run_dir(dbz: Debezium, run_dir: Path, props: dict[str, str]) -> None:
    """A working directory for run.sh: the distribution's entries linked, and a config/
    of the run's own (Quarkus reads config/application.properties from the cwd)."""
    run_dir.mkdir(parents=True)
    for entry in dbz.dist.iterdir():
        if entry.name not in ("config", "lib", ".complete"):
            (run_dir / entry.name).symlink_to(entry)
    # run.sh's class path is lib/*: the distribution's jars and Apache Avro
    (run_dir / "lib").mkdir()
    for jar in [*(dbz.dist / "lib").iterdir(), dbz.avro_jar]:
        (run_dir / "lib" / jar.name).symlink_to(jar)
    (run_dir / "config").mkdir()
    (run_dir / "config" / "lib").symlink_to(dbz.dist / "config" / "lib")
    text = "".join(f"{k}={v}\n" for k, v in props.items())
    (run_dir / "config" / "application.properties").write_text(text)


def run_debezium(
    dbz: Debezium,
    name: str,
    props: dict[str, str],
    run_dir: Path,
    topic: str,
    expected: int,
    kafka: KafkaTarget,
    timeout: float,
) -> Result:
    """Debezium Server's run.sh on the chosen JDK until `topic` holds `expected`."""
    debezium_run_dir(dbz, run_dir, props)
    env = {
        **os.environ,
        "JAVA_HOME": str(dbz.java_home),
        "PATH": f"{dbz.java_home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    stdout, stderr = run_dir / "stdout.log", run_dir / "stderr.log"
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        started = time.monotonic()
        proc = subprocess.Popen(
            ["bash", "run.sh"],
            cwd=run_dir,
            env=env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    child = Child(["bash", "run.sh"], proc, started)
    print(f"  {name}: {run_dir}/config/application.properties", flush=True)
    try:
        return watch(name, child, stdout, topic, expected, kafka, timeout)
    except BenchError as e:
        raise BenchError(f"{e}\n--- {stdout} ---\n{tail(stdout, 40)}") from e


# --- pg2sink --------------------------------------------------------------------


def pg2sink_formats() -> list[str]:
    """The --format choices of this pg2sink (debezium once it exists)."""
    res = subprocess.run(
        [sys.executable, "-m", "pg2sink", "stream", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    text = " ".join(res.stdout.split())
    start = text.find("--format {")
    if start < 0:
        return ["avro"]
    return text[start + len("--format {") :].split("}", 1)[0].split(",")


def run_pg2sink_stream(
    dsn: str,
    slot: str,
    fmt: str,
    kafka: KafkaTarget,
    tmp: Path,
    expected: int,
    timeout: float,
) -> Result:
    """`python -m pg2sink --sink kafka --format FMT` on `slot` until its topic is full."""
    prefix = f"pg2sink_{fmt}_{uuid.uuid4().hex[:6]}"
    argv = pg2sink_argv(dsn, slot, PG2SINK_PUBLICATION, kafka_sink_args(kafka, prefix))
    argv += ["--format", fmt]
    name = f"pg2sink --sink kafka --format {fmt}"
    print(f"  {name}: {shlex.join(argv)}", flush=True)
    stderr = tmp / f"pg2sink_{fmt}.stderr"
    child = Child.spawn(argv, tmp / f"pg2sink_{fmt}.stdout", stderr)
    return watch(name, child, stderr, f"{prefix}.public.{TABLE}", expected, kafka, timeout)


# --- the two parts -----------------------------------------------------------------


def streaming(
    args: argparse.Namespace,
    tmp: Path,
    dsn: str,
    port: int,
    kafka: KafkaTarget,
    dbz: Debezium,
) -> tuple[int, list[Result]]:
    """Slots, the workload, then each tool on its slot; (changes, results)."""
    sizes = stream.Sizes(
        round(stream.FULL_INSERT_ROWS * args.scale),
        round(stream.FULL_UPDATE_ROWS * args.scale),
        round(stream.FULL_SMALL_TXNS * args.scale),
    )
    sizes.check()
    formats = [f for f in ("avro", "json", "debezium") if f in pg2sink_formats()]
    dbz_runs = ["json", "avro"] if args.debezium_avro else ["json"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TABLE)))
        create_bench_table(conn)
        create_publication(conn, PG2SINK_PUBLICATION, TABLE)
        create_publication(conn, DEBEZIUM_PUBLICATION, TABLE)
        slots = [f"peers_dbz_{f}" for f in dbz_runs] + [f"peers_pg2sink_{f}" for f in formats]
        for slot in slots:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        print(f"workload: {sizes.changes:,} changes (scale {args.scale}) ...", flush=True)
        work = stream.run_workload(conn, sizes)
        print(
            f"  insert {work.insert_seconds:.1f}s, update {work.update_seconds:.1f}s, "
            f"small transactions {work.small_seconds:.1f}s; {work.wal_bytes / 2**20:.0f} MiB WAL",
            flush=True,
        )
        results: list[Result] = []
        for fmt in dbz_runs:
            prefix = f"dbz_{fmt}_{uuid.uuid4().hex[:6]}"
            props = debezium_properties(
                port,
                kafka,
                tmp / f"dbz_stream_{fmt}",
                f"peers_dbz_{fmt}",
                DEBEZIUM_PUBLICATION,
                "no_data",
                prefix,
                avro=fmt == "avro",
            )
            r = run_debezium(
                dbz,
                f"Debezium Server {fmt}",
                props,
                tmp / f"dbz_stream_{fmt}",
                f"{prefix}.public.{TABLE}",
                work.changes,
                kafka,
                args.timeout,
            )
            results.append(r)
            print(f"  {line(r)}", flush=True)
            drop_slot(conn, f"peers_dbz_{fmt}")
        for fmt in formats:
            r = run_pg2sink_stream(
                dsn, f"peers_pg2sink_{fmt}", fmt, kafka, tmp, work.changes, args.timeout
            )
            results.append(r)
            print(f"  {line(r)}", flush=True)
            drop_slot(conn, f"peers_pg2sink_{fmt}")
    return work.changes, results


def snapshot(
    args: argparse.Namespace,
    tmp: Path,
    dsn: str,
    port: int,
    kafka: KafkaTarget,
    dbz: Debezium,
    services: ModuleType,
) -> tuple[list[Result], float]:
    """COPY, pg2sink's import into Kafka, Debezium's initial snapshot of `--rows` rows;
    (results, Spark's start-up seconds)."""
    from pg2sink.config import SecretDsn
    from pg2sink.imports.migrate import apply_migrations
    from pg2sink.imports.spark import SparkRunner, target_partitions
    from pg2sink.sinks.kafka.config import KafkaConfig
    from pg2sink.sinks.kafka.imports import KafkaImportTarget

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TABLE)))
        print(f"snapshot table: {args.rows:,} rows ...", flush=True)
        bench_import.fill(conn, args.rows)  # creates the table again (same publications)
    apply_migrations(SecretDsn(dsn), bench_import.INTERNAL)
    results: list[Result] = []
    copy = bench_import.run_copy(pg_binary(services, "psql"), dsn, args.rows)
    results.append(Result("COPY TO STDOUT (psql)", args.rows, copy.seconds, None))
    print(f"  {line(results[-1])}", flush=True)

    with contextlib.ExitStack() as stack:
        runner = SparkRunner("local[*]")
        stack.callback(runner.close)
        runner.session()
        spark_startup = float(runner.startup_seconds)
        prefix = f"import_{uuid.uuid4().hex[:6]}"
        cfg = KafkaConfig(
            kafka.bootstrap_servers, schema_registry_url=kafka.registry_url, topic_prefix=prefix
        )
        broker0 = cpu_seconds(kafka.broker_pid) if kafka.broker_pid else None
        run = bench_import.run_import(
            runner, dsn, KafkaImportTarget(cfg), target_partitions("local[*]"), "kafka"
        )
        broker1 = cpu_seconds(kafka.broker_pid) if kafka.broker_pid else None
    topic = f"{prefix}.public.{TABLE}"
    marks = Watermarks(kafka.bootstrap_servers)
    try:
        n = marks.count(topic)
    finally:
        marks.close()
    if n != args.rows:
        raise BenchError(f"pg2sink import: topic {topic} holds {n} messages, not {args.rows}")
    results.append(
        Result(
            "pg2sink import --sink kafka (avro)",
            args.rows,
            run.seconds,
            run.cpu,
            broker_cpu=broker1 - broker0 if broker0 is not None and broker1 is not None else None,
            topic_mib=topic_bytes(kafka.data, topic) / 2**20,
        )
    )
    print(f"  {line(results[-1])} (Spark start-up {spark_startup:.1f}s, not included)", flush=True)

    prefix = f"dbz_snap_{uuid.uuid4().hex[:6]}"
    run_dir = tmp / "dbz_snapshot"
    props = debezium_properties(
        port, kafka, run_dir, "peers_dbz_snapshot", "dbz_snapshot_pub", "initial", prefix, False
    )
    r = run_debezium(
        dbz,
        "Debezium Server snapshot (json)",
        props,
        run_dir,
        f"{prefix}.public.{TABLE}",
        args.rows,
        kafka,
        args.timeout,
    )
    results.append(r)
    print(f"  {line(r)}", flush=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        drop_slot(conn, "peers_dbz_snapshot")  # it would hold the stream's WAL
    return results, spark_startup


# --- report --------------------------------------------------------------------------


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def line(r: Result) -> str:
    return (
        f"{r.name:40} {r.seconds:8.2f}s {r.rate:10,.0f}/s  CPU {_f(r.cpu, '.1f')}s"
        f" = {_f(r.cpu_us, '.1f')} us each  RSS {_f(r.rss_mib, '.0f')} MiB"
        f"  broker CPU {_f(r.broker_cpu, '.1f')}s  topic {_f(r.topic_mib, '.0f')} MiB"
        f"  first message {_f(r.startup, '.1f')}s"
    )


def table(title: str, unit: str, results: Sequence[Result], base: Result) -> list[dict[str, Any]]:
    """One line per tool with its ratio to `base` (rate over base's rate, base's CPU per
    unit over its CPU per unit)."""
    print(f"\n{title}")
    print(
        f"{'':40} {'seconds':>8} {unit + '/s':>11} {'CPU s':>7} {'us/' + unit:>9}"
        f" {'RSS MiB':>8} {'x rate':>7} {'x CPU':>7}"
    )
    rows = []
    for r in results:
        speed = r.rate / base.rate if base.rate else 0.0
        cpu = base.cpu_us / r.cpu_us if base.cpu_us and r.cpu_us else None
        print(
            f"{r.name:40} {r.seconds:8.2f} {r.rate:11,.0f} {_f(r.cpu, '.1f'):>7}"
            f" {_f(r.cpu_us, '.1f'):>9} {_f(r.rss_mib, '.0f'):>8} {speed:7.2f} {_f(cpu, '.2f'):>7}"
        )
        rows.append(
            {**r.__dict__, "rate": r.rate, "cpu_us": r.cpu_us, "x_rate": speed, "x_cpu": cpu}
        )
    return rows


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    services = load_services()
    debezium = load_debezium()
    try:
        home = debezium.java_home()
        dbz = Debezium(
            debezium.server_dist(),
            home,
            debezium.avro_jar(),
            debezium.VERSION,
            str(debezium.java_major(home / "bin" / "java")),
        )
    except services.ServiceError as e:
        raise BenchError(str(e)) from e
    load0 = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        server = start_postgres(services, tmp, stack)
        dsn = server.dsn()
        kafka = start_kafka(services, tmp, stack)
        print(f"warming the broker up: {warm_up_broker(kafka, 200_000):.1f}s", flush=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            info = machine_info(conn, pg_binary(services, "pg_recvlogical"))
        figures: dict[str, Any] = {"machine": info, "debezium": dbz.version, "java": dbz.java}
        if not args.skip_snapshot:
            results, spark = snapshot(args, tmp, dsn, server.port, kafka, dbz, services)
            figures["snapshot"] = {
                "rows": args.rows,
                "spark_startup_seconds": spark,
                "runs": table(f"snapshot: {args.rows:,} rows", "row", results, results[-1]),
            }
            print(f"(pg2sink import: Spark start-up {spark:.1f}s once, not in its time)")
        if not args.skip_stream:
            changes, results = streaming(args, tmp, dsn, server.port, kafka, dbz)
            base = results[0]
            figures["stream"] = {
                "changes": changes,
                "scale": args.scale,
                "runs": table(f"streaming: {changes:,} changes", "change", results, base),
            }
    print(
        f"\nDebezium Server {dbz.version} on Java {dbz.java} ({dbz.java_home}); pg2sink "
        f"{info['pg2sink']}; PostgreSQL {info['postgresql']}; {info['nproc']} CPUs "
        f"({info['cpu']}), Python {platform.python_version()}; load average "
        f"{load0:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print("x rate: changes (rows) per second over the first line's; x CPU: the first line's")
    print("CPU per change (row) over this line's (snapshot: over Debezium's, the last line)")
    return figures


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="pg2sink next to Debezium Server (bench/README.md).")
    p.add_argument(
        "--scale",
        type=float,
        default=DEFAULT_SCALE,
        help="stream workload scale: 1 is bench-stream's 800,000 changes (default 0.4)",
    )
    p.add_argument(
        "--rows", type=int, default=DEFAULT_SNAPSHOT_ROWS, help="snapshot table rows (default 1M)"
    )
    p.add_argument(
        "--no-debezium-avro",
        dest="debezium_avro",
        action="store_false",
        help="skip Debezium Server with Apicurio's Avro converter",
    )
    p.add_argument("--skip-stream", action="store_true")
    p.add_argument("--skip-snapshot", action="store_true")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per tool run")
    p.add_argument("--json", type=Path, help="also write the figures as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args(argv)
    if args.scale <= 0 or args.rows < 1:
        p.error("--scale and --rows must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench-peers", parse_args(argv), bench, "pg2sink-peers-")


if __name__ == "__main__":
    sys.exit(main())
