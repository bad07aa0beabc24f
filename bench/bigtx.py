"""`make bench-bigtx`: one 5,000,000-row transaction, without and with --streaming.

Method
------
1. Start a throwaway PostgreSQL (scripts/services.py, via bench/common.py;
   logical_decoding_work_mem stays at the default 64MB) in a temporary directory, create
   the table of bench/stream.py (same column mix: int8 key, text, numeric(12,2),
   timestamptz, bool, jsonb; autovacuum off) and the publication `bigtx_pub`, and install
   pg_walinspect (to find the commit record's end LSN).
2. For each mode, plain then `--streaming` (`--modes` picks):
   a. create the slot `bigtx_<mode>`, start pg2sink as a user would
      (`python -m pg2sink --sink file ...`, plus `--streaming` and a `--spill-dir` in the
      temporary directory) and wait until it logs that it streams;
   b. run ONE transaction: `BEGIN; INSERT INTO bench SELECT <row of i> FROM
      generate_series(1, N) i; COMMIT` (N = `--rows`, default 5,000,000) in a session with
      `synchronous_commit = on`, so COMMIT returns once the commit is flushed (walsenders
      send only flushed WAL);
   c. when COMMIT returns, note the time; the commit record's end LSN comes from
      pg_walinspect (the COMMIT record of the transaction's xid): it is the LSN pg2sink
      confirms once the sink has acknowledged the transaction's last change;
   d. poll the slot's confirmed_flush_lsn every 10 ms until it reaches that end LSN:
      the **commit-to-last-ack delay** is that moment minus the moment COMMIT returned;
   e. read pg2sink's peak RSS (VmHWM in /proc) and stop it with SIGTERM; the file must
      hold exactly N Modification lines, the spill directory no spill file;
   f. drop the slot and TRUNCATE the table (the next mode's slot starts after it).
   Without --streaming the server keeps the transaction (spilled to its own disk past
   64MB) until COMMIT and only then decodes and sends all of it; with --streaming it
   sends the changes while the INSERT runs and pg2sink spills them to its disk, so after
   COMMIT only pg2sink's replay of its spill file remains.

Printed per mode: INSERT seconds, commit-to-last-ack delay, pg2sink's peak RSS (target
< 300 MB) and CPU seconds, bytes spilled by the server (pg_stat_replication_slots) and
streamed; then the command, machine and load averages. `--sink kafka` runs the same
with the Kafka sink (a broker and Apicurio Registry started in the temporary directory,
Avro; the topic must then hold N messages). The machine is shared: other
load changes the figures, so they are printed with the load average around the run.
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from common import (
    ROW_EXPRESSIONS,
    TABLE,
    TARGET_RSS_MIB,
    BenchError,
    Child,
    Conn,
    KafkaTarget,
    count_modifications,
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
    start_kafka,
    start_postgres,
    tail,
    topic_message_count,
    vm_hwm_kib,
    wait_confirmed,
)
from psycopg import sql

PUBLICATION = "bigtx_pub"
DEFAULT_ROWS = 5_000_000
MODES = ("plain", "streaming")
POLL_SECONDS = 0.01


@dataclass
class ModeResult:
    mode: str
    rows: int
    insert_seconds: float
    commit_to_ack_seconds: float
    peak_rss_mib: float | None
    cpu_seconds: float | None
    end_lsn: str
    server_spill_bytes: int
    server_stream_bytes: int
    output_bytes: int


def setup(conn: Conn) -> None:
    create_bench_table(conn)
    create_publication(conn, PUBLICATION, TABLE)
    conn.execute("CREATE EXTENSION pg_walinspect")


def commit_end_lsn(conn: Conn, start_lsn: str, xid: int) -> str:
    """End LSN of the COMMIT record of `xid`, looked for from `start_lsn` on."""
    row = conn.execute(
        "SELECT end_lsn::text FROM pg_get_wal_records_info(%s::pg_lsn, pg_current_wal_flush_lsn())"
        " WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%%'"
        " AND xid = %s::xid",
        (start_lsn, str(xid)),
    ).fetchone()
    if row is None:
        raise BenchError(f"no COMMIT record of xid {xid} after {start_lsn}")
    return str(row[0])


def slot_stats(conn: Conn, slot: str) -> tuple[int, int]:
    """(spill_bytes, stream_bytes) of the slot (pg_stat_replication_slots)."""
    row = conn.execute(
        "SELECT spill_bytes, stream_bytes FROM pg_stat_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def wait_streaming(child: Child, stderr: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while b"pg2sink is streaming" not in stderr.read_bytes():
        if child.poll() is not None:
            raise BenchError(f"pg2sink exited with {child.returncode}:\n{tail(stderr)}")
        if time.monotonic() > deadline:
            raise BenchError(f"pg2sink did not start streaming in {timeout}s:\n{tail(stderr)}")
        time.sleep(0.05)


def run_mode(
    dsn: str,
    conn: Conn,
    mode: str,
    rows: int,
    tmp: Path,
    timeout: float,
    kafka: KafkaTarget | None = None,
) -> tuple[ModeResult, list[str]]:
    slot = f"bigtx_{mode}"
    out = tmp / f"{mode}.jsonl"
    prefix = f"bigtx_{mode}_{uuid.uuid4().hex[:8]}"
    spill = tmp / f"{mode}.spill"
    stderr = tmp / f"{mode}.stderr"
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    # info: wait_streaming waits for the line that says it streams
    argv = pg2sink_argv(dsn, slot, PUBLICATION, sink_args(kafka, out, prefix), "info")
    if mode == "streaming":
        argv += ["--streaming", "--spill-dir", str(spill)]
    child = Child.spawn(argv, tmp / f"{mode}.stdout", stderr)
    try:
        wait_streaming(child, stderr)
        print(f"[{mode}] INSERT of {rows:,} rows in one transaction ...", flush=True)
        with psycopg.connect(dsn) as writer:
            writer.execute("SET synchronous_commit = on")
            start_lsn = current_lsn(writer)
            xid_row = writer.execute("SELECT txid_current()").fetchone()
            assert xid_row is not None
            began = time.monotonic()
            writer.execute(
                # a literal, not a parameter: ROW_EXPRESSIONS holds % operators
                sql.SQL("INSERT INTO {} SELECT {} FROM generate_series(1, {}::int8) i").format(
                    sql.Identifier(TABLE), ROW_EXPRESSIONS, sql.Literal(rows)
                )
            )
            writer.commit()
            committed = time.monotonic()
        end_lsn = commit_end_lsn(conn, start_lsn, int(xid_row[0]) & 0xFFFFFFFF)
        print(
            f"[{mode}] committed after {committed - began:.1f} s (end LSN {end_lsn}); "
            "waiting for pg2sink to confirm it ...",
            flush=True,
        )
        timeout_left = committed + timeout - time.monotonic()
        acked = wait_confirmed(conn, slot, end_lsn, child, stderr, timeout_left, POLL_SECONDS)
        peak = vm_hwm_kib(child.pid)
        child.stop()
        if child.returncode not in (0, -signal.SIGTERM):
            raise BenchError(f"pg2sink exited with {child.returncode}:\n{tail(stderr)}")
    finally:
        child.stop()
    if kafka is None:
        modifications, _ = count_modifications(out)
        where = str(out)
    else:
        where = f"{prefix}.public.{TABLE}"
        modifications = topic_message_count(kafka.bootstrap_servers, where)
    if modifications != rows:
        raise BenchError(f"[{mode}] {where} holds {modifications:,} modifications, not {rows:,}")
    left = sorted(spill.glob("*.spill")) if spill.exists() else []
    if left:
        raise BenchError(f"[{mode}] spill files left behind: {left}")
    spill_bytes, stream_bytes = slot_stats(conn, slot)
    drop_slot(conn, slot)
    conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
    result = ModeResult(
        mode=mode,
        rows=rows,
        insert_seconds=committed - began,
        commit_to_ack_seconds=acked - committed,
        peak_rss_mib=peak / 1024 if peak is not None else None,
        cpu_seconds=child.cpu_seconds,
        end_lsn=end_lsn,
        server_spill_bytes=spill_bytes,
        server_stream_bytes=stream_bytes,
        output_bytes=out.stat().st_size if kafka is None else 0,
    )
    out.unlink(missing_ok=True)  # gigabytes: do not keep two of them around
    print(
        f"[{mode}] commit-to-last-ack {result.commit_to_ack_seconds:.1f} s, "
        f"peak RSS {_mib(result.peak_rss_mib)}",
        flush=True,
    )
    return result, argv


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} MiB"


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    if args.rows < 1:
        raise BenchError("--rows must be at least 1")
    services = load_services()
    recvlogical = pg_binary(services, "pg_recvlogical")
    load_before = os.getloadavg()
    results: list[ModeResult] = []
    commands: dict[str, list[str]] = {}
    with contextlib.ExitStack() as stack:
        server = start_postgres(services, tmp, stack)
        dsn = server.dsn()
        kafka = start_kafka(services, tmp, stack) if args.sink == "kafka" else None
        with psycopg.connect(dsn, autocommit=True) as conn:
            info = machine_info(conn, recvlogical)
            setup(conn)
            for mode in args.modes:
                result, argv = run_mode(dsn, conn, mode, args.rows, tmp, args.timeout, kafka)
                results.append(result)
                commands[mode] = argv
    load_after = os.getloadavg()

    command = [sys.executable, *sys.argv]
    print()
    print(f"command:   {shlex.join(command)}")
    for mode, argv in commands.items():
        print(f"pg2sink ({mode}): {shlex.join(argv)}")
    print(
        f"machine:   {info['nproc']} CPUs (shared with other work), {info['cpu']}, "
        f"kernel {info['kernel']}, Python {info['python']}, PostgreSQL {info['postgresql']}, "
        f"{info['pg2sink']}"
    )
    print(f"server:    {info['server_settings']}")
    print(
        "load avg:  before {:.2f} {:.2f} {:.2f}, after {:.2f} {:.2f} {:.2f} (1/5/15 min)".format(
            *load_before, *load_after
        )
    )
    print(
        f"{'mode':<10} {'rows':>10} {'INSERT s':>9} {'commit→ack s':>13} {'peak RSS':>11} "
        f"{'CPU s':>7} {'server spill':>13} {'streamed':>10}"
    )
    for r in results:
        print(
            f"{r.mode:<10} {r.rows:>10,} {r.insert_seconds:>9.1f} "
            f"{r.commit_to_ack_seconds:>13.1f} {_mib(r.peak_rss_mib):>11} "
            f"{r.cpu_seconds if r.cpu_seconds is not None else 0:>7.1f} "
            f"{r.server_spill_bytes / 2**20:>10.0f} MiB {r.server_stream_bytes / 2**20:>6.0f} MiB"
        )
    worst = max((r.peak_rss_mib or 0.0) for r in results)
    print(
        f"peak RSS < {TARGET_RSS_MIB:.0f} MB: {'PASS' if worst < TARGET_RSS_MIB else 'MISS'} "
        f"(highest {worst:.1f} MiB)"
    )
    return {
        "command": command,
        "pg2sink_commands": commands,
        "machine": info,
        "loadavg_before": list(load_before),
        "loadavg_after": list(load_after),
        "results": [asdict(r) for r in results],
        "target_rss_mib": TARGET_RSS_MIB,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="one large INSERT transaction through pg2sink's file sink, without "
        "and with --streaming: peak RSS and the delay from COMMIT to the last change "
        "acknowledged (see bench/README.md)."
    )
    p.add_argument(
        "--rows", type=int, default=DEFAULT_ROWS, help=f"rows (default {DEFAULT_ROWS:,})"
    )
    p.add_argument(
        "--sink",
        choices=("file", "kafka"),
        default="file",
        help="pg2sink's sink: file (default) or kafka (starts a Kafka broker and a schema "
        "registry in the temporary directory; Avro, the topic must then hold --rows messages)",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="which runs, in this order (default: plain streaming)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds allowed from COMMIT to confirmation (default 1800)",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON")
    p.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (pg2sink's stderr)"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench-bigtx", parse_args(argv), bench, "pg2sink-bigtx-")


if __name__ == "__main__":
    sys.exit(main())
