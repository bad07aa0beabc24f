"""What `pg2sink stream` publishes, seen from the real CLI (issue #11, items 5 and 6):
tables without a replica identity stay out unless asked, and -t/-T patterns that
select nothing are said at every reconcile and by `pg2sink status`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from tests.conftest import Database, Pg2Sink, run_cli, wait_for

Proc = Callable[..., Pg2Sink]
POLL = "--publication-poll-interval=200ms"


def members(db: Database) -> list[str]:
    with psycopg.connect(db.dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables"
            " WHERE pubname = %s ORDER BY 1",
            (db.publication,),
        )
        return [r[0] for r in rows]


def test_table_without_replica_identity_is_left_out_unless_allowed(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE keyed (id int primary key, v text)")
    conn.execute("CREATE TABLE nokey (id int, v text)")
    conn.execute("INSERT INTO nokey VALUES (1, 'a')")
    out = str(tmp_path / "out.jsonl")
    p = pg2sink_proc("--file-path", out, POLL).start()
    p.wait_streaming()
    assert members(db) == ["public.keyed"]
    # the application keeps working on the table
    conn.execute("UPDATE nokey SET v = 'b'")
    conn.execute("DELETE FROM nokey")
    wait_for(lambda: "table public.keyed joined" in p.stderr(), what="the join")
    time.sleep(1.0)  # five more reconciles (200 ms): still one warning
    assert p.stop() == 0
    warnings = [line for line in p.stderr().splitlines() if "left out of publication" in line]
    assert len(warnings) == 1, p.stderr()
    assert "public.nokey" in warnings[0] and "--allow-no-replica-identity" in warnings[0]

    # asked for, through the environment like every flag: it joins
    p = pg2sink_proc("--file-path", out, env={"PG2SINK_ALLOW_NO_REPLICA_IDENTITY": "true"})
    p.start().wait_streaming()
    assert members(db) == ["public.keyed", "public.nokey"]
    assert p.stop() == 0
    # and the flag: the same
    p = pg2sink_proc("--file-path", out, "--allow-no-replica-identity").start()
    p.wait_streaming()
    assert p.stop() == 0
    assert members(db) == ["public.keyed", "public.nokey"]
    # an instance without it takes the table out again
    p = pg2sink_proc("--file-path", out).start()
    p.wait_streaming()
    assert p.stop() == 0
    assert members(db) == ["public.keyed"]
    assert "table public.nokey left publication" in p.stderr()
    conn.execute("INSERT INTO nokey VALUES (2, 'c'); UPDATE nokey SET v = 'd'")


def test_patterns_that_select_nothing_warn_at_every_reconcile_and_in_status(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    db.connect().execute("CREATE TABLE orders (id int primary key)")
    warning = "-t 'order' -T 'orders' select no table in schema(s) public"
    p = pg2sink_proc(
        "--file-path", str(tmp_path / "out.jsonl"), POLL, "-t", "order", "-T", "orders"
    ).start()
    p.wait_streaming()
    wait_for(lambda: p.stderr().count(warning) >= 3, what="a warning at every reconcile")
    assert p.stop() == 0
    assert members(db) == []

    status = run_cli("status", "-t", "order", "-T", "orders", env=p.env)
    assert status.returncode == 0, status.stderr
    assert f"warning: {warning}" in status.stdout
    as_json = json.loads(run_cli("status", "--json", "-t", "order", env=p.env).stdout)
    assert as_json["warnings"] == ["-t 'order' select no table in schema(s) public"]
    # patterns that select a table: nothing to say
    fine = run_cli("status", "-t", "order*", env=p.env)
    assert fine.returncode == 0 and "warning" not in fine.stdout
    fine = run_cli("status", env=p.env)
    assert fine.returncode == 0 and "warning" not in fine.stdout
