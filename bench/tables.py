"""`make bench-tables`: many tables, one row each; how long until every table's first change
is through each sink, and how pg2sink's peak memory grows with the number of tables.

Method
------
1. Start a throwaway PostgreSQL (scripts/services.py) in a temporary directory and create
   `--tables` N tables (default 10,000) `public.t00001 ...` of two columns
   (`id int8 primary key, v text`), 500 per transaction (one transaction for all of them
   would need max_locks_per_transaction raised), and two publications: `tables_all` with
   every table and `tables_small` with the first `--small` M (default 100). Then one slot
   per consumer and publication, *before* any change, so every run decodes the same WAL.
2. The workload: one INSERT into each table, each its own transaction (sent 100 per round
   trip as one simple-query string `BEGIN; INSERT ...; COMMIT; ...`). END =
   pg_current_wal_insert_lsn() afterwards, waited for until flushed.
3. The baseline: pg_recvlogical (the server's own client, C) streams `tables_all` from its
   slot into a file until `--endpos END`; its time is process start to exit.
4. For each sink of `--sink` in turn: pg2sink on `tables_small` (M tables), then on
   `tables_all` (N tables), each run on its own slot with a fresh file, topic prefix,
   subject prefix, stream or dataset. A run's time is process start (interpreter start-up
   included) until its slot's confirmed_flush_lsn >= END: pg2sink confirms only what its
   sink durably accepted, so that is when every table's first change is in the sink. Then
   pg2sink gets SIGTERM and the sink is read back: it must hold a change of each of the
   run's tables (null: nothing to read, the report says so).
   Peak RSS is pg2sink's own process (VmHWM of /proc/<pid>/status just before SIGTERM;
   pg2sink runs no child process with --no-imports; a sink's server is not counted).
   Growth per table = (peak RSS with N tables - peak RSS with M) / (N - M).

Read back per sink: file, the tables named by the file's Modification lines; kafka, the
topics `<prefix>.public.<table>` holding a message (one subject per table in the schema
registry); nats, the subjects of the stream holding a message; kinesis, the tables named
by the Modification records of every shard; duckdb, the raw tables (pg2sink_tables)
holding a row; bigquery (local-bigquery, `--bigquery-load-interval 0`), the raw tables of
the dataset holding a row.

The targets (issue #30): every sink below 60 s for 10,000 tables and at most 50 KiB of
peak RSS per table. The bench reports them; it does not assert them: the exit code is 0
unless something broke.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import duckdb
import nats
import psycopg
from common import (
    MODIFICATION_MARK,
    BenchError,
    Child,
    Conn,
    current_lsn,
    load_services,
    machine_info,
    pg2sink_argv,
    pg_binary,
    run_benchmark,
    start_postgres,
    tail,
    vm_hwm_kib,
    wait_confirmed,
)
from psycopg import sql
from stream import Targets, plan_sink_run, start_targets, wait_for_wal_flush

SINKS = ("file", "kafka", "nats", "kinesis", "duckdb", "bigquery", "null")
#: tables per CREATE transaction (each holds a lock per table until its commit)
CREATE_BATCH = 500
#: single-row transactions per round trip
TXNS_PER_ROUND_TRIP = 100
PUB_ALL, PUB_SMALL = "tables_all", "tables_small"
TARGET_SECONDS = 60.0
#: the project of the datasets (local-bigquery takes any)
BIGQUERY_PROJECT = "pg2sink-bench"
TARGET_KIB_PER_TABLE = 50.0


def table_name(i: int) -> str:
    return f"t{i:05d}"


@dataclass
class Run:
    """One consumer run on one publication."""

    consumer: str
    tables: int
    seconds: float
    peak_rss_mib: float | None
    client_cpu_seconds: float | None
    read_back: int | None  # tables found holding a change (None: not counted)
    note: str
    command: list[str]


# --- the tables and the workload ---------------------------------------------


def setup(conn: Conn, tables: int, small: int, slots: Sequence[tuple[str, str]]) -> None:
    """The tables, both publications and every slot, before any change."""
    started = time.monotonic()
    for first in range(1, tables + 1, CREATE_BATCH):
        names = [table_name(i) for i in range(first, min(first + CREATE_BATCH, tables + 1))]
        with conn.transaction():
            for name in names:
                conn.execute(
                    sql.SQL("CREATE TABLE {} (id int8 PRIMARY KEY, v text)").format(
                        sql.Identifier(name)
                    )
                )
            listed = sql.SQL(", ").join(sql.Identifier(n) for n in names)
            if first == 1:
                conn.execute(
                    sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                        sql.Identifier(PUB_ALL), listed
                    )
                )
            else:
                conn.execute(
                    sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                        sql.Identifier(PUB_ALL), listed
                    )
                )
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(PUB_SMALL),
            sql.SQL(", ").join(sql.Identifier(table_name(i)) for i in range(1, small + 1)),
        )
    )
    for slot, _ in slots:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    print(f"{tables:,} tables and {len(slots)} slots in {time.monotonic() - started:.1f} s")


def _inserts(tables: int) -> Iterator[sql.Composed]:
    for i in range(1, tables + 1):
        yield sql.SQL("BEGIN; INSERT INTO {} VALUES (1, 'first'); COMMIT").format(
            sql.Identifier(table_name(i))
        )


def run_workload(conn: Conn, tables: int) -> str:
    """One INSERT transaction per table; END, once flushed."""
    started = time.monotonic()
    batch: list[sql.Composed] = []
    for statement in _inserts(tables):
        batch.append(statement)
        if len(batch) == TXNS_PER_ROUND_TRIP:
            conn.execute(sql.SQL("; ").join(batch))
            batch = []
    if batch:
        conn.execute(sql.SQL("; ").join(batch))
    end = current_lsn(conn)
    wait_for_wal_flush(conn, end)
    print(f"{tables:,} transactions in {time.monotonic() - started:.1f} s, END {end}")
    return end


# --- the consumers ---------------------------------------------------------------


def run_recvlogical(binary: str, dsn: str, slot: str, end: str, tmp: Path, timeout: float) -> Run:
    out = tmp / "recvlogical.out"
    argv = [binary, "-d", dsn, "--slot", slot, "--start", "--endpos", end]
    argv += ["-o", "proto_version=1", "-o", f"publication_names={PUB_ALL}"]
    argv += ["-f", str(out), "--no-loop"]
    stderr = tmp / "recvlogical.stderr"
    child = Child.spawn(argv, tmp / "recvlogical.stdout", stderr)
    try:
        if child.wait(timeout) is None:
            raise BenchError(f"pg_recvlogical did not reach {end} in {timeout}s")
        seconds = time.monotonic() - child.started
    finally:
        child.stop()
    if child.returncode != 0:
        raise BenchError(f"pg_recvlogical exited with {child.returncode}:\n{tail(stderr)}")
    return Run("pg_recvlogical", 0, seconds, None, child.cpu_seconds, None, "", argv)


def bigquery_args(url: str, dataset: str) -> list[str]:
    return [
        *(
            "--sink",
            "bigquery",
            "--bigquery-project",
            BIGQUERY_PROJECT,
            "--bigquery-dataset",
            dataset,
        ),
        *("--bigquery-endpoint", url, "--bigquery-load-interval", "0"),
    ]


def run_pg2sink(
    sink: str,
    label: str,
    dsn: str,
    slot: str,
    publication: str,
    tables: int,
    end: str,
    tmp: Path,
    targets: Targets,
    bigquery: Any,
    watch: Conn,
    timeout: float,
) -> Run:
    """pg2sink with `sink` on `publication` until its slot confirms END; then read back."""
    if sink == "bigquery":
        dataset = f"tables_{uuid.uuid4().hex[:8]}"
        args, name, path = bigquery_args(str(bigquery.url), dataset), dataset, tmp
    else:
        planned = plan_sink_run(sink, 1, tmp / label, targets)
        (tmp / label).mkdir(exist_ok=True)
        args, name, path = planned.args, planned.name, planned.path
    argv = pg2sink_argv(dsn, slot, publication, args)
    stderr = tmp / f"{label}.stderr"
    child = Child.spawn(argv, tmp / f"{label}.stdout", stderr)
    try:
        seconds = wait_confirmed(watch, slot, end, child, stderr, timeout) - child.started
        peak_kib = vm_hwm_kib(child.pid)
    finally:
        child.stop()
    if child.returncode not in (0, -signal.SIGTERM):
        raise BenchError(f"pg2sink {sink} exited with {child.returncode}:\n{tail(stderr)}")
    peak_kib = peak_kib or child.max_rss_kib
    found, note = read_back(sink, name, path, targets, bigquery)
    if found is not None and found != tables:
        raise BenchError(f"pg2sink {sink}: {found} of {tables} tables in the sink ({note})")
    peak = peak_kib / 1024 if peak_kib else None
    return Run(f"pg2sink {sink}", tables, seconds, peak, child.cpu_seconds, found, note, argv)


# --- reading the sinks back ---------------------------------------------------------


def read_back(
    sink: str, name: str, path: Path, targets: Targets, bigquery: Any
) -> tuple[int | None, str]:
    """(The tables holding a change in the sink, how they were found)."""
    if sink == "file":
        found = set()
        with open(path, "rb") as f:
            for line in f:
                if MODIFICATION_MARK in line:
                    found.add(json.loads(line)["name"])
        return len(found), "tables named by the file's Modification lines"
    if sink == "kafka":
        assert targets.kafka is not None
        return kafka_tables(targets.kafka.bootstrap_servers, name.rsplit(".", 1)[0] + "."), (
            "topics of the prefix holding a message"
        )
    if sink == "nats":
        return asyncio.run(nats_tables(str(targets.nats.url), name)), (
            "table subjects of the stream holding a message"
        )
    if sink == "kinesis":
        return kinesis_tables(str(targets.kinesis.url), name), (
            "tables named by the Modification records (GetRecords, every shard)"
        )
    if sink == "duckdb":
        return duckdb_tables(path), "raw tables (pg2sink_tables) holding a row"
    if sink == "bigquery":
        return bigquery_tables(str(bigquery.url), name), "raw tables of the dataset with a row"
    return None, "null sink: it discards every record, nothing to read back"


def kafka_tables(bootstrap_servers: str, prefix: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"pg2sink-bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        topics = consumer.list_topics(timeout=60).topics
        found = 0
        for topic, meta in topics.items():
            if not topic.startswith(prefix):
                continue
            for p in meta.partitions:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=30, cached=False
                )
                if high > low:
                    found += 1
                    break
        return found
    finally:
        consumer.close()


async def nats_tables(url: str, subject: str) -> int:
    """The table subjects (not `.schema`) of the run's stream holding a message; then the
    stream is deleted."""
    prefix = subject.split(".")[0]
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(prefix, subjects_filter=f"{prefix}.>")
        await js.delete_stream(prefix)
    finally:
        await nc.close()
    subjects = info.state.subjects or {}
    return sum(1 for s, n in subjects.items() if n and not s.endswith(".schema"))


def kinesis_tables(endpoint: str, stream: str) -> int:
    client = boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1")
    found = set()
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator: str | None = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            got = client.get_records(ShardIterator=iterator, Limit=10_000)
            if not got["Records"]:
                break
            for record in got["Records"]:
                for line in record["Data"].splitlines():
                    if MODIFICATION_MARK in line:
                        found.add(json.loads(line)["name"])
            iterator = got.get("NextShardIterator")
    return len(found)


def duckdb_tables(path: Path) -> int:
    with duckdb.connect(str(path), read_only=True) as con:
        raws = [
            str(json.loads(layout)["raw"])
            for (layout,) in con.execute("SELECT layout FROM pg2sink_tables").fetchall()
        ]
        found = 0
        for raw in raws:
            quoted = '"' + raw.replace('"', '""') + '"'
            count = con.execute(f"SELECT count(*) FROM {quoted}").fetchone()
            found += bool(count and count[0])
    return found


def bigquery_tables(url: str, dataset: str) -> int:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    client = bigquery.Client(
        project=BIGQUERY_PROJECT,
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        client_options=ClientOptions(api_endpoint=url),
    )
    found = 0
    for table in client.list_tables(f"{BIGQUERY_PROJECT}.{dataset}"):
        # the raw tables (public_t00001_raw ...), not the views nor the sink's own tables
        if table.table_type != "TABLE" or not table.table_id.endswith("_raw"):
            continue
        rows = client.get_table(table.reference).num_rows
        found += bool(rows)
    return found


# --- the run ----------------------------------------------------------------------


def start_bigquery(services: ModuleType, tmp: Path, stack: contextlib.ExitStack) -> Any:
    print(f"starting local-bigquery in {tmp} ...", flush=True)
    server = services.LocalBigQuery(base=tmp / "bigquery", port=services.free_port())
    stack.callback(server.destroy)
    server.start()
    return server


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    services = load_services()
    sinks = [s.strip() for s in args.sink.split(",") if s.strip()]
    for sink in sinks:
        if sink not in SINKS:
            raise BenchError(f"--sink {sink}: one of {', '.join(SINKS)}")
    if not 0 < args.small < args.tables:
        raise BenchError("--small must be above 0 and below --tables")
    slots = [("tables_recvlogical", PUB_ALL)]
    for sink in sinks:
        slots += [(f"tables_{sink}_small", PUB_SMALL), (f"tables_{sink}_all", PUB_ALL)]
    runs: list[Run] = []
    with contextlib.ExitStack() as stack:
        server = start_postgres(services, tmp, stack)
        dsn = server.dsn()
        targets = start_targets(services, tmp, stack, sinks)
        bigquery = start_bigquery(services, tmp, stack) if "bigquery" in sinks else None
        with psycopg.connect(dsn, autocommit=True) as conn:
            setup(conn, args.tables, args.small, slots)
            end = run_workload(conn, args.tables)
            recvlogical = pg_binary(services, "pg_recvlogical")
            machine = machine_info(conn, recvlogical)
            base = run_recvlogical(recvlogical, dsn, slots[0][0], end, tmp, args.timeout)
            print(f"pg_recvlogical: {base.seconds:.2f} s for {args.tables:,} tables", flush=True)
            runs.append(base)
            for sink in sinks:
                for size, publication in (("small", PUB_SMALL), ("all", PUB_ALL)):
                    tables = args.small if size == "small" else args.tables
                    run = run_pg2sink(
                        sink,
                        f"{sink}_{size}",
                        dsn,
                        f"tables_{sink}_{size}",
                        publication,
                        tables,
                        end,
                        tmp,
                        targets,
                        bigquery,
                        conn,
                        args.timeout,
                    )
                    print(
                        f"pg2sink {sink}, {tables:,} tables: {run.seconds:.2f} s,"
                        f" peak RSS {run.peak_rss_mib or 0:.1f} MiB",
                        flush=True,
                    )
                    runs.append(run)
    figures = report(args, sinks, runs, base)
    return {"machine": machine, "figures": figures, "runs": [asdict(r) for r in runs]}


def report(
    args: argparse.Namespace, sinks: Sequence[str], runs: Sequence[Run], base: Run
) -> list[dict[str, Any]]:
    print()
    print(f"bench-tables: {args.tables:,} tables, one single-row transaction each")
    print(f"baseline: pg_recvlogical {base.seconds:.2f} s (every table's change, {PUB_ALL})")
    print(
        f"{'sink':<10} {'s, ' + format(args.tables, ',') + ' tables':>16} {'x recvlogical':>14}"
        f" {'peak MiB':>9} {'peak MiB, ' + str(args.small):>15} {'KiB/table':>10}"
        f" {'CPU s':>7}  targets (< {TARGET_SECONDS:.0f} s, <= {TARGET_KIB_PER_TABLE:.0f} KiB)"
    )
    figures = []
    for sink in sinks:
        small = next(r for r in runs if r.consumer == f"pg2sink {sink}" and r.tables == args.small)
        big = next(r for r in runs if r.consumer == f"pg2sink {sink}" and r.tables == args.tables)
        growth = None
        if big.peak_rss_mib is not None and small.peak_rss_mib is not None:
            growth = (big.peak_rss_mib - small.peak_rss_mib) * 1024 / (args.tables - small.tables)
        ok = big.seconds < TARGET_SECONDS and growth is not None and growth <= TARGET_KIB_PER_TABLE
        print(
            f"{sink:<10} {big.seconds:>16.2f} {base.seconds / big.seconds:>13.2f}x"
            f" {big.peak_rss_mib or 0:>9.1f} {small.peak_rss_mib or 0:>15.1f}"
            f" {growth if growth is not None else float('nan'):>10.1f}"
            f" {big.client_cpu_seconds or 0:>7.1f}  {'met' if ok else 'MISSED'}"
        )
        figures.append(
            {
                "sink": sink,
                "tables": args.tables,
                "seconds": big.seconds,
                "ratio_to_recvlogical": base.seconds / big.seconds,
                "peak_rss_mib": big.peak_rss_mib,
                "small_tables": small.tables,
                "small_peak_rss_mib": small.peak_rss_mib,
                "kib_per_table": growth,
                "cpu_seconds": big.client_cpu_seconds,
                "read_back": big.note,
                "targets_met": ok,
            }
        )
    notes = {r.consumer: r.note for r in runs if r.note}
    print("read back:", "; ".join(f"{consumer}: {note}" for consumer, note in notes.items()))
    print("command:", shlex.join(["make", "bench-tables", f"ARGS={shlex.join(sys.argv[1:])}"]))
    return figures


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Many tables, one row each: time until every table's first change is "
        "through each sink, and pg2sink's peak RSS per table (see bench/README.md)."
    )
    p.add_argument(
        "--sink",
        default="file",
        metavar="SINK[,SINK...]",
        help=f"pg2sink's sinks, comma-separated, run one after another: {', '.join(SINKS)} "
        "(default file). The servers a sink needs start in the temporary directory",
    )
    p.add_argument(
        "--tables", type=int, default=10_000, help="tables, one row each (default 10,000)"
    )
    p.add_argument(
        "--small",
        type=int,
        default=100,
        help="tables of the comparison run the growth per table is measured against (default 100)",
    )
    p.add_argument(
        "--timeout", type=float, default=900.0, help="seconds allowed per run (default 900)"
    )
    p.add_argument(
        "--json", type=Path, metavar="PATH", help="also write every run's figures as JSON"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run_benchmark("bench-tables", args, bench, "pg2sink-bench-tables-")


if __name__ == "__main__":
    sys.exit(main())
