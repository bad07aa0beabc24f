"""`make bench-latency`: commit-to-broker latency of pg2sink --sink kafka under a steady load.

Method
------
1. Start a throwaway PostgreSQL, a Kafka broker and Apicurio Registry
   (scripts/services.py, via bench/common.py) in a temporary directory.
   Create the table

       lat (id bigserial primary key, payload text,
            created_at timestamptz default clock_timestamp())

   the publication `lat_pub` and the pgoutput slot `lat_slot`, and the topic
   `<prefix>.public.lat` (1 partition) with `message.timestamp.type=LogAppendTime`,
   so every message carries the time the broker appended it.
2. Start pg2sink as a user would (`python -m pg2sink --sink kafka ...`). Warm it up
   with 3 rows of explicit negative ids (they do not consume the sequence): the
   first one makes pg2sink register the schemas and look up the topic. Their
   messages are awaited and left out of the figures.
3. Drive `--rate` (default 2,000) single-row transactions per second for
   `--seconds` (default 20): one autocommit `INSERT INTO lat (payload) VALUES (...)`
   each, statement `i` sent at the absolute deadline t0 + i / rate (late
   statements are sent at once, so the schedule never drifts). The driver's session
   uses `synchronous_commit = on` (the server default is off here): with async
   commit the WAL, which walsenders only send once flushed, waits for the WAL
   writer, which would add its delay to every change (fsync stays off, so the
   flush is cheap). The achieved rate and the worst lag behind the schedule are
   reported.
4. Wait until the slot's confirmed_flush_lsn reaches the WAL insert position after
   the load (pg2sink confirms only what the broker acknowledged), then read the
   topic from the beginning. Each value is decoded with confluent-kafka's
   AvroDeserializer against the registry. Latency of a message =
   msg.timestamp() (LogAppendTime, ms) - the envelope's `timestamp` (the commit
   time, PostgreSQL's clock; same machine, so the same clock). Resolution: the
   broker's timestamp is in whole milliseconds.
5. Every id 1..N must appear (exactly once), else the run fails.

Printed: count, p50, p90, p99, max (ms), the target "p99 < 100 ms: PASS/MISS",
the exact command, machine info and the load average before and after the run
(os.getloadavg(); other work on the machine inflates the tail).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from common import (
    BenchError,
    Child,
    Conn,
    KafkaTarget,
    create_publication,
    current_lsn,
    kafka_sink_args,
    load_services,
    machine_info,
    pg2sink_argv,
    pg_binary,
    run_benchmark,
    start_kafka,
    start_postgres,
    tail,
    wait_confirmed,
)
from psycopg import sql

TABLE = "lat"
PUBLICATION = "lat_pub"
SLOT = "lat_slot"
DEFAULT_RATE = 2000.0
DEFAULT_SECONDS = 20.0
TARGET_P99_MS = 100.0
WARMUP_ROWS = 3
#: Seconds pg2sink may take to confirm the warm-up rows, then the whole load.
CONFIRM_TIMEOUT = 120.0


@dataclass
class Load:
    count: int
    seconds: float
    max_lag_ms: float
    end_lsn: str

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


def setup(conn: Conn) -> None:
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigserial PRIMARY KEY, payload text,"
            " created_at timestamptz DEFAULT clock_timestamp())"
        ).format(sql.Identifier(TABLE))
    )
    create_publication(conn, PUBLICATION, TABLE)
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))


def create_topic(bootstrap_servers: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    new = NewTopic(
        topic,
        num_partitions=1,
        replication_factor=1,
        config={"message.timestamp.type": "LogAppendTime"},
    )
    for future in admin.create_topics([new], operation_timeout=30).values():
        future.result(timeout=60)
    # Every message's timestamp type is checked when the topic is read.


def drive(conn: Conn, rate: float, seconds: float) -> Load:
    """`rate` single-row autocommit INSERTs per second for `seconds`, absolute deadlines."""
    count = round(rate * seconds)
    stmt = sql.SQL("INSERT INTO {} (payload) VALUES (%s)").format(sql.Identifier(TABLE))
    payload = "x" * 64
    interval = 1.0 / rate
    max_lag = 0.0
    clock = time.perf_counter
    start = clock()
    for i in range(count):
        deadline = start + i * interval
        now = clock()
        ahead = deadline - now
        if ahead > 0:
            time.sleep(ahead)
        else:
            max_lag = max(max_lag, -ahead)
        conn.execute(stmt, (payload,), prepare=True)
    elapsed = clock() - start
    return Load(count=count, seconds=elapsed, max_lag_ms=max_lag * 1000, end_lsn=current_lsn(conn))


def read_topic(
    kafka: KafkaTarget, topic: str, expected: int, timeout: float = 120.0
) -> list[tuple[int, float, int]]:
    """(id, latency ms, timestamp type) of every message on `topic`, from the beginning."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    deserialize = AvroDeserializer(SchemaRegistryClient({"url": kafka.registry_url}))
    consumer = KafkaConsumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"pg2sink-latency-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    ctx = SerializationContext(topic, MessageField.VALUE)
    out: list[tuple[int, float, int]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False)
        if high < expected:
            raise BenchError(f"topic {topic} holds {high} messages, expected {expected}")
        deadline = time.monotonic() + timeout
        offset = -1
        while offset < high - 1:
            if time.monotonic() > deadline:
                raise BenchError(f"read {len(out)} of {high} messages in {timeout}s")
            for msg in consumer.consume(1000, timeout=1.0):
                error = msg.error()
                if error is not None:
                    raise BenchError(f"consumer error: {error}")
                offset = msg.offset() or 0
                ts_type, ts_ms = msg.timestamp()
                value = deserialize(msg.value(), ctx)
                if not isinstance(value, dict) or not isinstance(value.get("after"), dict):
                    raise BenchError(f"unexpected message at offset {offset}: {value!r}")
                commit = value["timestamp"]
                if not isinstance(commit, datetime):
                    raise BenchError(f"envelope timestamp is not a datetime: {commit!r}")
                commit_ms = (commit - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1000
                out.append((int(value["after"]["id"]), ts_ms - commit_ms, ts_type))
    finally:
        consumer.close()
    return out


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (the smallest value with at least p% at or below it)."""
    rank = max(1, -(-len(sorted_values) * p // 100))
    return sorted_values[int(rank) - 1]


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

    if args.rate <= 0 or args.seconds <= 0:
        raise BenchError("--rate and --seconds must be positive")
    services = load_services()
    recvlogical = pg_binary(services, "pg_recvlogical")
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        server = start_postgres(services, tmp, stack)
        kafka = start_kafka(services, tmp, stack)
        dsn = server.dsn()
        prefix = f"lat_{uuid.uuid4().hex[:8]}"
        topic = f"{prefix}.public.{TABLE}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            info = machine_info(conn, recvlogical)
            setup(conn)
            create_topic(kafka.bootstrap_servers, topic)
            argv = pg2sink_argv(dsn, SLOT, PUBLICATION, kafka_sink_args(kafka, prefix))
            stderr = tmp / "pg2sink.stderr"
            child = Child.spawn(argv, tmp / "pg2sink.stdout", stderr)
            stack.callback(child.stop)
            with psycopg.connect(dsn, autocommit=True) as driver:
                driver.execute("SET synchronous_commit = on")
                print("warm-up ...", flush=True)
                for n in range(1, WARMUP_ROWS + 1):
                    driver.execute(
                        sql.SQL("INSERT INTO {} (id, payload) VALUES (%s, 'warm-up')").format(
                            sql.Identifier(TABLE)
                        ),
                        (-n,),
                    )
                    wait_confirmed(conn, SLOT, current_lsn(driver), child, stderr, CONFIRM_TIMEOUT)
                print(
                    f"load: {args.rate:,.0f} single-row transactions/s for {args.seconds:g} s ...",
                    flush=True,
                )
                load = drive(driver, args.rate, args.seconds)
            wait_confirmed(conn, SLOT, load.end_lsn, child, stderr, CONFIRM_TIMEOUT)
            child.stop()
            if child.returncode not in (0, -signal.SIGTERM):
                raise BenchError(f"pg2sink exited with {child.returncode}:\n{tail(stderr)}")
        print("reading the topic ...", flush=True)
        messages = read_topic(kafka, topic, load.count + WARMUP_ROWS)
    load_after = os.getloadavg()

    wrong_type = sum(1 for _, _, t in messages if t != TIMESTAMP_LOG_APPEND_TIME)
    if wrong_type:
        raise BenchError(f"{wrong_type} messages do not carry LogAppendTime")
    measured = [(i, lat) for i, lat, _ in messages if i > 0]
    ids = [i for i, _ in measured]
    expected = set(range(1, load.count + 1))
    missing = sorted(expected - set(ids))
    if missing:
        raise BenchError(f"{len(missing)} ids missing from {topic}, first: {missing[:10]}")
    extra = sorted(set(ids) - expected)
    if extra:
        raise BenchError(f"unexpected ids on {topic}: {extra[:10]}")
    duplicates = len(ids) - len(set(ids))
    latencies = sorted(lat for _, lat in measured)
    stats = {
        "count": len(latencies),
        "p50_ms": percentile(latencies, 50),
        "p90_ms": percentile(latencies, 90),
        "p99_ms": percentile(latencies, 99),
        "max_ms": latencies[-1],
        "min_ms": latencies[0],
    }
    passed = stats["p99_ms"] < TARGET_P99_MS
    command = [sys.executable, *sys.argv]
    print()
    print(f"command:   {shlex.join(command)}")
    print(f"pg2sink:   {shlex.join(argv)}")
    print(
        f"machine:   {info['nproc']} CPUs, {info['cpu']}, kernel {info['kernel']}, "
        f"Python {info['python']}, PostgreSQL {info['postgresql']}, {info['pg2sink']}"
    )
    print(
        "load avg:  before {:.2f} {:.2f} {:.2f}, after {:.2f} {:.2f} {:.2f} (1/5/15 min)".format(
            *load_before, *load_after
        )
    )
    print(
        f"load:      {load.count:,} transactions in {load.seconds:.2f} s = "
        f"{load.rate:,.0f}/s achieved (target {args.rate:,.0f}/s), "
        f"worst lag behind schedule {load.max_lag_ms:.1f} ms"
    )
    print(
        f"messages:  ids 1..{load.count:,} all present, {duplicates} duplicates "
        f"({WARMUP_ROWS} warm-up messages left out)"
    )
    print("latency (broker LogAppendTime - commit time), ms:")
    print(
        f"  count {stats['count']:,}  p50 {stats['p50_ms']:.1f}  p90 {stats['p90_ms']:.1f}  "
        f"p99 {stats['p99_ms']:.1f}  max {stats['max_ms']:.1f}  (min {stats['min_ms']:.1f})"
    )
    print(f"p99 < {TARGET_P99_MS:.0f} ms: {'PASS' if passed else 'MISS'}")
    return {
        "command": command,
        "pg2sink_command": argv,
        "machine": info,
        "loadavg_before": list(load_before),
        "loadavg_after": list(load_after),
        "rate_target": args.rate,
        "seconds_target": args.seconds,
        "transactions": load.count,
        "load_seconds": load.seconds,
        "rate_achieved": load.rate,
        "max_lag_ms": load.max_lag_ms,
        "duplicates": duplicates,
        "latency": stats,
        "target_p99_ms": TARGET_P99_MS,
        "pass": passed,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="commit-to-broker latency of pg2sink --sink kafka under a steady "
        "load of single-row transactions (see bench/README.md)."
    )
    p.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_RATE,
        help=f"transactions per second (default {DEFAULT_RATE:,.0f})",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SECONDS,
        help=f"duration of the load (default {DEFAULT_SECONDS:g})",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON")
    p.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (pg2sink's stderr)"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench-latency", parse_args(argv), bench, "pg2sink-latency-")


if __name__ == "__main__":
    sys.exit(main())
