"""`make bench-pipelines`: N pipelines in one pg2sink process against N pg2sink processes,
same workload: CPU per change and peak memory of each.

Method
------
1. Start a throwaway PostgreSQL (scripts/services.py) in a temporary directory and create
   `--pipelines` N databases (default 10), each with the bench table (common.py) and a
   publication of it.
2. Each run streams every database to a file of its own with `--sink file --no-imports`,
   either as one process (`--config` with a `[pipeline.NAME]` table per database) or as
   N processes (the same settings as flags), each pipeline on a new slot. The runs
   alternate, one process first, `--rounds` times.
3. Once every slot is active, the CPU time of the pg2sink process(es) so far is noted
   (start-up: interpreter, imports, connections, slot creation), then the workload runs:
   `--rows` rows per database, `--batch` per transaction, the databases in turn batch by
   batch (so every pipeline has work all along). A run ends when each slot's
   confirmed_flush_lsn reaches its database's last insert: pg2sink confirms only what
   its sink holds. CPU per change = CPU seconds spent between those two points (utime +
   stime of /proc/<pid>/stat, every thread, summed over the processes) / changes.
   Peak RSS = VmHWM of each process just before SIGTERM, summed over the processes.
   Each file must then hold every row of its database.

The target (issue #29): one process costs no more CPU per change and uses less memory
than N processes. The bench reports the figures; it does not assert them: the exit code is
0 unless something broke.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from common import (
    ROW_EXPRESSIONS,
    TABLE,
    BenchError,
    Child,
    Conn,
    count_modifications,
    cpu_seconds,
    create_bench_table,
    create_publication,
    current_lsn,
    drop_slot,
    load_services,
    pg2sink_argv,
    run_benchmark,
    start_postgres,
    tail,
    vm_hwm_kib,
    wait_confirmed,
)
from psycopg import sql

PUBLICATION = "bench"
MODES = ("one process", "processes")


@dataclass
class Run:
    mode: str
    round: int
    changes: int
    startup_cpu_seconds: float
    streaming_cpu_seconds: float
    seconds: float
    peak_rss_mib: float

    @property
    def cpu_us_per_change(self) -> float:
        return self.streaming_cpu_seconds / self.changes * 1e6


def config_file(
    path: Path, dsns: Sequence[str], slots: Sequence[str], outs: Sequence[Path]
) -> None:
    """The one process's configuration: the settings of every pipeline at the top, a
    [pipeline.pN] table per database."""
    lines = [
        'sink = "file"',
        "no_imports = true",
        'log_level = "warning"',
        'metrics_address = "127.0.0.1:0"',
        f'publication = "{PUBLICATION}"',
    ]
    for i, (dsn, slot, out) in enumerate(zip(dsns, slots, outs, strict=True)):
        lines += ["", f"[pipeline.p{i}]", f'source = "{dsn}"', f'slot = "{slot}"']
        lines.append(f'file_path = "{out}"')
    path.write_text("\n".join(lines) + "\n")


def wait_active(
    admin: Conn, slots: Sequence[str], children: Sequence[Child], timeout: float
) -> None:
    """Until every slot exists and a walsender streams from it."""
    deadline = time.monotonic() + timeout
    while True:
        active = admin.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name = ANY(%s)",
            (list(slots),),
        ).fetchone()
        if active is not None and active[0] == len(slots):
            return
        for child in children:
            if child.poll() is not None:
                raise BenchError(f"pg2sink exited with {child.returncode} before streaming")
        if time.monotonic() > deadline:
            raise BenchError(f"the slots were not all active within {timeout}s")
        time.sleep(0.1)


def total_cpu(children: Sequence[Child]) -> float:
    total = 0.0
    for child in children:
        seconds = cpu_seconds(child.pid)
        if seconds is None:
            raise BenchError(f"pg2sink {child.pid} is gone")
        total += seconds
    return total


def workload(conns: Sequence[Conn], first: int, rows: int, batch: int) -> list[str]:
    """`rows` rows into each database from id `first`, `batch` per transaction, the
    databases in turn; each database's LSN after its last transaction."""
    for start in range(first, first + rows, batch):
        end = min(start + batch, first + rows) - 1
        insert = sql.SQL("INSERT INTO {} SELECT {} FROM generate_series({}, {}) AS g(i)").format(
            sql.Identifier(TABLE), ROW_EXPRESSIONS, sql.Literal(start), sql.Literal(end)
        )
        for conn in conns:
            conn.execute(insert)
    return [current_lsn(conn) for conn in conns]


