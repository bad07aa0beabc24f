"""The Kafka sink's throughput with and without --exactly-once, in one run.

Starts a PostgreSQL, a Kafka broker and a schema registry in a temporary directory
(scripts/services.py), warms the broker up, creates one slot per run before any change,
then makes bench-stream's workload (bench/stream.py: a bulk INSERT, a bulk UPDATE and
single-row transactions; smaller by default) and lets pg2sink --sink kafka (Avro, as
bench-stream) stream it, alternately at-least-once and --exactly-once, each run on its own
slot and into topics of its own. A run's time is from the process's start until the slot
confirmed the workload's end (pg2sink confirms only what Kafka holds: acknowledged
at-least-once, committed exactly-once); each run's topic must then hold every change.

    .venv/bin/python bench/kafka_eos.py --repeat 3

Prints changes/s per run and the ratio median(exactly-once) / median(at-least-once)
(issue 15's target: at least 0.8).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from common import (  # noqa: E402
    TABLE,
    BenchError,
    Child,
    KafkaTarget,
    drop_slot,
    kafka_sink_args,
    load_services,
    pg2sink_argv,
    run_benchmark,
    slot_state,
    start_kafka,
    start_postgres,
    tail,
    warm_up_broker,
)
from stream import PUBLICATION, Sizes, Workload, run_workload, setup_schema, slot_name  # noqa: E402

MODES = {"at-least-once": (), "exactly-once": ("--exactly-once",)}
TARGET = 0.8


def committed_count(bootstrap_servers: str, topic: str) -> int:
    """Messages a read_committed consumer reads in `topic` (watermarks would count the
    transactions' commit markers too)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "unused",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        ends = {}
        for p in consumer.list_topics(topic, timeout=30).topics[topic].partitions:
            ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), 30)[1]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        count = 0
        deadline = time.monotonic() + 300
        while ends and time.monotonic() < deadline:
            count += sum(m.error() is None for m in consumer.consume(10_000, 0.5))
            for tp in consumer.position([TopicPartition(topic, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:
                    del ends[tp.partition]
        return count
    finally:
        consumer.close()


def run_once(
    dsn: str, conn: psycopg.Connection, kafka: KafkaTarget, slot: str, extra: Sequence[str],
    workload: Workload, tmp: Path, timeout: float,
) -> float:  # fmt: skip
    """Seconds for one pg2sink run to confirm the workload; checks its topic's count."""
    prefix = f"eos_{uuid.uuid4().hex[:8]}"
    argv = pg2sink_argv(dsn, slot, PUBLICATION, [*kafka_sink_args(kafka, prefix), *extra])
    stderr = tmp / f"{slot}.stderr"
    child = Child.spawn(argv, tmp / f"{slot}.stdout", stderr)
    try:
        while not slot_state(conn, slot, workload.end_lsn).reached_end:
            if child.poll() is not None:
                raise BenchError(f"pg2sink exited with {child.returncode}:\n{tail(stderr)}")
            if time.monotonic() - child.started > timeout:
                raise BenchError(f"pg2sink did not confirm the workload:\n{tail(stderr)}")
            time.sleep(0.05)
        seconds = time.monotonic() - child.started
    finally:
        child.stop()
    count = committed_count(kafka.bootstrap_servers, f"{prefix}.public.{TABLE}")
    if count != workload.changes:
        raise BenchError(f"{count} messages in the topic, expected {workload.changes}")
    return seconds


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Both modes, alternately, on one workload; the figures."""
    sizes = Sizes(args.insert_rows, args.update_rows, args.small_txns)
    sizes.check()
    services = load_services()
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    with contextlib.ExitStack() as stack:
        server = start_postgres(services, tmp, stack)
        kafka = start_kafka(services, tmp, stack)
        print(f"broker warmed up in {warm_up_broker(kafka):.1f} s", flush=True)
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            setup_schema(conn, args.repeat, ["alo", "eo"])
            workload = run_workload(conn, sizes)
            for run in range(1, args.repeat + 1):
                # alternate which goes first: the machine's load drifts
                order = list(MODES) if run % 2 else list(reversed(MODES))
                for mode in order:
                    slot = slot_name("alo" if mode == "at-least-once" else "eo", run)
                    s = run_once(dsn, conn, kafka, slot, MODES[mode], workload, tmp, args.timeout)
                    drop_slot(conn, slot)
                    rates[mode].append(workload.changes / s)
                    print(f"run {run} {mode}: {s:.2f} s, {workload.changes / s:,.0f} changes/s")
    alo, eo = (statistics.median(rates[m]) for m in MODES)
    print(
        f"{workload.changes:,} changes ({sizes.insert_rows:,}-row INSERT, "
        f"{sizes.update_rows:,}-row UPDATE, {sizes.small_txns:,} single-row transactions); "
        f"median at-least-once {alo:,.0f}/s, exactly-once {eo:,.0f}/s: ratio {eo / alo:.2f} "
        f"(target >= {TARGET})"
    )
    return {"changes": workload.changes, "rates": rates, "ratio": eo / alo}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--insert-rows", type=int, default=200_000)
    parser.add_argument("--update-rows", type=int, default=100_000)
    parser.add_argument("--small-txns", type=int, default=20_000)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--json", type=Path, help="write the figures here")
    return run_benchmark("bench-kafka-eos", parser.parse_args(argv), bench, "pg2sink-eos-")


if __name__ == "__main__":
    sys.exit(main())
