"""`pg2sink status` against a real PostgreSQL: slot, lag, retained WAL, tables."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.conftest import Database, Pg2Sink, run_cli

Proc = Callable[..., Pg2Sink]


def test_status_before_anything_exists(db: Database, pg2sink_proc: Proc) -> None:
    env = pg2sink_proc().env
    res = run_cli("status", env=env)
    assert res.returncode == 0, res.stderr
    assert f"slot {db.slot}: does not exist" in res.stdout
    assert f"publication {db.publication}: does not exist" in res.stdout


def test_status_reports_slot_lag_and_tables(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE a (id int primary key); CREATE TABLE b (id int primary key)")
    p = pg2sink_proc("--file-path", str(tmp_path / "o.jsonl")).start()
    p.wait_streaming()
    running = json.loads(run_cli("status", "--json", env=p.env).stdout)
    assert running["slot"]["active"] is True and running["slot"]["active_pid"] > 0
    p.stop()
    # changes written while nobody streams: the lag grows by at least their WAL
    conn.execute("INSERT INTO a SELECT generate_series(1, 5000)")
    res = run_cli("status", "--json", env=p.env)
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert status["slot"]["exists"] is True and status["slot"]["active"] is False
    assert status["slot"]["lag_bytes"] > 100_000
    assert status["slot"]["wal_retained_bytes"] >= status["slot"]["lag_bytes"]
    assert status["tables"] == ["public.a", "public.b"]
    assert status["imports"] == []
    text = run_cli("status", env=p.env).stdout
    assert f"slot {db.slot}: inactive, confirmed " in text
    assert "publication" in text and "  public.a" in text and "  public.b" in text
