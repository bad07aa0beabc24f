"""The job store on a real PostgreSQL, and a failing job in a running pg2sink."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import TupleRow

from pg2sink.config import SecretDsn
from pg2sink.errors import ImportFailed
from pg2sink.imports import jobs
from pg2sink.imports.migrate import apply_migrations
from pg2sink.imports.snapshot import Visibility
from tests.conftest import Database, Pg2Sink, run_cli, wait_for
from tests.imports.support import IMPORTS_ON
from tests.support import scalar

S = "pg2sink"


@pytest.fixture
def store(db: Database) -> psycopg.Connection[TupleRow]:
    apply_migrations(SecretDsn(db.dsn), S)
    return db.connect()


def test_one_live_job_per_table(store: psycopg.Connection[TupleRow]) -> None:
    first = jobs.create_jobs(store, S, "pub", [("public", "a"), ("public", "b")])
    assert len(first) == 2
    assert jobs.create_jobs(store, S, "pub", [("public", "a")]) == []  # still live
    assert len(jobs.create_jobs(store, S, "other", [("public", "a")])) == 1  # other publication
    new = jobs.request_import(store, S, "pub", "public", "a")
    live = {j.table: j for j in jobs.list_jobs(store, S, "pub")}
    assert live["a"].id == new and live["a"].reason == "request"
    every = jobs.list_jobs(store, S, "pub", include_expired=True)
    expired = [j for j in every if j.state == "expired"]
    assert [j.id for j in expired] == [first[0]] and expired[0].expired_at is not None


def test_claim_skips_jobs_other_sessions_hold(
    db: Database, store: psycopg.Connection[TupleRow]
) -> None:
    a, b = jobs.create_jobs(store, S, "pub", [("public", "a"), ("public", "b")])
    one, two = db.connect(), db.connect()
    got1 = jobs.claim(one, S, "pub")
    got2 = jobs.claim(two, S, "pub")
    assert got1 is not None and got2 is not None
    assert {got1.id, got2.id} == {a, b}
    assert got1.state == got2.state == "running" and got1.attempts == 1
    assert jobs.claim(db.connect(), S, "pub") is None  # both are held
    # the holder dies: its running job is free to resume, as a new attempt
    one.close()
    resumed = jobs.claim(db.connect(), S, "pub")
    assert resumed is not None and resumed.id == got1.id and resumed.attempts == 2


def test_partitions_and_rows(store: psycopg.Connection[TupleRow]) -> None:
    (job_id,) = jobs.create_jobs(store, S, "pub", [("public", "a")])
    jobs.save_partitions(store, S, job_id, ["id < 10", "id >= 10"], 20)
    jobs.mark_partition_done(store, S, job_id, 1, 11)
    jobs.mark_partition_done(store, S, job_id, 1, 11)  # twice: counted once
    parts = jobs.load_partitions(store, S, job_id)
    assert [(p.number, p.predicate, p.done, p.rows) for p in parts] == [
        (0, "id < 10", False, None),
        (1, "id >= 10", True, 11),
    ]
    job = jobs.get_job(store, S, job_id)
    assert job is not None
    assert (job.rows_processed, job.rows_estimated, job.partitions, job.partitions_done) == (
        11,
        20,
        2,
        1,
    )
    # a connection in a transaction (as an executor may hold it): committed all the same
    with psycopg.connect(store.info.dsn) as other:
        jobs.mark_partition_done(other, S, job_id, 0, 9)
        assert other.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    job = jobs.get_job(store, S, job_id)
    assert job is not None and job.rows_processed == 20 and job.partitions_done == 2


def test_failures_back_off_exponentially(store: psycopg.Connection[TupleRow]) -> None:
    backoff = jobs.Backoff(base=2.0, factor=3.0, max=10.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4)] == [2.0, 6.0, 10.0, 10.0]
    (job_id,) = jobs.create_jobs(store, S, "pub", [("public", "a")])
    assert jobs.claim(store, S, "pub") is not None
    assert jobs.fail(store, S, job_id, "boom", backoff) == 2.0
    jobs.release(store, S, job_id)
    job = jobs.get_job(store, S, job_id)
    assert job is not None
    assert (job.state, job.error, job.error_count) == ("failed", "boom", 1)
    assert job.last_error_at is not None
    wait = (job.next_attempt_at - job.last_error_at).total_seconds()
    assert 1.9 < wait < 2.1
    assert jobs.claim(store, S, "pub") is None  # not due yet


def test_visibility_of_32_bit_xids() -> None:
    v = Visibility.parse("100:110:103,105")
    assert [v.visible(x) for x in (99, 100, 103, 104, 105, 109, 110, 200)] == [
        True,
        True,
        False,
        True,
        False,
        True,
        False,
        False,
    ]
    # epoch 1, just past wraparound: 32-bit xids near 2^32 are from epoch 0, older
    epoch = 1 << 32
    w = Visibility.parse(f"{epoch + 5}:{epoch + 20}:{epoch + 10}")
    assert w.visible(2**32 - 10)  # epoch 0, before xmin
    assert not w.visible(10)  # in progress
    assert w.visible(12)
    assert not w.visible(25)  # after xmax
    assert str(w) == f"{epoch + 5}:{epoch + 20}:{epoch + 10}"


def test_a_failing_job_records_its_error_and_backs_off(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.kept (id int PRIMARY KEY)")
    conn.execute("CREATE TABLE public.doomed (id int PRIMARY KEY)")
    # the table joins and gets its job, then it is dropped before the job runs
    started = run_cli(
        "migrate", env={"PG2SINK_SOURCE": db.dsn, "PG2SINK_PUBLICATION": db.publication}
    )
    assert started.returncode == 0, started.stderr
    conn.execute(f"CREATE PUBLICATION {db.publication} FOR TABLE public.kept, public.doomed")
    jobs.create_jobs(conn, S, db.publication, [("public", "doomed")])
    conn.execute("DROP TABLE public.doomed")
    out = tmp_path / "changes.jsonl"
    proc = pg2sink_proc(
        "--file-path",
        str(out),
        "--import-backoff-base",
        "1s",
        "--import-backoff-factor",
        "2",
        "--import-backoff-max",
        "3s",
        env=IMPORTS_ON,
    ).start()
    proc.wait_streaming(60)

    def failed_three_times() -> jobs.Job | None:
        (job,) = [j for j in jobs.list_jobs(conn, S, db.publication) if j.table == "doomed"]
        return job if job.error_count >= 3 else None

    job = wait_for(failed_three_times, 60, "three failed attempts")
    assert job.state in ("failed", "running")
    assert job.error == "table public.doomed does not exist"
    assert job.attempts >= 3
    if job.state == "failed":
        assert job.last_error_at is not None
        wait = (job.next_attempt_at - job.last_error_at).total_seconds()
        assert 2.9 < wait < 3.1  # 1s, 2s, then the 3s cap
    assert (
        "import of public.doomed failed (attempt 1): table public.doomed does not exist; "
        "next attempt in 1s" in proc.stderr()
    )
    status = run_cli(
        "status", env={"PG2SINK_SOURCE": db.dsn, "PG2SINK_PUBLICATION": db.publication}
    )
    assert status.returncode == 0, status.stderr
    assert "public.doomed: failed" in status.stdout or "public.doomed: running" in status.stdout
    assert proc.stop() == 0


def test_a_partition_of_a_job_whose_engine_died_is_not_marked(
    db: Database, store: psycopg.Connection[TupleRow]
) -> None:
    (job_id,) = jobs.create_jobs(store, S, "pub", [("public", "a")])
    jobs.save_partitions(store, S, job_id, ["true"], 1)
    engine = db.connect()
    assert jobs.claim(engine, S, "pub") is not None
    jobs.mark_partition_done(store, S, job_id, 0, 1)  # the engine holds the job: fine
    jobs.save_partitions(store, S, job_id, ["true", "false"], 1)
    pid = engine.info.backend_pid
    engine.close()  # killed
    # the server ends the backend (and its advisory lock) after the client has gone
    wait_for(
        lambda: scalar(store, "SELECT NOT EXISTS (SELECT FROM pg_locks WHERE pid = %s)", (pid,)),
        10,
        "the closed connection's locks to go",
    )
    with pytest.raises(ImportFailed, match="no longer run by a live pg2sink"):
        jobs.mark_partition_done(store, S, job_id, 1, 0)
    assert [p.done for p in jobs.load_partitions(store, S, job_id)] == [True, False]
