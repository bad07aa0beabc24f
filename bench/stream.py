"""`make bench-stream`: pg2sink with each chosen sink against pg_recvlogical on the same changes.

Method
------
1. Start a throwaway PostgreSQL (scripts/services.py: wal_level=logical,
   fsync off, synchronous_commit off) in a temporary directory, create one
   table (autovacuum off, so no VACUUM of it competes with the runs)

       bench (id int8 primary key, name text, amount numeric(12,2),
              at timestamptz, flag bool, doc jsonb)

   a publication `bench_pub` for it, and (1 + sinks) x N pgoutput slots
   (`bench_recvlogical_1..N`, `bench_pg2sink_1..N` for the file sink,
   `bench_pg2sink_<sink>_1..N` for another sink; N = `--repeat`, default 3)
   *before* any change is made, so every run decodes exactly the same WAL.
2. Run the workload: one INSERT transaction of 500,000 rows
   (`INSERT ... SELECT FROM generate_series`), one UPDATE transaction of
   250,000 rows, then 50,000 single-row transactions (half INSERT, half
   UPDATE, interleaved), sent 100 transactions per round trip as one
   simple-query string `BEGIN; ...; COMMIT; BEGIN; ...` so each is its own
   commit. The last part is checked: the rows they touched must carry
   50,000 distinct xmin values. END = pg_current_wal_insert_lsn() afterwards
   (the write position can be short of the last asynchronous commits), and
   the script waits until WAL is flushed up to END, as walsenders only send
   flushed WAL; otherwise the first run would wait for the WAL writer too.
   The expected change count is the sum of the three parts. `--scale`
   multiplies all three sizes.
3. The consumers then run alternately, N times each: pg_recvlogical on slot
   1, pg2sink with each sink in the order given on its slot 1, pg_recvlogical
   on slot 2, ... Alternating spreads
   drift on the machine (page cache, other load) over both. Each slot is
   dropped right after its run, which frees its WAL and spill files.
4. pg_recvlogical (the server's own client, C, no decoding of the pgoutput
   bytes) streams its slot with the same options pg2sink sends
   (proto_version=1, publication_names=bench_pub) into a file and exits at
   `--endpos END` (exit code 0); its time is process start to exit.
5. pg2sink runs as a user would run it (`python -m pg2sink --sink file ...`).
   Its time is process start (interpreter start-up included) until its slot's
   confirmed_flush_lsn >= END, polled every 50 ms; that is when every change
   is durably in the file (pg2sink confirms only what its sink fsynced, at
   most --flush-interval = 1 s after it was written). Then it gets SIGTERM.
   Peak RSS is /proc/<pid>/status VmHWM read just before SIGTERM (fallback:
   the ru_maxrss of the reaped process, then getrusage(RUSAGE_CHILDREN); both
   can overstate it, as Linux carries the forking parent's peak across exec).
   The output must hold exactly the expected number of Modification lines.

6. `--sink` takes a comma-separated list of registered sinks
   (pg2sink/sinks/entries.py) this bench knows: file, kafka, null, nats,
   kinesis, duckdb (`both` = file,kafka). Every sink is timed the same way, as
   pg2sink confirms only what its sink durably holds; the servers a sink needs
   are started fresh in the temporary directory (scripts/services.py), never
   the shared ones of .services/env; each run writes to a fresh topic, subject
   or stream. After each run (pg2sink stopped) its output is counted and must
   equal the expected changes:
   - kafka: a Kafka broker and Apicurio Registry, warmed up first; `--sink
     kafka` (Avro, acks=all, idempotent), a fresh `--topic-prefix`; the topic's
     messages (high minus low watermark over its partitions). Target >= 0.6.
   - null: nothing is written and nothing is counted (the report says so).
     Target >= 1.2: pg2sink's decoding alone against pg_recvlogical's.
   - nats: nats-server with JetStream; `--nats-subject-prefix` fresh, the
     stream pg2sink creates (its default name); the messages on the table's
     subject from JetStream's stream info (its Schema record has its own
     subject), then the stream is deleted, so the next run meets the server as
     the first did. Target >= 0.8.
   - kinesis: kinesalite; pg2sink creates a 4-shard stream
     (`--kinesis-create-stream 4`, inside its timed run); the Modification
     records read back with GetRecords over every shard (JSON lines: the
     Schema record is a record too), skipped with the reason printed if that
     takes over 120 s. No target: kinesalite's own pace bounds it.
   - duckdb: `--duckdb-path` a fresh file; the rows of the table's raw
     changelog table (named in pg2sink_tables). Target >= 0.8, peak RSS
     below 300 MiB as for every sink.
   The sink's server CPU seconds during the run (from /proc) are printed too.
7. `--nats-reference [raw|nats.go]` adds a consumer that is not pg2sink:
   bench/natsref, a Go program (pglogrepl and nats.go, built with `go build` into
   the temporary directory) that does the least of the NATS sink's work: pgoutput
   from its own slot, one JSON message per change with every value a string, a
   Nats-Msg-Id each, every PubAck awaited (at most 20,000 in flight), a
   transaction's end confirmed once all before it is acknowledged. `raw` writes
   the protocol's frames itself, as pg2sink does; `nats.go` publishes with the NATS
   client's PublishMsgAsync. It runs after the pg2sink runs of each round,
   against the same nats-server, timed and counted as `--sink nats` is. Its ratio to
   pg_recvlogical has no target: it shows what a compiled client reaches on the
   machine at hand, and `pg2sink nats / natsref` how far pg2sink is from it.

Report: every run's seconds and changes/s, then per consumer the median of
changes/s, seconds, start-up, client CPU, walsender CPU and output size, and
the maximum peak RSS. The ratio checked against the target is
median(pg2sink changes/s) / median(pg_recvlogical changes/s); the minimum
and maximum of the per-run ratio (pg2sink run i over pg_recvlogical run i)
show the spread. `--cprofile` profiles pg2sink's first run only (that run
still counts in the summary).

Both walsenders do the same work (decoding, reorder buffer spilled to disk
for the big transactions); the difference is the client. CPU seconds of the
client (from wait4) and of its walsender (sampled from /proc) are printed
to show where time goes. The benchmark reports the targets (each sink's
ratio above, peak RSS below 300 MiB); it does not
assert them: the exit code is 0 unless something broke.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import pstats
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import duckdb
import nats
import psycopg
from common import (
    MODIFICATION_MARK,
    POLL_SECONDS,
    ROW_EXPRESSIONS,
    TABLE,
    TARGET_RSS_MIB,
    BenchError,
    Child,
    Conn,
    KafkaTarget,
    count_modifications,
    cpu_seconds,
    create_bench_table,
    create_publication,
    current_lsn,
    drop_slot,
    kafka_sink_args,
    load_services,
    machine_info,
    pg2sink_argv,
    pg_binary,
    run_benchmark,
    slot_state,
    start_kafka,
    start_postgres,
    tail,
    topic_bytes,
    topic_message_count,
    vm_hwm_kib,
    warm_up_broker,
)
from psycopg import sql

from pg2sink.sinks.entries import names as registered_sinks

PUBLICATION = "bench_pub"
RECVLOGICAL_SLOT = "bench_recvlogical"  # runs use bench_recvlogical_1..N
PG2SINK_SLOT = "bench_pg2sink"  # runs use bench_pg2sink_1..N
# --sink S (other than file): bench_pg2sink_S_1..N (sink_slot_prefix)
DEFAULT_REPEAT = 3

FULL_INSERT_ROWS = 500_000
FULL_UPDATE_ROWS = 250_000
FULL_SMALL_TXNS = 50_000
#: Small transactions sent per round trip (one simple-query string).
SMALL_TXNS_PER_ROUND_TRIP = 100

TARGET_RATIO = 0.8
TARGET_RATIO_KAFKA = 0.6

#: The sinks this bench runs and checks, with each one's ratio target over
#: pg_recvlogical (None: reported, no target: kinesalite's own pace bounds it).
SINK_RATIO_TARGETS: dict[str, float | None] = {
    "file": TARGET_RATIO,
    "kafka": TARGET_RATIO_KAFKA,
    "null": 1.2,
    "nats": 0.8,
    "kinesis": None,
    "duckdb": 0.8,
    # --nats-reference: not pg2sink (bench/natsref), reported only
    "natsref": None,
}
#: The Go reference publisher's consumer (--nats-reference), run like a sink.
NATS_REFERENCE = "natsref"
#: `--sink both`, as before the list of sinks
BOTH = ("file", "kafka")
#: Shards of the Kinesis stream pg2sink creates for each run (--kinesis-create-stream)
KINESIS_SHARDS = 4
#: Longest the Kinesis output check may read the stream before it gives up (and says so)
KINESIS_COUNT_SECONDS = 120.0


# --- schema and workload -----------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    insert_rows: int
    update_rows: int
    small_txns: int

    @property
    def small_inserts(self) -> int:
        return self.small_txns // 2

    @property
    def small_updates(self) -> int:
        return self.small_txns - self.small_inserts

    @property
    def changes(self) -> int:
        return self.insert_rows + self.update_rows + self.small_txns

    def check(self) -> None:
        if min(self.insert_rows, self.update_rows, self.small_txns) < 1:
            raise BenchError("every workload size must be at least 1")
        # Small UPDATEs touch ids the big UPDATE did not, one row each, so
        # that their distinct xmin values prove they were separate commits.
        if self.update_rows + self.small_updates > self.insert_rows:
            raise BenchError(
                f"--update-rows ({self.update_rows}) plus half of --small-txns "
                f"({self.small_updates}) must not exceed --insert-rows ({self.insert_rows})"
            )


@dataclass
class Workload:
    start_lsn: str
    end_lsn: str
    wal_bytes: int
    changes: int
    transactions: int
    insert_seconds: float
    update_seconds: float
    small_seconds: float


def slot_name(prefix: str, run: int) -> str:
    return f"{prefix}_{run}"


def sink_slot_prefix(sink: str) -> str:
    """The slot prefix of pg2sink's runs with `sink` (the file sink's is the original one)."""
    return PG2SINK_SLOT if sink == "file" else f"{PG2SINK_SLOT}_{sink}"


def consumer_name(sink: str) -> str:
    """The Consumer.name of pg2sink's runs with `sink` ("pg2sink" for the file sink)."""
    if sink == NATS_REFERENCE:
        return "natsref (Go)"
    return "pg2sink" if sink == "file" else f"pg2sink {sink}"


