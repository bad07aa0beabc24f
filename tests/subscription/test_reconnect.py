"""PostgreSQL outages and restarts under a running pg2sink: retried, logged, nothing lost.

These tests stop and start their own PostgreSQL server (the session's shared one is left
alone so other tests are not disturbed).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import services
from psycopg import sql

from pg2sink.subscription.reconnect import Reconnect
from tests.conftest import Database, Pg2Sink, pg2sink_for, start_postgres, wait_for
from tests.support import Proc, modifications, scalar, start

#: Fast publication poll (the catalog connection is busy when the server goes away)
#: and a fast flush (the output shows a row soon after its commit).
FAST_POLL = ("--publication-poll-interval", "0.1s", "--flush-interval", "0.1s")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _outage(policy: Reconnect, clock: FakeClock, attempts: int) -> list[float]:
    """`attempts` failed attempts of one outage; the waits, the clock moved by each."""
    waits = []
    for _ in range(attempts):
        wait = policy.failed("server gone")
        waits.append(wait)
        clock.now += wait
    return waits


def test_backoff_doubles_within_an_outage_and_starts_again_after_a_healthy_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "pg2sink.subscription.reconnect")
    clock = FakeClock()
    policy = Reconnect(5.0, clock=clock)
    policy.streaming()
    clock.now += 60
    assert _outage(policy, clock, 7) == [1, 2, 4, 8, 16, 30, 30]  # the first wait is 1 s
    for _ in range(4):  # outage after outage, each after a healthy session: 1 s, 2 s again
        policy.streaming()
        clock.now += 3
        assert _outage(policy, clock, 2) == [1, 2]
    policy.streaming()
    messages = [r.getMessage() for r in caplog.records]
    stopped = [m for m in messages if m.startswith("streaming stopped: server gone")]
    again = [m for m in messages if m.startswith("streaming again after")]
    assert len(stopped) == 5 and len(again) == 5, messages  # each outage and recovery, once
    assert again[0] == "streaming again after 91.0s (7 failed attempts)"
    assert again[1] == "streaming again after 3.0s (2 failed attempts)"


def test_a_session_failing_soon_after_it_started_keeps_the_backoff_growing() -> None:
    clock = FakeClock()
    policy = Reconnect(5.0, clock=clock)
    policy.streaming()
    assert _outage(policy, clock, 2) == [1, 2]
    policy.streaming()
    clock.now += 0.5  # flapping: up for half a second
    assert _outage(policy, clock, 2) == [4, 8]


def test_new_reasons_within_an_outage_are_logged_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "pg2sink.subscription.reconnect")
    policy = Reconnect(5.0, clock=FakeClock())
    policy.streaming()
    for reason in ("server closed", "refused", "starting up", "refused", "refused"):
        policy.failed(reason)
    assert [r.getMessage() for r in caplog.records] == [
        "streaming stopped: server closed; retrying",
        "still retrying: refused",
        "still retrying: starting up",
    ]


def test_before_the_first_session_the_retry_interval_is_fixed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = Reconnect(0.2, clock=FakeClock())
    assert [policy.failed("slot busy") for _ in range(5)] == [0.2] * 5
    assert [r.getMessage() for r in caplog.records] == [
        "slot busy; retrying every 0.2s (--retry-initial)"
    ]


def test_waiting_for_a_busy_slot_says_it_waits(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    db.connect().execute("CREATE TABLE t (id int PRIMARY KEY)")
    active = start(pg2sink_proc, tmp_path / "a.jsonl")
    standby = pg2sink_proc(
        "--file-path", str(tmp_path / "b.jsonl"), "--retry-initial", "--retry-interval", "0.2s"
    ).start()
    wait_for(lambda: "retrying every 0.2s" in standby.stderr(), 30, "the standby to wait")
    time.sleep(1)  # a few more attempts: still one line
    err = standby.stderr()
    assert "pass --retry-initial" not in err, err
    waiting = [line for line in err.splitlines() if "is active in another process" in line]
    assert len(waiting) == 1 and "(--retry-initial)" in waiting[0], err
    active.kill()
    standby.wait_streaming()
    assert standby.stop() == 0


def test_lost_catalog_connection_is_retried(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    """pg_terminate_backend of the catalog connection: AdminShutdown at the next poll."""
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    out = tmp_path / "out.jsonl"
    p = pg2sink_proc("--file-path", str(out), *FAST_POLL).start()
    p.wait_streaming()
    for i in range(3):
        wait_for(
            lambda: scalar(
                conn,
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'pg2sink'"
                " AND backend_type = 'client backend'",
            ),
            30,
            "the catalog connection",
        )
        # the replication connection still streams until the next poll finds the loss
        _wait_log(p, "streaming again after", i + 1)
        conn.execute("INSERT INTO t VALUES (%s)", (i,))
        _wait_row(p, out, i)
        _running(p)
    assert p.stop() == 0
    err = p.stderr()
    assert "Traceback" not in err, err
    assert err.count("streaming stopped: lost the connection to PostgreSQL") == 3, err
    assert _ids(out) == {0, 1, 2}


@pytest.fixture(scope="module")
def own_server() -> Iterator[services.Postgres]:
    with start_postgres() as server:
        yield server


@pytest.fixture
def own_db(own_server: services.Postgres) -> Iterator[Database]:
    """The dedicated server's `postgres` database, with names for this test only."""
    tag = uuid.uuid4().hex[:10]
    db = Database(own_server, "postgres", f"slot_{tag}", f"pub_{tag}", own_server.dsn())
    yield db
    for conn in db.conns:
        conn.close()
    if own_server.running():
        with psycopg.connect(db.dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s AND NOT active",
                (db.slot,),
            )