def one_run(
    mode: str,
    round_: int,
    args: argparse.Namespace,
    dsns: Sequence[str],
    conns: Sequence[Conn],
    admin: Conn,
    tmp: Path,
) -> Run:
    tag = uuid.uuid4().hex[:6]
    work = tmp / f"{mode.replace(' ', '-')}-{round_}"
    work.mkdir()
    slots = [f"bench_{tag}_{i}" for i in range(len(dsns))]
    outs = [work / f"p{i}.jsonl" for i in range(len(dsns))]
    children: list[Child] = []
    errs: list[Path] = []
    started = time.monotonic()
    try:
        if mode == "one process":
            config = work / "pipelines.toml"
            config_file(config, dsns, slots, outs)
            argv = [sys.executable, "-m", "pg2sink", "--config", str(config)]
            errs.append(work / "err.log")
            children.append(Child.spawn(argv, work / "out.log", errs[-1]))
        else:
            for i, (dsn, slot, out) in enumerate(zip(dsns, slots, outs, strict=True)):
                sink = ["--sink", "file", "--file-path", str(out)]
                argv = pg2sink_argv(dsn, slot, PUBLICATION, sink)
                errs.append(work / f"err.{i}.log")
                children.append(Child.spawn(argv, work / f"out.{i}.log", errs[-1]))
        wait_active(admin, slots, children, args.timeout)
        startup = total_cpu(children)
        began = time.monotonic()
        first = 1 + round_ * len(MODES) * args.rows + MODES.index(mode) * args.rows
        ends = workload(conns, first, args.rows, args.batch)
        for i, (conn, slot, end) in enumerate(zip(conns, slots, ends, strict=True)):
            which = 0 if mode == "one process" else i
            wait_confirmed(conn, slot, end, children[which], errs[which], args.timeout)
        seconds = time.monotonic() - began
        streaming = total_cpu(children) - startup
        peak = sum(vm_hwm_kib(c.pid) or 0 for c in children) / 1024
    finally:
        for child in children:
            child.stop()
        for slot in slots:
            with contextlib.suppress(BenchError):
                drop_slot(admin, slot)
    for child, err in zip(children, errs, strict=True):
        if child.returncode != 0:
            raise BenchError(f"pg2sink exited with {child.returncode}:\n{tail(err)}")
    for out in outs:
        modifications, _ = count_modifications(out)
        if modifications != args.rows:
            raise BenchError(f"{out} holds {modifications} changes, not {args.rows}")
    print(
        f"  {mode:<12} round {round_ + 1}: {streaming / (args.rows * len(dsns)) * 1e6:6.1f} µs "
        f"CPU per change, start-up {startup:5.2f} s CPU, peak RSS {peak:6.1f} MiB, "
        f"{seconds:5.1f} s ({time.monotonic() - started:5.1f} s with start and stop)",
        flush=True,
    )
    return Run(mode, round_, args.rows * len(dsns), startup, streaming, seconds, peak)


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    services = load_services()
    with contextlib.ExitStack() as stack:
        server = start_postgres(services, tmp, stack)
        admin = psycopg.connect(server.dsn(), autocommit=True)
        stack.callback(admin.close)
        names = [f"bench_{i}" for i in range(args.pipelines)]
        conns: list[Conn] = []
        for name in names:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            conn = psycopg.connect(server.dsn(name), autocommit=True)
            stack.callback(conn.close)
            create_bench_table(conn)
            create_publication(conn, PUBLICATION, TABLE)
            conns.append(conn)
        dsns = [server.dsn(name) for name in names]
        print(
            f"{args.pipelines} pipelines, {args.rows:,} rows each in transactions of "
            f"{args.batch:,}, {args.rounds} round(s), file sinks",
            flush=True,
        )
        runs = [
            one_run(mode, r, args, dsns, conns, admin, tmp)
            for r in range(args.rounds)
            for mode in MODES
        ]
    summary = {}
    for mode in MODES:
        mine = [r for r in runs if r.mode == mode]
        summary[mode] = {
            "cpu_us_per_change": min(r.cpu_us_per_change for r in mine),
            "startup_cpu_seconds": min(r.startup_cpu_seconds for r in mine),
            "peak_rss_mib": min(r.peak_rss_mib for r in mine),
        }
    one, many = summary["one process"], summary["processes"]
    print(
        f"best of {args.rounds}: one process {one['cpu_us_per_change']:.1f} µs CPU per change, "
        f"{one['peak_rss_mib']:.0f} MiB; {args.pipelines} processes "
        f"{many['cpu_us_per_change']:.1f} µs, {many['peak_rss_mib']:.0f} MiB "
        f"(one process: CPU x{one['cpu_us_per_change'] / many['cpu_us_per_change']:.2f}, "
        f"memory x{one['peak_rss_mib'] / many['peak_rss_mib']:.2f})"
    )
    return {
        "pipelines": args.pipelines,
        "rows": args.rows,
        "batch": args.batch,
        "runs": [{**vars(r), "cpu_us_per_change": r.cpu_us_per_change} for r in runs],
        "summary": summary,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="N pipelines in one pg2sink process against N processes: CPU per change "
        "and peak RSS (see bench/README.md)."
    )
    p.add_argument("--pipelines", type=int, default=10, help="databases and pipelines (default 10)")
    p.add_argument("--rows", type=int, default=50_000, help="rows per database (default 50,000)")
    p.add_argument("--batch", type=int, default=1_000, help="rows per transaction (default 1,000)")
    p.add_argument(
        "--rounds", type=int, default=2, help="runs of each mode, alternating (default 2)"
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds allowed per wait (default 600)"
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run_benchmark("bench-pipelines", args, bench, "pg2sink-bench-pipelines-")


if __name__ == "__main__":
    sys.exit(main())
