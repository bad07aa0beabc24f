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
     `debezium` (JSON, as Debezium's run) and `debezium --debezium-avro` when this
     pg2sink has that format.
   Each is timed from process start until its table topic holds every change (sum of
   the partitions' high watermarks, polled every 0.2 s); the tool's CPU seconds are
   utime+stime (with reaped children) of its process tree from /proc, read at that
   moment, before it is stopped; its peak RSS is VmHWM of its main process (the JVM:
   run.sh execs java). Printed: changes/s, CPU µs per change, RSS, the broker's CPU
   during the run, the topic's size on disk, and each line's ratios to Debezium JSON
   (changes/s over Debezium's; Debezium's CPU per change over its own).

4. Latency (`--latency-seconds`, default 20; 0 skips it): bench/latency.py's table
   `lat` and driver (single-row autocommit INSERTs at `--latency-rate`, default 2,000/s,
   absolute deadlines, synchronous_commit on), into topics created beforehand with
   message.timestamp.type=LogAppendTime: pg2sink (Avro) on its slot, then Debezium
   Server (JSON) on a publication and slot created after pg2sink's load. Three warm-up
   rows first (each waited for on the topic: the tool is streaming); then latency =
   the broker's append time - the commit time in the message (pg2sink's envelope
   `timestamp`, Debezium's source.ts_us); p50, p99, max.

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
    Conn,
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
#: bench/latency.py (its table, load driver and Avro topic reader)
bench_latency = importlib.import_module("latency")


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
    table: str = TABLE,
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
        src + "table.include.list": f"public.{table}",
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
    child = start_debezium(dbz, props, run_dir)
    print(f"  {name}: {run_dir}/config/application.properties", flush=True)
    try:
        return watch(name, child, run_dir / "stdout.log", topic, expected, kafka, timeout)
    except BenchError as e:
        raise BenchError(
            f"{e}\n--- {run_dir}/stdout.log ---\n{tail(run_dir / 'stdout.log', 40)}"
        ) from e


def start_debezium(dbz: Debezium, props: dict[str, str], run_dir: Path) -> Child:
    """Debezium Server's run.sh in `run_dir` (its log: stdout.log) on the chosen JDK."""
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
    return Child(["bash", "run.sh"], proc, started)


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
    """`python -m pg2sink --sink kafka --format FMT` on `slot` until its topic is full
    (FMT debezium-avro: --format debezium --debezium-avro)."""
    prefix = f"pg2sink_{fmt.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
    argv = pg2sink_argv(dsn, slot, PG2SINK_PUBLICATION, kafka_sink_args(kafka, prefix))
    options = ["--format", "debezium", "--debezium-avro"] if fmt == "debezium-avro" else []
    argv += options or ["--format", fmt]
    name = f"pg2sink --sink kafka {' '.join(options or ['--format', fmt])}"
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
    formats: list[str] = [f for f in ("avro", "json", "debezium") if f in pg2sink_formats()]
    formats += ["debezium-avro"] if "debezium" in formats else []
    dbz_runs = ["json", "avro"] if args.debezium_avro else ["json"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TABLE)))
        create_bench_table(conn)
        create_publication(conn, PG2SINK_PUBLICATION, TABLE)
        create_publication(conn, DEBEZIUM_PUBLICATION, TABLE)
        slots = [f"peers_dbz_{f}" for f in dbz_runs]
        slots += [f"peers_pg2sink_{f.replace('-', '_')}" for f in formats]
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
            slot = f"peers_pg2sink_{fmt.replace('-', '_')}"
            r = run_pg2sink_stream(dsn, slot, fmt, kafka, tmp, work.changes, args.timeout)
            results.append(r)
            print(f"  {line(r)}", flush=True)
            drop_slot(conn, slot)
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
    from pg2sink.imports.driver import target_partitions
    from pg2sink.imports.migrate import apply_migrations
    from pg2sink.imports.spark import SparkRunner
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


# --- latency (commit to broker append) ---------------------------------------------


def read_debezium_topic(kafka: KafkaTarget, topic: str, expected: int) -> list[tuple[int, float]]:
    """(id, latency ms) of every message of Debezium's JSON `topic`: the broker's
    LogAppendTime minus the envelope's source.ts_us (the transaction's commit time)."""
    import json

    from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, TopicPartition
    from confluent_kafka import Consumer as KafkaConsumer

    consumer = KafkaConsumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"pg2sink-peers-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    out: list[tuple[int, float]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 120
        while len(out) < expected:
            if time.monotonic() > deadline:
                raise BenchError(f"read {len(out)} of {expected} messages of {topic} in 120 s")
            for msg in consumer.consume(1000, timeout=1.0):
                if msg.error() is not None:
                    raise BenchError(f"consumer error: {msg.error()}")
                ts_type, ts_ms = msg.timestamp()
                if ts_type != TIMESTAMP_LOG_APPEND_TIME:
                    raise BenchError(f"{topic}: a message without LogAppendTime")
                payload = json.loads(msg.value() or b"{}")["payload"]
                out.append((int(payload["after"]["id"]), ts_ms - payload["source"]["ts_us"] / 1e3))
    finally:
        consumer.close()
    return out