def parse_sinks(text: str) -> list[str]:
    """`--sink`: a comma-separated list of registered sinks this bench knows; `both` is
    file,kafka."""
    sinks = list(BOTH) if text == "both" else [s.strip() for s in text.split(",") if s.strip()]
    registered = set(registered_sinks())
    for sink in sinks:
        if sink not in registered:
            raise BenchError(
                f"--sink {sink}: not a registered sink ({', '.join(sorted(registered))})"
            )
        if sink not in SINK_RATIO_TARGETS:
            raise BenchError(f"--sink {sink}: this bench does not know how to check its output")
    if not sinks or len(set(sinks)) != len(sinks):
        raise BenchError(f"--sink {text!r}: name each sink once")
    return sinks


def setup_schema(conn: Conn, repeat: int, prefixes: Sequence[str]) -> None:
    """The table, the publication and every run's slot, before any change is made."""
    create_bench_table(conn)
    create_publication(conn, PUBLICATION, TABLE)
    row = conn.execute("SELECT current_setting('max_replication_slots')::int").fetchone()
    assert row is not None
    needed = len(prefixes) * repeat
    if needed > row[0]:
        raise BenchError(
            f"--repeat {repeat} needs {needed} slots; max_replication_slots is {row[0]}"
        )
    for run in range(1, repeat + 1):
        for prefix in prefixes:
            conn.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                (slot_name(prefix, run),),
            )


