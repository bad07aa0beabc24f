"""Spark supervised (docs/imports.md, "When Spark dies"): real PostgreSQL, real Spark,
pg2sink run as users run it. A driver JVM killed mid-import is replaced by a new
session that imports the partitions left, and the table converges; a JVM that cannot
start is one clear line per try and a failed job, shown by `pg2sink import --list`,
`pg2sink status`, /status and /metrics. On a standalone cluster of the test's own (never
the shared one of `make services`), its workers and its master killed mid-import: the
session is found lost, replaced once the cluster is back, and the table converges (a
worker left alive may finish the job by itself: standalone executors answer to the
driver, not to the master)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import services

from tests.conftest import Database, Pg2Sink, run_cli, wait_for
from tests.imports import test_consistency as consistency
from tests.imports.support import (
    driver_jvm,
    jobs_state,
    read_changelog,
    start_with_imports,
    wait_confirmed,
    wait_imported,
)
from tests.imports.test_cluster import on_cluster

pytestmark = pytest.mark.slow

TABLES = {"public.single", "public.composite", "public.nokey"}


def stop_after_writes(
    db: Database, proc: Pg2Sink, writer: consistency.Writer
) -> tuple[str, list[str]]:
    """The writer's writes all confirmed, pg2sink stopped cleanly: its stderr and the lines
    that say a Spark session was lost and replaced."""
    assert writer.error is None, writer.error
    wait_confirmed(db, proc)
    assert proc.stop() == 0
    err = proc.stderr()
    return err, [line for line in err.splitlines() if "starting a new Spark session" in line]


def partitions_done(db: Database, table: str) -> tuple[int, int]:
    """(done, all) partitions of the table's live job; (0, 0) before it has any."""
    schema, name = table.split(".")
    with psycopg.connect(db.dsn, autocommit=True) as c:
        try:
            row = c.execute(
                "SELECT count(*) FILTER (WHERE p.done), count(*) FROM pg2sink.import_partitions p"
                " JOIN pg2sink.import_jobs j ON j.id = p.job_id"
                " WHERE j.schema_name = %s AND j.table_name = %s AND j.state <> 'expired'",
                (schema, name),
            ).fetchone()
        except psycopg.errors.UndefinedTable:
            return 0, 0
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.timeout(900)
def test_driver_jvm_killed_mid_import_completes_on_a_new_session(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    consistency._fill(conn, 300_000, 4_000, 3_000)
    out = tmp_path / "changes.jsonl"
    writer = consistency.Writer(db.dsn, seed=32)
    writer.start()
    try:
        proc = start_with_imports(pg2sink_proc, out)

        def some_done() -> bool:
            assert proc.proc is not None and proc.proc.poll() is None, proc.stderr()
            done, total = partitions_done(db, "public.single")
            return 1 <= done < total

        wait_for(some_done, 300, "some partitions of public.single to be done")
        jvm = driver_jvm(proc)
        assert jvm is not None, "no Spark driver JVM under pg2sink"
        os.kill(jvm, signal.SIGKILL)
        wait_imported(db, TABLES, proc, timeout=400)
        assert driver_jvm(proc) not in (None, jvm), "a new driver JVM runs"
        time.sleep(1.0)
    finally:
        writer.stop.set()
        writer.join(30)
    err, lost = stop_after_writes(db, proc, writer)
    assert len(lost) == 1, err
    assert f"Spark's driver JVM (pid {jvm}) was killed by signal 9" in lost[0]
    assert "Traceback" not in err, err
    shown = [line for line in err.splitlines() if " DEBUG " not in line]
    assert not [line for line in shown if "py4j" in line.lower()], "\n".join(shown)
    consistency._check_converged(read_changelog(out), conn)


def test_a_jvm_that_cannot_start_fails_the_job_in_one_line_per_try(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
    conn.execute("INSERT INTO public.t SELECT generate_series(1, 10)")
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(
        pg2sink_proc,
        out,
        "--spark-session-failures",
        "2",
        "--import-backoff-base",
        "10m",
        env={"JAVA_HOME": str(tmp_path / "no-java")},
    )
    wait_for(lambda: jobs_state(db).get("public.t") == "failed", 120, "the job to fail")
    # the engine goes on with the next job (which fails the same way)
    with conn.transaction():
        conn.execute("CREATE TABLE public.other (id int PRIMARY KEY)")
        conn.execute("INSERT INTO public.other VALUES (1)")
    wait_for(lambda: jobs_state(db).get("public.other") == "failed", 120, "the second job")
    err = proc.stderr()
    tries = [line for line in err.splitlines() if "has no bin/java" in line]
    # per job: a warning with the first try, the job's failure with the last
    assert len(tries) == 4, err
    assert sum("starting a new Spark session (failure 1 of 2" in line for line in tries) == 2
    assert sum("failed (attempt 1)" in line for line in tries) == 2
    assert "Traceback" not in err, err

    env = {"PG2SINK_SOURCE": db.dsn, "PG2SINK_PUBLICATION": db.publication}
    listed = run_cli("import", "--list", env=env)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if "public.t:" in x)
    assert "failed" in line and "has no bin/java" in line, listed.stdout
    status = run_cli("status", env={**env, "PG2SINK_SLOT": db.slot})
    assert "has no bin/java" in status.stdout, status.stdout

    url = re.search(r"/metrics on (http://\S+)", err)
    assert url, err
    base = url.group(1).rstrip("/")
    with urllib.request.urlopen(f"{base}/status", timeout=5) as r:
        body = json.loads(r.read())
    assert "has no bin/java" in body["imports_failed"]["public.t"], body
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        metrics = [x for x in r.read().decode().splitlines() if x.startswith("pg2sink_import")]
    assert 'pg2sink_import_state{schema="public",state="failed",table="t"} 1.0' in metrics
    assert "pg2sink_import_spark_sessions_lost_total 4.0" in metrics, metrics
    assert proc.stop() == 0


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[services.SparkCluster]:
    """A standalone cluster (a master, two one-core workers) for this test alone: it
    kills the master, which the shared cluster's other users need."""
    cluster = services.SparkCluster(
        tmp_path / "spark", services.free_ports(services.SERVICES["spark"])
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.mark.timeout(1200)
def test_the_workers_and_the_master_killed_mid_import_complete_on_a_new_session(
    db: Database,
    own_cluster: services.SparkCluster,
    pg2sink_proc: Callable[..., Pg2Sink],
    tmp_path: Path,
) -> None:
    conn = db.connect()
    consistency._fill(conn, 200_000, 2_000, 3_000)
    out = tmp_path / "changes.jsonl"
    writer = consistency.Writer(db.dsn, seed=33)
    writer.start()
    try:
        # sessions started while the master is down fail too: room for them
        proc = start_with_imports(
            on_cluster(pg2sink_proc, own_cluster), out, "--spark-session-failures", "6"
        )

        def some_done() -> bool:
            assert proc.proc is not None and proc.proc.poll() is None, proc.stderr()
            done, total = partitions_done(db, "public.single")
            return 1 <= done <= total - 3

        wait_for(some_done, 400, "some partitions of public.single to be done")
        # every worker, not one: with one left, its executor can finish the job while
        # the master is down (standalone executors answer to the driver), and nothing is
        # lost for the watchdog to see
        for daemon in (*own_cluster.workers, own_cluster.master):
            pid = daemon.pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):  # this process started it
                os.waitpid(pid, 0)
        # longer than the watchdog waits for an unreachable master
        wait_for(lambda: "stopped accepting connections" in proc.stderr(), 60, "the master's loss")
        own_cluster.start()  # the master and the workers again, on the same ports
        wait_imported(db, TABLES, proc, timeout=600)
        time.sleep(1.0)
    finally:
        writer.stop.set()
        writer.join(30)
    err, lost = stop_after_writes(db, proc, writer)
    assert lost, err
    assert f"the Spark master {own_cluster.url} stopped accepting connections" in lost[0]
    assert "Traceback" not in err, err
    consistency._check_converged(read_changelog(out), conn)