def _ids(out: Path) -> set[int]:
    return {int(r["after"]["id"]) for r in modifications(out) if r.get("after")}


def _wait_row(p: Pg2Sink, out: Path, value: int, timeout: float = 60) -> None:
    def arrived() -> bool:
        _running(p)  # a crash fails at once, with its output
        return value in _ids(out)

    wait_for(arrived, timeout, f"row {value} in the output")


def _wait_log(p: Pg2Sink, text: str, times: int) -> None:
    wait_for(lambda: p.stderr().count(text) >= times, 30, f"{text!r} logged {times} times")


def _insert(db: Database, table: str, value: int) -> None:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(sql.Identifier(table)), (value,))


def _streaming_table(db: Database, tmp_path: Path, table: str) -> tuple[Pg2Sink, Path]:
    """A new table and pg2sink streaming it (only it) to a file: the process and the file."""
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(table)))
    out = tmp_path / "out.jsonl"
    p = pg2sink_for(db, tmp_path, "--file-path", str(out), "-t", f"public.{table}", *FAST_POLL)
    p.start().wait_streaming()
    return p, out


def _running(p: Pg2Sink) -> None:
    assert p.proc is not None
    assert p.proc.poll() is None, f"pg2sink exited {p.proc.returncode}:\n{p.stderr()}"


@pytest.mark.slow
def test_server_restarts_never_crash_and_lose_nothing(
    own_server: services.Postgres, own_db: Database, tmp_path: Path
) -> None:
    p, out = _streaming_table(own_db, tmp_path, "restarts")
    try:
        for i in range(10):
            _insert(own_db, "restarts", i)
            _wait_row(p, out, i)  # streaming again (and polling the publication)
            # a healthy session (the backoff starts again), then a restart at any moment
            time.sleep(3 + random.uniform(0, 0.5))
            _insert(own_db, "restarts", 100 + i)  # committed just before the shutdown
            own_server.stop("fast")
            own_server.start()
            _running(p)
        _insert(own_db, "restarts", 999)
        _wait_row(p, out, 999)
        _running(p)
    finally:
        p.stop()
    assert "Traceback" not in p.stderr(), p.stderr()
    assert _ids(out) == {*range(10), *range(100, 110), 999}


@pytest.mark.slow
def test_each_outage_and_recovery_is_logged_and_recovery_is_quick(
    own_server: services.Postgres, own_db: Database, tmp_path: Path
) -> None:
    p, out = _streaming_table(own_db, tmp_path, "outages")
    recoveries: list[float] = []
    try:
        for outage in range(2):
            _insert(own_db, "outages", outage)
            _wait_row(p, out, outage)
            time.sleep(3.5)  # a healthy period: the backoff starts again from its first step
            own_server.stop("fast")
            time.sleep(2)
            own_server.start()
            back = time.monotonic()
            _insert(own_db, "outages", 10 + outage)
            _wait_row(p, out, 10 + outage)
            recoveries.append(time.monotonic() - back)
        _running(p)
    finally:
        p.stop()
    err = p.stderr()
    assert "Traceback" not in err, err
    lost = [line for line in err.splitlines() if "streaming stopped:" in line]
    back_lines = [line for line in err.splitlines() if "streaming again after" in line]
    assert len(lost) == 2 and len(back_lines) == 2, err
    assert max(recoveries) < 3.0, recoveries