def wait_for_wal_flush(conn: Conn, lsn: str, timeout: float = 30.0) -> None:
    """Wait until WAL is flushed up to `lsn`.

    With synchronous_commit=off the tail of the workload is flushed by the WAL
    writer some time later, and walsenders only send flushed WAL: without this
    wait the first consumer run would also wait for that flush.
    """
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (lsn,)).fetchone()
        if row is not None and row[0]:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"WAL was not flushed up to {lsn} within {timeout}s")
        time.sleep(0.01)


def _small_statements(sizes: Sizes) -> Iterator[sql.Composable]:
    """Interleaved single-row INSERTs (new ids) and UPDATEs (distinct existing ids)."""
    insert = sql.SQL("INSERT INTO {} SELECT {} FROM (SELECT {{id}}::int8 AS i) AS g").format(
        sql.Identifier(TABLE), ROW_EXPRESSIONS
    )
    update = sql.SQL(
        "UPDATE {} SET amount = amount + 0.01, at = now(),"
        " doc = doc || jsonb_build_object('touched', {{id}}) WHERE id = {{id}}"
    ).format(sql.Identifier(TABLE))
    # The templates are rendered once; each statement only formats its id.
    insert_text = insert.as_string()
    update_text = update.as_string()
    next_insert = sizes.insert_rows + 1
    next_update = sizes.update_rows + 1
    for n in range(sizes.small_txns):
        if n % 2 == 0 and next_insert <= sizes.insert_rows + sizes.small_inserts:
            yield sql.SQL(insert_text).format(id=sql.Literal(next_insert))
            next_insert += 1
        else:
            yield sql.SQL(update_text).format(id=sql.Literal(next_update))
            next_update += 1


def run_workload(conn: Conn, sizes: Sizes) -> Workload:
    """The three parts of the workload, on an autocommit connection."""
    start = current_lsn(conn)

    t0 = time.monotonic()
    cur = conn.execute(
        sql.SQL("INSERT INTO {} SELECT {} FROM generate_series(1, {}::int8) AS g(i)").format(
            sql.Identifier(TABLE), ROW_EXPRESSIONS, sql.Literal(sizes.insert_rows)
        )
    )
    if cur.rowcount != sizes.insert_rows:
        raise BenchError(f"bulk INSERT wrote {cur.rowcount} rows, not {sizes.insert_rows}")
    t1 = time.monotonic()
    cur = conn.execute(
        sql.SQL(
            "UPDATE {} SET amount = amount + 1.25, at = at + interval '1 hour',"
            " flag = NOT flag, doc = doc || '{{\"v\": 2}}' WHERE id <= {}"
        ).format(sql.Identifier(TABLE), sql.Literal(sizes.update_rows))
    )
    if cur.rowcount != sizes.update_rows:
        raise BenchError(f"bulk UPDATE changed {cur.rowcount} rows, not {sizes.update_rows}")
    t2 = time.monotonic()

    # A simple-query string with explicit BEGIN/COMMIT runs each block as its
    # own transaction; psycopg uses the simple protocol when there are no
    # parameters. https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-MULTI-STATEMENT
    batch: list[sql.Composable] = []
    for stmt in _small_statements(sizes):
        batch.append(sql.SQL("BEGIN; {}; COMMIT").format(stmt))
        if len(batch) == SMALL_TXNS_PER_ROUND_TRIP:
            conn.execute(sql.SQL("; ").join(batch))
            batch = []
    if batch:
        conn.execute(sql.SQL("; ").join(batch))
    t3 = time.monotonic()

    commits = conn.execute(
        sql.SQL(
            "SELECT count(DISTINCT xmin::text) FROM {} WHERE id > {} AND id <= {} OR id > {}"
        ).format(
            sql.Identifier(TABLE),
            sql.Literal(sizes.update_rows),
            sql.Literal(sizes.update_rows + sizes.small_updates),
            sql.Literal(sizes.insert_rows),
        )
    ).fetchone()
    assert commits is not None
    if commits[0] != sizes.small_txns:
        raise BenchError(
            f"the small transactions were {commits[0]} commits, not {sizes.small_txns}"
        )

    end = current_lsn(conn)
    wait_for_wal_flush(conn, end)
    row = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)).fetchone()
    assert row is not None
    return Workload(
        start_lsn=start,
        end_lsn=end,
        wal_bytes=int(row[0]),
        changes=sizes.changes,
        transactions=2 + sizes.small_txns,
        insert_seconds=t1 - t0,
        update_seconds=t2 - t1,
        small_seconds=t3 - t2,
    )


# --- watching a consumer -----------------------------------------------------


@dataclass
class Consumer:
    """One run of one consumer on its own slot."""

    name: str
    run: int
    slot: str
    command: list[str]
    changes: int
    seconds: float
    startup_seconds: float | None
    client_cpu_seconds: float | None
    walsender_cpu_seconds: float | None
    peak_rss_mib: float | None
    output_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def changes_per_second(self) -> float:
        return self.changes / self.seconds if self.seconds > 0 else 0.0


