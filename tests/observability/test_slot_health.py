"""Slot health on a real server: a slot invalidated for real (WAL removed past
max_slot_wal_keep_size) is shown by `pg2sink status` and stops `pg2sink stream` with one
line naming the cause and the way back, never a retry loop."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import services
from psycopg.rows import TupleRow

from pg2sink.observability.position import slot_health
from tests.conftest import Database, fresh_database, pg2sink_for, run_cli, start_postgres


@pytest.fixture(scope="module")
def small_wal_server() -> Iterator[services.Postgres]:
    """A server of the session's major that keeps at most 1 MB of WAL for a slot."""
    with start_postgres(max_slot_wal_keep_size="1MB") as server:
        yield server


@pytest.fixture
def small_db(small_wal_server: services.Postgres) -> Iterator[Database]:
    with fresh_database(small_wal_server) as db:
        yield db


def _lose_the_slots_wal(conn: psycopg.Connection[TupleRow], slot: str) -> None:
    """Write and switch WAL segments past max_slot_wal_keep_size, then CHECKPOINT: the
    server removes the segments the inactive slot still needs and invalidates it."""
    for _ in range(20):
        for _ in range(3):
            conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
            conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")
        health = slot_health(conn, slot)
        assert health is not None
        if health.invalidated:
            return
    raise AssertionError(f"slot {slot} never lost its WAL: {health}")


def test_an_invalidated_slot_stops_the_stream_with_one_line(
    small_db: Database, tmp_path: Path
) -> None:
    conn = small_db.connect()
    conn.execute("CREATE TABLE t (id int)")
    p = pg2sink_for(small_db, tmp_path, "--file-path", str(tmp_path / "o.jsonl")).start()
    try:
        p.wait_streaming(60)
        before = json.loads(run_cli("status", "--json", env=p.env).stdout)["slot"]
    finally:
        p.stop()
    assert before["invalidation_reason"] is None and before["wal_status"] == "reserved"
    # 1 MB past the end of the segment being written: at most a segment (16 MB) more
    assert 0 < before["safe_wal_size"] <= 1024 * 1024 + 16 * 1024 * 1024
    _lose_the_slots_wal(conn, small_db.slot)

    status = json.loads(run_cli("status", "--json", env=p.env).stdout)
    assert status["slot"]["invalidation_reason"] == "wal_removed", status["slot"]
    if conn.info.server_version < 170000:
        assert status["slot"]["wal_status"] == "lost"
    assert any("was invalidated" in w for w in status["warnings"]), status["warnings"]
    text = run_cli("status", env=p.env).stdout
    assert "health: invalidated (wal_removed)" in text

    started = time.monotonic()
    res = run_cli("stream", "--file-path", str(tmp_path / "o.jsonl"), env=p.env)
    assert res.returncode == 2, res.stderr
    assert time.monotonic() - started < 30  # no retry loop
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, res.stderr
    assert errors[0].startswith("pg2sink: error: replication slot")
    assert "invalidated by the server (wal_removed" in errors[0]
    assert "pg2sink drop" in errors[0] and "imports every table again" in errors[0]
    # the way back it names works
    assert run_cli("drop", env=p.env).returncode == 0
    again = pg2sink_for(small_db, tmp_path, "--file-path", str(tmp_path / "o2.jsonl")).start()
    try:
        again.wait_streaming(60)
    finally:
        again.stop()
