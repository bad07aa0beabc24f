"""Imports on a real Spark standalone cluster (docs/imports.md, "Running imports on a
Spark cluster"): the `spark_cluster` fixture's master and two one-core workers on
loopback, pg2sink run as users run it with `--spark-master spark://127.0.0.1:PORT`.

Executors are JVMs of their own that the workers start (their /json lists them), fetch
the JDBC driver from the driver (`spark.jars`) and write to the sink themselves; the
consistency test under concurrent writes holds on the cluster as on `local[*]`, and a
worker killed mid-import costs a retried task, never a row.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import services
from psycopg.rows import TupleRow

from tests.conftest import Database, KafkaStack, Pg2Sink, wait_for
from tests.imports import test_consistency as consistency
from tests.imports.support import read_changelog, replay, start_with_imports, wait_imported
from tests.imports.test_spark import check_rows, expected_rows, fill_table, read_import
from tests.sinks.kafka.test_kafka import Reader

pytestmark = pytest.mark.slow

#: What the driver (the pg2sink process) needs for a cluster, as docs/imports.md tells a
#: user: the Python its executors run (one with pg2sink installed) and the address they
#: reach the driver at.
CLUSTER_ENV = {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}

Proc = Callable[..., Pg2Sink]


def on_cluster(pg2sink_proc: Proc, cluster: services.SparkCluster) -> Proc:
    """pg2sink_proc, each process importing on `cluster`."""

    def make(*args: str, env: dict[str, str] | None = None) -> Pg2Sink:
        return pg2sink_proc(
            *args, "--spark-master", cluster.url, env={**CLUSTER_ENV, **(env or {})}
        )

    return make


def app_ids(cluster: services.SparkCluster) -> set[str]:
    """Every application the master knows, running or completed."""
    state = cluster.master.state()
    apps = [*_list(state, "activeapps"), *_list(state, "completedapps")]
    return {str(a["id"]) for a in apps}


def executors_of(cluster: services.SparkCluster, app: str) -> dict[int, list[dict[str, Any]]]:
    """The executors (running or finished) each worker (by RPC port) started for `app`."""
    out: dict[int, list[dict[str, Any]]] = {}
    for worker in cluster.workers:
        state = worker.state()
        runs = [*_list(state, "executors"), *_list(state, "finishedexecutors")]
        out[worker.port] = [e for e in runs if e.get("appid") == app]
    return out


def _list(state: dict[str, object], name: str) -> list[dict[str, Any]]:
    value = state.get(name)
    assert isinstance(value, list), f"{name} missing from {state}"
    return value


def new_app(cluster: services.SparkCluster, before: set[str]) -> str:
    """The one application started since `before` was taken (this test's pg2sink)."""
    new = app_ids(cluster) - before
    assert len(new) == 1, new
    return new.pop()


def test_the_cluster_is_a_master_and_two_one_core_workers(
    spark_cluster: services.SparkCluster,
) -> None:
    state = spark_cluster.master.state()
    # the URL .services/env and the tests give --spark-master is the master's own
    assert state["url"] == spark_cluster.env()["SPARK_MASTER_URL"] == spark_cluster.url
    ours = {w.port for w in spark_cluster.workers}
    alive = [w for w in _list(state, "workers") if w["state"] == "ALIVE" and w["port"] in ours]
    assert len(alive) == 2 == len(ours)
    assert all(w["cores"] == 1 and w["memory"] == 1024 for w in alive), alive


def test_file_import_runs_in_the_workers_executors(
    db: Database, spark_cluster: services.SparkCluster, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    fill_table(conn, 60_000)  # 6 partitions
    expected = expected_rows(conn)
    before = app_ids(spark_cluster)
    out = tmp_path / "changes.jsonl"
    started = time.monotonic()
    proc = start_with_imports(on_cluster(pg2sink_proc, spark_cluster), out)
    wait_imported(db, {"public.mix"}, proc)
    print(f"60k rows imported on the cluster {time.monotonic() - started:.1f}s after start")
    app = new_app(spark_cluster, before)
    assert proc.stop() == 0

    _, mods = read_import(out)
    check_rows(mods, expected)  # every row once, the database's values
    # each worker ran an executor of the import: a JVM of its own, in its work dir,
    # where it fetched the JDBC driver from the driver (spark.jars)
    ran = executors_of(spark_cluster, app)
    assert all(len(runs) == 1 for runs in ran.values()), ran
    for worker in spark_cluster.workers:
        (executor,) = ran[worker.port]
        jars = list((worker.work_dir / app / str(executor["id"])).glob("postgresql-*.jar"))
        assert len(jars) == 1, f"no JDBC driver in the executor's directory: {jars}"


def test_kafka_import_is_produced_by_the_executors(
    db: Database,
    spark_cluster: services.SparkCluster,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    pg2sink_proc: Proc,
    tmp_path: Path,
) -> None:
    rows = 30_000  # 3 partitions
    conn = db.connect()
    fill_table(conn, rows)
    expected = expected_rows(conn)
    before = app_ids(spark_cluster)
    proc = start_with_imports(
        on_cluster(pg2sink_proc, spark_cluster),
        tmp_path / "unused.jsonl",
        "--sink",
        "kafka",
        "--kafka-bootstrap-servers",
        kafka_stack.bootstrap_servers,
        "--schema-registry-url",
        kafka_stack.registry_url,
        "--topic-prefix",
        topic_prefix,
        # Spark settings pg2sink has no option for reach the driver this way
        env={"PYSPARK_SUBMIT_ARGS": "--conf spark.executor.memory=512m pyspark-shell"},
    )
    wait_imported(db, {"public.mix"}, proc)
    app = new_app(spark_cluster, before)
    assert proc.stop() == 0
    ran = executors_of(spark_cluster, app)
    assert [[e["memory"] for e in runs] for runs in ran.values()] == [[512], [512]], ran

    reader = Reader(
        kafka_stack.bootstrap_servers, [f"{topic_prefix}.public.mix"], kafka_stack.registry_url
    )
    try:
        messages = reader.read(rows, timeout=120)
        assert len(reader.read_for(2.0)) == rows  # one message per row, nothing more
    finally:
        reader.close()
    seen = set()
    for m in messages:
        after = m.value["after"]
        assert m.value["operation"] == "IMPORT" and m.key == {"id": after["id"]}
        assert after == expected[after["id"]], after["id"]
        seen.add(after["id"])
    assert seen == set(expected)


def test_concurrent_writes_during_a_cluster_import_converge(
    db: Database, spark_cluster: services.SparkCluster, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    # the local[*] test itself, its pg2sink importing on the cluster
    consistency.test_concurrent_writes_during_the_import_converge(
        db, on_cluster(pg2sink_proc, spark_cluster), tmp_path
    )


def _partitions(conn: psycopg.Connection[TupleRow]) -> dict[int, tuple[bool, str]]:
    """The import's partitions: number -> (done, predicate)."""
    try:
        rows = conn.execute(
            "SELECT partition, done, predicate FROM pg2sink.import_partitions"
        ).fetchall()
    except psycopg.errors.UndefinedTable:
        return {}
    return {int(n): (bool(done), str(predicate)) for n, done, predicate in rows}


def test_a_worker_killed_mid_import_costs_a_task_retry_not_a_row(
    db: Database, spark_cluster: services.SparkCluster, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    rows = 200_000
    conn = db.connect()
    conn.execute("CREATE TABLE public.big (id int PRIMARY KEY, pad text)")
    conn.execute(
        "INSERT INTO public.big SELECT g, repeat('x', 200) || g FROM generate_series(1, %s) g",
        (rows,),
    )
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(on_cluster(pg2sink_proc, spark_cluster), out)

    def mid_import() -> bool:
        assert proc.proc is not None and proc.proc.poll() is None, proc.stderr()
        parts = _partitions(conn)
        done = sum(1 for d, _ in parts.values() if d)
        # three or more left: both one-core executors have a task in flight
        return bool(parts) and 1 <= done <= len(parts) - 3

    wait_for(mid_import, 240, "the import to be under way")
    victim = spark_cluster.workers[0]
    pid = victim.pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    try:
        wait_imported(db, {"public.big"}, proc)
        assert proc.stop() == 0
    finally:
        # as `make services` does for a cluster missing a worker: start what is down,
        # wait until every worker is registered (the session's cluster is whole again)
        spark_cluster.start()

    # Spark retried the lost task itself: pg2sink's job succeeded at its first attempt
    job = conn.execute("SELECT attempts, error_count FROM pg2sink.import_jobs").fetchone()
    assert job == (1, 0)
    assert "Lost executor" in proc.stderr()
    parts = _partitions(conn)
    assert all(d for d, _ in parts.values())

    # every row arrived; a row written twice is one of the partition the killed executor
    # was running or had finished without the driver hearing of it (its one core runs
    # one task at a time, the next only once the driver knows the last), written again
    # by the retry, identical (docs/imports.md: "the retry reads the same snapshot and
    # writes the same rows again")
    records = read_changelog(out)
    imports = [r for r in records if r.get("operation") == "IMPORT"]
    seen = Counter(r["after"]["id"] for r in imports)
    assert set(seen) == set(range(1, rows + 1))
    owner = {
        key: number
        for number, (_, predicate) in parts.items()
        for (key,) in conn.execute(f"SELECT id FROM public.big WHERE {predicate}").fetchall()
    }
    repeated = {owner[k] for k, n in seen.items() if n > 1}
    assert len(repeated) <= 1, repeated
    copies: dict[int, set[str]] = {}
    for r in imports:  # the same but for `sequence`, its place in a scan's order
        same = {k: v for k, v in r.items() if k != "sequence"}
        copies.setdefault(r["after"]["id"], set()).add(repr(sorted(same.items())))
    assert all(len(c) == 1 for c in copies.values())
    state = replay(records, "public.big", ("id",))
    assert len(state) == rows
    print(f"partitions written twice after the kill: {sorted(repeated)}")