def run_recvlogical(
    binary: str, dsn: str, run: int, workload: Workload, tmp: Path, timeout: float, watch: Conn
) -> Consumer:
    slot = slot_name(RECVLOGICAL_SLOT, run)
    out = tmp / f"recvlogical_{run}.out"
    argv = [
        binary,
        "-d",
        dsn,
        "--slot",
        slot,
        "--start",
        "--endpos",
        workload.end_lsn,
        "-o",
        "proto_version=1",
        "-o",
        f"publication_names={PUBLICATION}",
        "-f",
        str(out),
        "--no-loop",
    ]
    stderr = tmp / f"recvlogical_{run}.stderr"
    child = Child.spawn(argv, tmp / f"recvlogical_{run}.stdout", stderr)
    startup: float | None = None
    walsender_cpu: float | None = None
    peak_kib: int | None = None
    try:
        while child.poll() is None:
            if time.monotonic() - child.started > timeout:
                raise BenchError(f"pg_recvlogical did not reach {workload.end_lsn} in {timeout}s")
            state = slot_state(watch, slot, workload.end_lsn)
            if state.active_pid is not None:
                # Connected, so past exec: VmHWM is pg_recvlogical's own now.
                startup = startup or time.monotonic() - child.started
                walsender_cpu = cpu_seconds(state.active_pid) or walsender_cpu
                peak_kib = vm_hwm_kib(child.pid) or peak_kib
            time.sleep(POLL_SECONDS)
        seconds = time.monotonic() - child.started
    finally:
        child.stop()
    if child.returncode != 0:
        raise BenchError(
            f"pg_recvlogical exited with {child.returncode}:\n{tail(stderr)}\n"
            f"command: {shlex.join(argv)}"
        )
    return Consumer(
        name="pg_recvlogical",
        run=run,
        slot=slot,
        command=argv,
        changes=workload.changes,
        seconds=seconds,
        startup_seconds=startup,
        client_cpu_seconds=child.cpu_seconds,
        walsender_cpu_seconds=walsender_cpu,
        # Not wait4's ru_maxrss: Linux carries the forking Python's peak over exec.
        peak_rss_mib=peak_kib / 1024 if peak_kib else None,
        output_bytes=out.stat().st_size if out.exists() else 0,
    )


# --- the sinks' servers and output ---------------------------------------------


@dataclass(frozen=True)
class Targets:
    """The servers this bench started for the chosen sinks (None: that sink not chosen)."""

    kafka: KafkaTarget | None = None
    nats: Any = None  # services.NatsServer
    kinesis: Any = None  # services.Kinesalite
    nats_reference: Path | None = None  # the built bench/natsref (--nats-reference)
    nats_reference_client: str = "raw"  # its --client


def start_targets(
    services: ModuleType,
    tmp: Path,
    stack: contextlib.ExitStack,
    sinks: Sequence[str],
    reference_client: str = "raw",
) -> Targets:
    """Start, in `tmp`, the servers `sinks` write to; each is destroyed when `stack` closes.

    Fresh servers, not the ones of .services/env: a run's stream or topic is then the
    only one on its server, and the tests sharing that server do not compete with it.
    """
    kafka = start_kafka(services, tmp, stack) if "kafka" in sinks else None
    if kafka is not None:
        print("warming up the broker (400,000 messages to a scratch topic) ...", flush=True)
        print(f"broker warmed up in {warm_up_broker(kafka):.1f} s", flush=True)
    nats_server = kinesis = None
    reference = build_nats_reference(tmp) if NATS_REFERENCE in sinks else None
    if "nats" in sinks or reference is not None:
        print(f"starting nats-server (JetStream) in {tmp} ...", flush=True)
        nats_server = services.NatsServer(base=tmp / "nats", port=services.free_port())
        stack.callback(nats_server.destroy)
        nats_server.start()
    if "kinesis" in sinks:
        print(f"starting kinesalite in {tmp} ...", flush=True)
        kinesis = services.Kinesalite(base=tmp / "kinesis", port=services.free_port())
        stack.callback(kinesis.destroy)
        kinesis.start()
        # kinesalite checks that requests are signed, not by whom; pg2sink inherits these
        for key, value in services.KINESIS_CLIENT_ENV.items():
            os.environ.setdefault(key, value)
    return Targets(kafka, nats_server, kinesis, reference, reference_client)


def build_nats_reference(tmp: Path) -> Path:
    """`go build` bench/natsref into `tmp` (--nats-reference); BenchError without Go."""
    go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
    if go is None:
        raise BenchError("--nats-reference builds bench/natsref with Go: no `go` on PATH")
    binary = tmp / "natsref"
    print("building bench/natsref (go build) ...", flush=True)
    built = subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=Path(__file__).resolve().parent / "natsref",
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        raise BenchError(f"go build of bench/natsref failed:\n{built.stderr.strip()}")
    return binary


@dataclass(frozen=True)
class SinkRun:
    """Where one pg2sink run writes: its --sink options and what its output check reads."""

    sink: str
    args: list[str]
    path: Path  # the file sink's file, DuckDB's database (unused by the other sinks)
    name: str  # Kafka topic, NATS subject, Kinesis stream ("" for file, duckdb, null)
    server_pid: int | None  # the server's pid, to read its CPU seconds around the run


def plan_sink_run(sink: str, run: int, tmp: Path, targets: Targets) -> SinkRun:
    """pg2sink's --sink options for run `run`; a fresh topic, subject or stream per run."""
    prefix = f"bench{run}_{uuid.uuid4().hex[:8]}"
    if sink == "file":
        out = tmp / f"pg2sink_{run}.jsonl"
        return SinkRun(sink, ["--sink", "file", "--file-path", str(out)], out, "", None)
    if sink == "kafka":
        assert targets.kafka is not None
        args = kafka_sink_args(targets.kafka, prefix)
        topic = f"{prefix}.public.{TABLE}"
        return SinkRun(sink, args, tmp, topic, targets.kafka.broker_pid)
    if sink == "nats":
        url, pid = str(targets.nats.url), targets.nats.pid()
        args = ["--sink", "nats", "--nats-url", url, "--nats-subject-prefix", prefix]
        return SinkRun(sink, args, tmp, f"{prefix}.public.{TABLE}", pid)
    if sink == "kinesis":
        endpoint, pid = str(targets.kinesis.url), targets.kinesis.pid()
        args = ["--sink", "kinesis", "--kinesis-stream", prefix, "--kinesis-endpoint", endpoint]
        args += ["--kinesis-region", "us-east-1", "--kinesis-create-stream", str(KINESIS_SHARDS)]
        return SinkRun(sink, args, tmp, prefix, pid)
    if sink == "duckdb":
        db = tmp / f"pg2sink_{run}.duckdb"
        return SinkRun(sink, ["--sink", "duckdb", "--duckdb-path", str(db)], db, "", None)
    if sink == "null":
        return SinkRun(sink, ["--sink", "null"], tmp, "", None)
    raise BenchError(f"--sink {sink}: no output check")