def measure_latency(
    name: str,
    child: Child,
    log: Path,
    driver: Conn,
    topic: str,
    warm_ids: Sequence[int],
    kafka: KafkaTarget,
    args: argparse.Namespace,
) -> tuple[int, Any]:
    """Warm-up rows until each is on `topic`, then `--latency-rate` single-row
    transactions per second for `--latency-seconds`; waits until all are on the topic
    and stops the tool. (transactions, bench/latency.py's Load)."""
    marks = Watermarks(kafka.bootstrap_servers)
    insert = sql.SQL("INSERT INTO {} (id, payload) VALUES (%s, 'warm-up')").format(
        sql.Identifier(bench_latency.TABLE)
    )
    try:
        for n, row_id in enumerate(warm_ids, 1):
            driver.execute(insert, (row_id,))
            deadline = time.monotonic() + args.timeout
            while marks.count(topic) < n:
                if child.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"{name}: warm-up row {row_id} not on {topic}:\n{tail(log)}")
                time.sleep(WATERMARK_POLL_SECONDS)
        load = bench_latency.drive(driver, args.latency_rate, args.latency_seconds)
        expected = len(warm_ids) + load.count
        deadline = time.monotonic() + args.timeout
        while marks.count(topic) < expected:
            if child.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"{name}: not every message on {topic}:\n{tail(log)}")
            time.sleep(WATERMARK_POLL_SECONDS)
    finally:
        child.stop()
        marks.close()
    return expected, load


def latency_stats(name: str, latencies_ms: list[float], load: Any) -> dict[str, Any]:
    """p50/p99/max of one tool's latencies, printed with the load it ran under."""
    values = sorted(latencies_ms)
    pct = bench_latency.percentile
    stats = {
        "name": name,
        "count": len(values),
        "rate_achieved": load.rate,
        "max_lag_ms": load.max_lag_ms,
        "p50_ms": pct(values, 50),
        "p99_ms": pct(values, 99),
        "max_ms": values[-1],
    }
    print(
        f"  {name:40} {load.rate:7,.0f} tx/s (worst lag {load.max_lag_ms:.0f} ms)"
        f"  p50 {stats['p50_ms']:.1f} ms  p99 {stats['p99_ms']:.1f} ms  max {values[-1]:.0f} ms",
        flush=True,
    )
    return stats


def latency(
    args: argparse.Namespace,
    tmp: Path,
    dsn: str,
    port: int,
    kafka: KafkaTarget,
    dbz: Debezium,
) -> list[dict[str, Any]]:
    """Commit → broker append (LogAppendTime) at a fixed rate of single-row transactions
    (bench/latency.py's table and driver, synchronous_commit on), pg2sink (Avro) then
    Debezium Server (JSON), each on a slot made just before its own load."""
    table = bench_latency.TABLE
    results = []
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.connect(dsn, autocommit=True) as driver,
    ):
        driver.execute("SET synchronous_commit = on")
        bench_latency.setup(conn)  # the table, lat_pub and pg2sink's slot lat_slot
        print(
            f"latency: {args.latency_rate:,.0f} transactions/s for {args.latency_seconds:g} s",
            flush=True,
        )
        prefix = f"pg2sink_lat_{uuid.uuid4().hex[:6]}"
        topic = f"{prefix}.public.{table}"
        bench_latency.create_topic(kafka.bootstrap_servers, topic)
        argv = pg2sink_argv(
            dsn, bench_latency.SLOT, bench_latency.PUBLICATION, kafka_sink_args(kafka, prefix)
        )
        stderr = tmp / "pg2sink_lat.stderr"
        child = Child.spawn(argv, tmp / "pg2sink_lat.stdout", stderr)
        n, load = measure_latency(
            "pg2sink", child, stderr, driver, topic, (-1, -2, -3), kafka, args
        )
        got = bench_latency.read_topic(kafka, topic, n)
        ms = [lat for i, lat, _ in got if i > 0]
        results.append(latency_stats("pg2sink --sink kafka --format avro", ms, load))
        drop_slot(conn, bench_latency.SLOT)

        # the publication before the slot: pgoutput sends no change made before it existed
        create_publication(conn, "dbz_lat_pub", table)
        conn.execute("SELECT pg_create_logical_replication_slot('peers_dbz_lat', 'pgoutput')")
        prefix = f"dbz_lat_{uuid.uuid4().hex[:6]}"
        topic = f"{prefix}.public.{table}"
        bench_latency.create_topic(kafka.bootstrap_servers, topic)
        run_dir = tmp / "dbz_latency"
        props = debezium_properties(
            port, kafka, run_dir, "peers_dbz_lat", "dbz_lat_pub", "no_data", prefix, False, table
        )
        child = start_debezium(dbz, props, run_dir)
        n, load = measure_latency(
            "Debezium Server",
            child,
            run_dir / "stdout.log",
            driver,
            topic,
            (-4, -5, -6),
            kafka,
            args,
        )
        ms = [lat for i, lat in read_debezium_topic(kafka, topic, n) if i > 0]
        results.append(latency_stats("Debezium Server json", ms, load))
        drop_slot(conn, "peers_dbz_lat")
    return results


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
        if args.latency_seconds > 0:
            figures["latency"] = latency(args, tmp, dsn, server.port, kafka, dbz)
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
    p.add_argument(
        "--latency-rate", type=float, default=2000.0, help="latency: transactions/s (2,000)"
    )
    p.add_argument(
        "--latency-seconds",
        type=float,
        default=20.0,
        help="latency: seconds of load per tool (default 20; 0 skips the latency part)",
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
