"""`make bench-stream`: pg2sink's file sink against pg_recvlogical on the same changes.

Method
------
1. Start a throwaway PostgreSQL (scripts/services.py: wal_level=logical,
   fsync off, synchronous_commit off) in a temporary directory, create one
   table (autovacuum off, so no VACUUM of it competes with the runs)

       bench (id int8 primary key, name text, amount numeric(12,2),
              at timestamptz, flag bool, doc jsonb)

   a publication `bench_pub` for it, and 2 x N pgoutput slots
   (`bench_recvlogical_1..N`, `bench_pg2sink_1..N`, N = `--repeat`, default
   3) *before* any change is made, so every run decodes exactly the same WAL.
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
   1, pg2sink on slot 1, pg_recvlogical on slot 2, ... Alternating spreads
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

6. `--sink kafka` (or `both`) also starts a Kafka broker and Apicurio Registry
   (scripts/services.py) in the temporary directory and runs pg2sink with
   `--sink kafka` (Avro, acks=all, idempotent) on slots
   `bench_pg2sink_kafka_1..N`, a fresh `--topic-prefix` per run. It is timed
   the same way (pg2sink confirms only what the broker acknowledged); then the
   topic must hold exactly the expected number of messages (high minus low
   watermark over its partitions). Target: ratio >= 0.6.

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
to show where time goes. The benchmark reports the targets (pg2sink at
least 0.8x pg_recvlogical's changes/s, peak RSS below 300 MiB); it does not
assert them: the exit code is 0 unless something broke.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import pstats
import re
import resource
import shlex
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from common import (
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
    load_services,
    machine_info,
    pg2sink_argv,
    pg_binary,
    run_benchmark,
    sink_args,
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

PUBLICATION = "bench_pub"
RECVLOGICAL_SLOT = "bench_recvlogical"  # runs use bench_recvlogical_1..N
PG2SINK_SLOT = "bench_pg2sink"  # runs use bench_pg2sink_1..N
PG2SINK_KAFKA_SLOT = "bench_pg2sink_kafka"  # --sink kafka|both: bench_pg2sink_kafka_1..N
DEFAULT_REPEAT = 3

FULL_INSERT_ROWS = 500_000
FULL_UPDATE_ROWS = 250_000
FULL_SMALL_TXNS = 50_000
#: Small transactions sent per round trip (one simple-query string).
SMALL_TXNS_PER_ROUND_TRIP = 100

TARGET_RATIO = 0.8
TARGET_RATIO_KAFKA = 0.6


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


def run_pg2sink(
    dsn: str,
    run: int,
    workload: Workload,
    tmp: Path,
    timeout: float,
    watch: Conn,
    profile: Path | None,
    kafka: KafkaTarget | None = None,
) -> Consumer:
    """One pg2sink run: --sink file, or --sink kafka when `kafka` is given."""
    label = "pg2sink_kafka" if kafka is not None else "pg2sink"
    slot = slot_name(PG2SINK_KAFKA_SLOT if kafka is not None else PG2SINK_SLOT, run)
    out = tmp / f"pg2sink_{run}.jsonl"
    # A fresh prefix per run: every run's topic starts empty.
    prefix = f"bench{run}_{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}.public.{TABLE}"
    python = [sys.executable]
    if profile is not None:
        python += ["-m", "cProfile", "-o", str(profile)]
    argv = pg2sink_argv(dsn, slot, PUBLICATION, sink_args(kafka, out, prefix), "warning", python)
    stderr = tmp / f"{label}_{run}.stderr"
    rusage_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # the broker shares the machine's cores with pg2sink and PostgreSQL: its CPU too
    broker_pid = kafka.broker_pid if kafka is not None else None
    broker_before = cpu_seconds(broker_pid) if broker_pid is not None else None
    child = Child.spawn(argv, tmp / f"{label}_{run}.stdout", stderr)
    startup: float | None = None
    broker_after: float | None = None
    walsender_cpu: float | None = None
    peak_kib: int | None = None
    try:
        while True:
            if child.poll() is not None:
                raise BenchError(
                    f"pg2sink exited with {child.returncode} before confirming "
                    f"{workload.end_lsn}:\n{tail(stderr)}\ncommand: {shlex.join(argv)}"
                )
            elapsed = time.monotonic() - child.started
            if elapsed > timeout:
                raise BenchError(
                    f"pg2sink did not confirm {workload.end_lsn} in {timeout}s:\n{tail(stderr)}"
                )
            state = slot_state(watch, slot, workload.end_lsn)
            if state.active_pid is not None:
                startup = startup or elapsed
                walsender_cpu = cpu_seconds(state.active_pid) or walsender_cpu
            if state.reached_end:
                seconds = time.monotonic() - child.started
                peak_kib = vm_hwm_kib(child.pid)
                broker_after = cpu_seconds(broker_pid) if broker_pid is not None else None
                break
            time.sleep(POLL_SECONDS)
    finally:
        child.stop()
    if child.returncode not in (0, -signal.SIGTERM):
        raise BenchError(f"pg2sink exited with {child.returncode} after SIGTERM:\n{tail(stderr)}")
    if peak_kib is None:
        peak_kib = child.max_rss_kib
    if peak_kib is None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        peak_kib = after if after > rusage_before else None

    if kafka is None:
        modifications, lines = count_modifications(out)
        output_bytes = out.stat().st_size
        if modifications != workload.changes:
            raise BenchError(
                f"pg2sink run {run} wrote {modifications} Modification lines to {out}, "
                f"expected {workload.changes} ({lines} lines in all)"
            )
    else:
        # Only Modification records go to a table's topic (no --schema-topic).
        modifications = lines = topic_message_count(kafka.bootstrap_servers, topic)
        output_bytes = topic_bytes(kafka.data, topic)
        if modifications != workload.changes:
            raise BenchError(
                f"pg2sink --sink kafka run {run} left {modifications} messages on topic "
                f"{topic}, expected {workload.changes}"
            )
    return Consumer(
        name="pg2sink kafka" if kafka is not None else "pg2sink",
        run=run,
        slot=slot,
        command=argv,
        changes=modifications,
        seconds=seconds,
        startup_seconds=startup,
        client_cpu_seconds=child.cpu_seconds,
        walsender_cpu_seconds=walsender_cpu,
        peak_rss_mib=peak_kib / 1024 if peak_kib else None,
        output_bytes=output_bytes,
        extra={
            "lines": lines,
            "stderr_tail": tail(stderr, 10) if stderr.stat().st_size else "",
            "broker_cpu_seconds": (
                broker_after - broker_before
                if broker_before is not None and broker_after is not None
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


#: The ratio target of each pg2sink consumer (by Consumer.name).
RATIO_TARGETS = {"pg2sink": TARGET_RATIO, "pg2sink kafka": TARGET_RATIO_KAFKA}


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
    ratio_ok = {name: ratios[name] >= RATIO_TARGETS[name] for name in sink_runs}
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
    if "pg2sink kafka" in sink_runs:
        print("(pg2sink kafka output: the topic's log segments on the broker's disk)")
        broker = _median([s.extra.get("broker_cpu_seconds") for s in sink_runs["pg2sink kafka"]])
        print(f"(Kafka broker CPU s during a pg2sink kafka run, median: {_fmt(broker, '.2f')})")
    print()
    for name in sink_runs:
        print(
            f"{name} / pg_recvlogical, median changes/s: {ratios[name]:.2f}   "
            f"target >= {RATIO_TARGETS[name]}: {'PASS' if ratio_ok[name] else 'MISS'}   "
            f"(per-run ratio min {min(run_ratios[name]):.2f}, "
            f"max {max(run_ratios[name]):.2f})"
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
        description="pg2sink's file sink vs pg_recvlogical on the same changes "
        "(see bench/README.md)."
    )
    p.add_argument(
        "--sink",
        choices=("file", "kafka", "both"),
        default="file",
        help="pg2sink's sink: file (default), kafka (starts a Kafka broker and a schema "
        "registry in the temporary directory) or both (one run of each per round)",
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
    services = load_services()
    recvlogical = pg_binary(services, "pg_recvlogical")
    use_file = args.sink in ("file", "both")
    use_kafka = args.sink in ("kafka", "both")
    prefixes = [RECVLOGICAL_SLOT]
    prefixes += [PG2SINK_SLOT] if use_file else []
    prefixes += [PG2SINK_KAFKA_SLOT] if use_kafka else []

    with contextlib.ExitStack() as stack:
        server = start_postgres(services, tmp, stack)
        kafka = start_kafka(services, tmp, stack) if use_kafka else None
        if kafka is not None:
            print("warming up the broker (400,000 messages to a scratch topic) ...", flush=True)
            print(f"broker warmed up in {warm_up_broker(kafka):.1f} s", flush=True)
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
                step = f"run {run}/{args.repeat}"
                done: list[Consumer] = []
                try:
                    print(f"{step}: pg_recvlogical to {workload.end_lsn} ...", flush=True)
                    recv = run_recvlogical(recvlogical, dsn, run, workload, tmp, args.timeout, conn)
                    drop_slot(conn, recv.slot)
                    # cProfile: the first pg2sink run of the first sink only
                    profile = args.cprofile if run == 1 else None
                    for target in ([None] if use_file else []) + ([kafka] if use_kafka else []):
                        name = "pg2sink" if target is None else "pg2sink --sink kafka"
                        print(f"{step}: {name} to {workload.end_lsn} ...", flush=True)
                        sink = run_pg2sink(
                            dsn, run, workload, tmp, args.timeout, conn, profile, target
                        )
                        profile = None
                        drop_slot(conn, sink.slot)
                        done.append(sink)
                except BenchError as e:
                    raise BenchError(f"{step}: {e}") from e
                print(
                    f"{step}: pg_recvlogical {recv.seconds:.2f}s, "
                    + ", ".join(f"{s.name} {s.seconds:.2f}s" for s in done),
                    flush=True,
                )
                recvs.append(recv)
                for s in done:
                    sink_runs.setdefault(s.name, []).append(s)
        figures = report(workload, recvs, sink_runs, info, profiled=args.cprofile is not None)
        if args.cprofile is not None:
            print_profile(args.cprofile)
        return figures


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench-stream", parse_args(argv), bench, "pg2sink-bench-")


if __name__ == "__main__":
    sys.exit(main())