@dataclass(frozen=True)
class Output:
    """What a run left in its sink: the changes counted there (None: not counted, `note`
    says why), its size in bytes and how both were measured."""

    changes: int | None
    bytes: int
    note: str


async def _nats_subject_state(url: str, stream: str, subject: str) -> tuple[int, int]:
    """(messages on `subject`, bytes of the whole stream) from JetStream's stream info;
    then the stream is deleted, so that every run meets the same server: a stream's
    de-duplication map (one entry per Nats-Msg-Id, kept for its duplicate window) stays
    in nats-server's heap, and its garbage collector scanned the earlier runs' maps during
    the later runs (measured: the server's CPU grew from run to run)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream, subjects_filter=subject)
        await js.delete_stream(stream)
    finally:
        await nc.close()
    return (info.state.subjects or {}).get(subject, 0), info.state.bytes


def kinesis_record_count(endpoint: str, stream: str, budget: float) -> tuple[int, int] | None:
    """(Modification records, data bytes of all) over every shard of `stream`, read from
    TRIM_HORIZON with GetRecords; None when that takes longer than `budget` seconds.

    The JSON-lines records include the table's Schema record: only Modifications count.
    """
    client = boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1")
    deadline = time.monotonic() + budget
    records = size = 0
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator: str | None = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            if time.monotonic() > deadline:
                return None
            got = client.get_records(ShardIterator=iterator, Limit=10_000)
            if not got["Records"]:  # the shard's end: pg2sink has stopped writing
                break
            records += sum(MODIFICATION_MARK in r["Data"] for r in got["Records"])
            size += sum(len(r["Data"]) for r in got["Records"])
            iterator = got.get("NextShardIterator")
    return records, size


def duckdb_raw_rows(path: Path) -> int:
    """Rows of the bench table's raw changelog table (its name from pg2sink_tables)."""
    with duckdb.connect(str(path), read_only=True) as con:
        row = con.execute(
            "SELECT layout FROM pg2sink_tables WHERE namespace = 'public' AND name = ?", [TABLE]
        ).fetchone()
        if row is None:
            raise BenchError(f"{path} has no raw table of public.{TABLE}")
        raw = str(json.loads(row[0])["raw"]).replace('"', '""')
        count = con.execute(f'SELECT count(*) FROM "{raw}"').fetchone()
    assert count is not None
    return int(count[0])


def count_output(target: SinkRun, targets: Targets) -> Output:
    """Count what one run left in its sink (after pg2sink stopped)."""
    if target.sink == "file":
        modifications, lines = count_modifications(target.path)
        return Output(modifications, target.path.stat().st_size, f"{lines} lines in the file")
    if target.sink == "kafka":
        assert targets.kafka is not None
        # Only Modification records go to a table's topic (no --schema-topic).
        count = topic_message_count(targets.kafka.bootstrap_servers, target.name)
        size = topic_bytes(targets.kafka.data, target.name)
        return Output(count, size, "topic messages; output: its log segments on disk")
    if target.sink == "nats":
        stream = target.name.split(".")[0]  # pg2sink's default stream name: the prefix
        count, size = asyncio.run(_nats_subject_state(str(targets.nats.url), stream, target.name))
        return Output(count, size, "messages on the table's subject; output: the stream's bytes")
    if target.sink == "kinesis":
        found = kinesis_record_count(str(targets.kinesis.url), target.name, KINESIS_COUNT_SECONDS)
        if found is None:
            return Output(None, 0, f"not counted: GetRecords took over {KINESIS_COUNT_SECONDS}s")
        return Output(
            found[0],
            found[1],
            "Modification records (GetRecords, every shard); output: record data",
        )
    if target.sink == "duckdb":
        rows = duckdb_raw_rows(target.path)
        return Output(rows, target.path.stat().st_size, "raw table rows; output: database file")
    return Output(None, 0, "null sink: it discards every record, nothing to count")


# --- pg2sink ------------------------------------------------------------------


def run_pg2sink(
    dsn: str,
    run: int,
    workload: Workload,
    tmp: Path,
    timeout: float,
    watch: Conn,
    profile: Path | None,
    kafka: KafkaTarget | None = None,
    *,
    sink: str | None = None,
    targets: Targets | None = None,
) -> Consumer:
    """One pg2sink run with `sink` (default: kafka when `kafka` is given, else file) on its
    own slot, timed until the slot confirms END; then its output is counted. `sink`
    NATS_REFERENCE runs bench/natsref instead, measured and counted as --sink nats."""
    sink = sink or ("kafka" if kafka is not None else "file")
    targets = targets or Targets(kafka=kafka)
    name = consumer_name(sink)
    label = re.sub(r"[^\w]+", "_", name).strip("_")
    slot = slot_name(sink_slot_prefix(sink), run)
    if sink == NATS_REFERENCE:
        # the same server, a fresh prefix, and the same output check as --sink nats
        target = plan_sink_run("nats", run, tmp, targets)
        assert targets.nats_reference is not None
        argv = [
            str(targets.nats_reference),
            *("--dsn", dsn, "--slot", slot, "--publication", PUBLICATION),
            *("--url", str(targets.nats.url), "--subject-prefix", target.name.split(".")[0]),
            *("--endpos", workload.end_lsn, "--client", targets.nats_reference_client),
        ]
    else:
        target = plan_sink_run(sink, run, tmp, targets)
        python = [sys.executable]
        if profile is not None:
            python += ["-m", "cProfile", "-o", str(profile)]
        argv = pg2sink_argv(dsn, slot, PUBLICATION, target.args, "warning", python)
    stderr = tmp / f"{label}_{run}.stderr"
    rusage_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # the sink's server shares the machine's cores with pg2sink and PostgreSQL: its CPU too
    server_before = cpu_seconds(target.server_pid) if target.server_pid is not None else None
    child = Child.spawn(argv, tmp / f"{label}_{run}.stdout", stderr)
    startup: float | None = None
    server_after: float | None = None
    walsender_cpu: float | None = None
    peak_kib: int | None = None
    try:
        while True:
            if child.poll() is not None:
                raise BenchError(
                    f"{name} exited with {child.returncode} before confirming "
                    f"{workload.end_lsn}:\n{tail(stderr)}\ncommand: {shlex.join(argv)}"
                )
            elapsed = time.monotonic() - child.started
            if elapsed > timeout:
                raise BenchError(
                    f"{name} did not confirm {workload.end_lsn} in {timeout}s:\n{tail(stderr)}"
                )
            state = slot_state(watch, slot, workload.end_lsn)
            if state.active_pid is not None:
                startup = startup or elapsed
                walsender_cpu = cpu_seconds(state.active_pid) or walsender_cpu
            if state.reached_end:
                seconds = time.monotonic() - child.started
                peak_kib = vm_hwm_kib(child.pid)
                if target.server_pid is not None:
                    server_after = cpu_seconds(target.server_pid)
                break
            time.sleep(POLL_SECONDS)
    finally:
        child.stop()
    if child.returncode not in (0, -signal.SIGTERM):
        raise BenchError(f"{name} exited with {child.returncode} after SIGTERM:\n{tail(stderr)}")
    if peak_kib is None:
        peak_kib = child.max_rss_kib
    if peak_kib is None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        peak_kib = after if after > rusage_before else None

    output = count_output(target, targets)
    if output.changes is not None and output.changes != workload.changes:
        raise BenchError(
            f"{name} run {run} left {output.changes} changes "
            f"({output.note}), expected {workload.changes}"
        )
    return Consumer(
        name=name,
        run=run,
        slot=slot,
        command=argv,
        changes=workload.changes if output.changes is None else output.changes,
        seconds=seconds,
        startup_seconds=startup,
        client_cpu_seconds=child.cpu_seconds,
        walsender_cpu_seconds=walsender_cpu,
        peak_rss_mib=peak_kib / 1024 if peak_kib else None,
        output_bytes=output.bytes,
        extra={
            "counted": output.changes is not None,
            "output_note": output.note,
            "stderr_tail": tail(stderr, 10) if stderr.stat().st_size else "",
            "server_cpu_seconds": (
                server_after - server_before
                if server_before is not None and server_after is not None
                else None
            ),
        },
    )


# --- report ------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _max(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _as_dict(c: Consumer) -> dict[str, Any]:
    return {
        **{k: v for k, v in asdict(c).items() if k != "name"},
        "changes_per_second": c.changes_per_second,
    }


def summarize(runs: Sequence[Consumer]) -> dict[str, Any]:
    """Medians over a consumer's runs; peak RSS is the maximum."""
    return {
        "runs": len(runs),
        "changes": runs[0].changes,
        "seconds": [c.seconds for c in runs],
        "seconds_median": _median([c.seconds for c in runs]),
        "changes_per_second_median": _median([c.changes_per_second for c in runs]),
        "startup_seconds_median": _median([c.startup_seconds for c in runs]),
        "client_cpu_seconds_median": _median([c.client_cpu_seconds for c in runs]),
        "walsender_cpu_seconds_median": _median([c.walsender_cpu_seconds for c in runs]),
        "peak_rss_mib_max": _max([c.peak_rss_mib for c in runs]),
        "output_bytes_median": _median([c.output_bytes for c in runs]),
    }


#: The ratio target of each pg2sink consumer (by Consumer.name; None: report only).
RATIO_TARGETS = {consumer_name(sink): target for sink, target in SINK_RATIO_TARGETS.items()}


def _target_text(target: float | None, ok: bool | None) -> str:
    """`target >= 0.8: PASS`, or that there is none (the figure is only reported)."""
    if target is None or ok is None:
        return "no target (reported)"
    return f"target >= {target}: {'PASS' if ok else 'MISS'}"


def report(
    workload: Workload,
    recvs: Sequence[Consumer],
    sink_runs: dict[str, list[Consumer]],
    info: dict[str, Any],
    profiled: bool,
) -> dict[str, Any]:
    """Print the tables and targets; `sink_runs` maps each pg2sink consumer to its runs."""
    repeat = len(recvs)
    summaries = {"pg_recvlogical": summarize(recvs)}
    summaries.update({name: summarize(runs) for name, runs in sink_runs.items()})
    recv_median = summaries["pg_recvlogical"]["changes_per_second_median"]
    ratios = {
        name: summaries[name]["changes_per_second_median"] / recv_median for name in sink_runs
    }
    run_ratios = {
        name: [
            s.changes_per_second / r.changes_per_second for r, s in zip(recvs, runs, strict=True)
        ]
        for name, runs in sink_runs.items()
    }
    rss = {name: summaries[name]["peak_rss_mib_max"] for name in sink_runs}
    ratio_ok = {
        name: None if RATIO_TARGETS[name] is None else ratios[name] >= (RATIO_TARGETS[name] or 0)
        for name in sink_runs
    }
    rss_ok = {name: rss[name] is not None and rss[name] < TARGET_RSS_MIB for name in sink_runs}
    first = next(iter(sink_runs.values()))

    print()
    print(f"bench: {shlex.join([sys.executable, *sys.argv])}")
    print(
        f"machine: nproc={info['nproc']} cpu={info['cpu']!r} kernel={info['kernel']} "
        f"python={info['python']}"
    )
    print(f"postgresql: {info['postgresql']} ({info['pg_recvlogical']}); {info['pg2sink']}")
    print(
        f"workload: {workload.changes:,} changes in {workload.transactions:,} transactions, "
        f"{workload.wal_bytes / 2**20:,.1f} MiB of WAL ({workload.start_lsn} -> "
        f"{workload.end_lsn}); insert {workload.insert_seconds:.1f}s, update "
        f"{workload.update_seconds:.1f}s, small txns {workload.small_seconds:.1f}s"
    )
    print(
        f"runs: {repeat} of each consumer, alternating (pg_recvlogical 1, "
        f"{', '.join(f'{name} 1' for name in sink_runs)}, ...), "
        "each on its own slot created before the workload"
    )
    for c in (recvs[0], *(runs[0] for runs in sink_runs.values())):
        print(f"{c.name} command (run 1; run i uses slot and output _i): {shlex.join(c.command)}")
    if profiled:
        print(
            f"NOTE: {first[0].name} run 1 (*) ran under cProfile: its time and RSS are "
            "inflated and still count in the summary"
        )
    print()
    header = f"{'run':>3} {'pg_recvlogical s':>16} {'changes/s':>10}"
    for name in sink_runs:
        header += f" {name + ' s':>16} {'changes/s':>10} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for i, r in enumerate(recvs):
        line = f"{r.run:>3} {r.seconds:>16.2f} {r.changes_per_second:>10,.0f}"
        for name, runs in sink_runs.items():
            s = runs[i]
            mark = "*" if profiled and s is first[0] else " "
            line += (
                f" {s.seconds:>15.2f}{mark} {s.changes_per_second:>10,.0f} "
                f"{run_ratios[name][i]:>6.2f}"
            )
        print(line)
    print()
    header = (
        f"{'consumer':<15} {'changes':>9} {'seconds':>8} {'changes/s':>10} "
        f"{'startup s':>9} {'client CPU s':>12} {'walsender CPU s':>15} "
        f"{'peak RSS MiB':>12} {'output MiB':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, m in summaries.items():
        print(
            f"{name:<15} {m['changes']:>9,} {m['seconds_median']:>8.2f} "
            f"{m['changes_per_second_median']:>10,.0f} "
            f"{_fmt(m['startup_seconds_median'], '.2f'):>9} "
            f"{_fmt(m['client_cpu_seconds_median'], '.2f'):>12} "
            f"{_fmt(m['walsender_cpu_seconds_median'], '.2f'):>15} "
            f"{_fmt(m['peak_rss_mib_max'], '.1f'):>12} "
            f"{m['output_bytes_median'] / 2**20:>10.1f}"
        )
    print(f"(medians of {repeat} runs; peak RSS is the maximum)")
    for name, runs in sink_runs.items():
        print(f"({name} output check, run 1: {runs[0].extra['output_note']})")
        server_cpu = [s.extra.get("server_cpu_seconds") for s in runs]
        server = _median(server_cpu)
        if server is not None:
            each = ", ".join(_fmt(c, ".2f") for c in server_cpu)
            print(f"({name}: its server's CPU s during a run, median: {server:.2f}; runs: {each})")
    print()
    for name in sink_runs:
        print(
            f"{name} / pg_recvlogical, median changes/s: {ratios[name]:.2f}   "
            f"{_target_text(RATIO_TARGETS[name], ratio_ok[name])}   "
            f"(per-run ratio min {min(run_ratios[name]):.2f}, "
            f"max {max(run_ratios[name]):.2f})"
        )
    reference, nats = consumer_name(NATS_REFERENCE), consumer_name("nats")
    if reference in sink_runs and nats in sink_runs:
        print(
            f"{nats} / {reference}, median changes/s: {ratios[nats] / ratios[reference]:.2f}"
            "   (how far pg2sink is from the compiled reference on this machine)"
        )
    for name in sink_runs:
        print(
            f"{name} peak RSS (max of {repeat} runs): {_fmt(rss[name], '.1f')} MiB   "
            f"target < {TARGET_RSS_MIB:.0f} MiB: {'PASS' if rss_ok[name] else 'MISS'}"
        )
    for runs in sink_runs.values():
        for s in runs:
            if s.extra.get("stderr_tail"):
                print(f"{s.name} run {s.run} stderr (tail):\n{s.extra['stderr_tail']}")

    def targets(name: str) -> dict[str, Any]:
        return {
            "ratio_min": RATIO_TARGETS[name],
            "ratio_pass": ratio_ok[name],
            "rss_max_mib": TARGET_RSS_MIB,
            "rss_pass": rss_ok[name],
        }

    def ratio_summary(name: str) -> dict[str, Any]:
        return {
            "ratio": ratios[name],
            "ratio_definition": f"median {name} changes/s / median pg_recvlogical changes/s",
            "run_ratio_min": min(run_ratios[name]),
            "run_ratio_max": max(run_ratios[name]),
        }

    # With --sink file the JSON keeps its original shape (ratio and targets at
    # the top of `summary` and `targets`); other sinks add a section each.
    main_name = "pg2sink" if "pg2sink" in sink_runs else next(iter(sink_runs))
    return {
        "command": [sys.executable, *sys.argv],
        "machine": info,
        "workload": asdict(workload),
        "repeat": repeat,
        "runs": [
            {
                "run": r.run,
                "ratio": run_ratios[main_name][i],
                "pg_recvlogical": _as_dict(r),
                **{name: _as_dict(runs[i]) for name, runs in sink_runs.items()},
                **{f"{name} ratio": run_ratios[name][i] for name in sink_runs if name != main_name},
            }
            for i, r in enumerate(recvs)
        ],
        "summary": {
            **summaries,
            **ratio_summary(main_name),
            **{f"{name} ratio": ratio_summary(name) for name in sink_runs if name != main_name},
        },
        "targets": {
            **targets(main_name),
            **{name: targets(name) for name in sink_runs if name != main_name},
        },
        "profiled_run": 1 if profiled else None,
    }


def print_profile(path: Path, top: int = 15) -> None:
    buf = io.StringIO()
    pstats.Stats(str(path), stream=buf).sort_stats("tottime").print_stats(top)
    text = re.sub(r"\n{3,}", "\n\n", buf.getvalue())
    print(f"\ncProfile of pg2sink run 1, top {top} by tottime ({path}):\n{text.strip()}")


# --- main --------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="pg2sink with each chosen sink vs pg_recvlogical on the same changes "
        "(see bench/README.md)."
    )
    p.add_argument(
        "--sink",
        default="file",
        metavar="SINK[,SINK...]",
        help="pg2sink's sinks, comma-separated, one run of each per round: file (default), "
        "kafka, null, nats, kinesis, duckdb; `both` is file,kafka. The servers a sink needs "
        "(Kafka and a schema registry, nats-server, kinesalite) start in the temporary "
        "directory",
    )
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every workload size (0.1 for a quick run; default 1)",
    )
    p.add_argument(
        "--insert-rows", type=int, help=f"bulk INSERT rows (default {FULL_INSERT_ROWS:,})"
    )
    p.add_argument(
        "--update-rows", type=int, help=f"bulk UPDATE rows (default {FULL_UPDATE_ROWS:,})"
    )
    p.add_argument(
        "--small-txns", type=int, help=f"single-row transactions (default {FULL_SMALL_TXNS:,})"
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        metavar="N",
        help="runs of each consumer, alternating, each on its own slot; the ratio "
        f"compares medians (default {DEFAULT_REPEAT})",
    )
    p.add_argument(
        "--nats-reference",
        nargs="?",
        const="raw",
        choices=("raw", "nats.go"),
        help="also run bench/natsref each round, a Go publisher doing the least of the NATS "
        "sink's work (built with `go build`; needs Go): what a compiled client reaches here. "
        "raw (the default): NATS frames written as pg2sink writes them; nats.go: the NATS "
        "project's client's PublishMsgAsync",
    )
    p.add_argument(
        "--json", type=Path, metavar="PATH", help="also write every run's figures as JSON"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds allowed per consumer run (default 1800)",
    )
    p.add_argument(
        "--cprofile",
        type=Path,
        metavar="PATH",
        help="profile only the first pg2sink run under cProfile: write its stats to PATH "
        "and print the top 15 functions by tottime (that run is slowed down and still "
        "counts in the medians)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory with every run's output (the server is removed)",
    )
    return p.parse_args(argv)


def sizes_from(args: argparse.Namespace) -> Sizes:
    scale = float(args.scale)
    if scale <= 0:
        raise BenchError("--scale must be positive")
    if args.repeat < 1:
        raise BenchError("--repeat must be at least 1")

    def scaled(explicit: int | None, full: int) -> int:
        return explicit if explicit is not None else max(1, round(full * scale))

    return Sizes(
        insert_rows=scaled(args.insert_rows, FULL_INSERT_ROWS),
        update_rows=scaled(args.update_rows, FULL_UPDATE_ROWS),
        small_txns=scaled(args.small_txns, FULL_SMALL_TXNS),
    )


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    sizes = sizes_from(args)
    sizes.check()
    sinks = parse_sinks(args.sink)
    if args.nats_reference:
        sinks.append(NATS_REFERENCE)
    services = load_services()
    recvlogical = pg_binary(services, "pg_recvlogical")
    prefixes = [RECVLOGICAL_SLOT, *(sink_slot_prefix(sink) for sink in sinks)]

    with contextlib.ExitStack() as stack:
        server = start_postgres(services, tmp, stack)
        targets = start_targets(services, tmp, stack, sinks, args.nats_reference or "raw")
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            info = machine_info(conn, recvlogical)
            setup_schema(conn, args.repeat, prefixes)
            print(
                f"workload: {sizes.insert_rows:,}-row INSERT, {sizes.update_rows:,}-row UPDATE, "
                f"{sizes.small_txns:,} single-row transactions ...",
                flush=True,
            )
            workload = run_workload(conn, sizes)
            recvs: list[Consumer] = []
            sink_runs: dict[str, list[Consumer]] = {}
            for run in range(1, args.repeat + 1):
                recv, done = run_round(
                    args, run, recvlogical, dsn, workload, tmp, conn, sinks, targets
                )
                recvs.append(recv)
                for s in done:
                    sink_runs.setdefault(s.name, []).append(s)
        figures = report(workload, recvs, sink_runs, info, profiled=args.cprofile is not None)
        if args.cprofile is not None:
            print_profile(args.cprofile)
        return figures


def run_round(
    args: argparse.Namespace,
    run: int,
    recvlogical: str,
    dsn: str,
    workload: Workload,
    tmp: Path,
    conn: Conn,
    sinks: Sequence[str],
    targets: Targets,
) -> tuple[Consumer, list[Consumer]]:
    """Round `run`: pg_recvlogical, then pg2sink with each sink in turn, each slot dropped
    right after its run."""
    step = f"run {run}/{args.repeat}"
    done: list[Consumer] = []
    try:
        print(f"{step}: pg_recvlogical to {workload.end_lsn} ...", flush=True)
        recv = run_recvlogical(recvlogical, dsn, run, workload, tmp, args.timeout, conn)
        drop_slot(conn, recv.slot)
        # cProfile: the first pg2sink run of the first sink only
        profile = args.cprofile if run == 1 else None
        for sink in sinks:
            what = consumer_name(sink) if sink == NATS_REFERENCE else f"pg2sink --sink {sink}"
            print(f"{step}: {what} to {workload.end_lsn} ...", flush=True)
            result = run_pg2sink(
                dsn, run, workload, tmp, args.timeout, conn, profile, sink=sink, targets=targets
            )
            profile = None
            drop_slot(conn, result.slot)
            done.append(result)
    except BenchError as e:
        raise BenchError(f"{step}: {e}") from e
    print(
        f"{step}: pg_recvlogical {recv.seconds:.2f}s, "
        + ", ".join(f"{s.name} {s.seconds:.2f}s" for s in done),
        flush=True,
    )
    return recv, done


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench-stream", parse_args(argv), bench, "pg2sink-bench-")


if __name__ == "__main__":
    sys.exit(main())
