"""--only end to end: pg2sink run as a process on a real PostgreSQL, the file sink's lines.

Filtered changes never reach the sink, and the slot's confirmed position still moves
past a workload of nothing but filtered changes.
"""

from __future__ import annotations

from pathlib import Path

from psycopg import sql

from tests.conftest import Database, read_jsonl, run_cli, wait_for
from tests.subscription.test_in_progress import streamed_transactions
from tests.support import Proc, modifications, start


def test_only_passes_the_listed_actions_of_the_listed_tables(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE users (id int primary key, name text)")
    conn.execute("CREATE TABLE audit (id int primary key, what text)")
    conn.execute("CREATE TABLE other (id int primary key)")
    out = tmp_path / "out.jsonl"
    p = start(
        pg2sink_proc,
        out,
        "--only",
        "public.users=insert,update",
        "--only",
        "aud*=delete,truncate",
    )
    with conn.transaction():
        conn.execute("INSERT INTO users VALUES (1, 'ada'), (2, 'bob')")
        conn.execute("INSERT INTO audit VALUES (1, 'x'), (2, 'y')")
        conn.execute("INSERT INTO other VALUES (1)")
    conn.execute("UPDATE users SET name = 'ada lovelace' WHERE id = 1")
    conn.execute("UPDATE audit SET what = 'z'")
    conn.execute("DELETE FROM users WHERE id = 2")
    conn.execute("DELETE FROM audit WHERE id = 2")
    conn.execute("TRUNCATE users, audit, other")
    conn.execute("INSERT INTO other VALUES (9)")

    wait_for(lambda: any(m["after"] == {"id": 9} for m in modifications(out)), what="last insert")
    assert p.stop() == 0
    summary = [(m["name"], m["operation"], m["sequence"]) for m in modifications(out)]
    assert summary == [
        ("users", "INSERT", 0),
        ("users", "INSERT", 1),
        ("other", "INSERT", 2),  # sequences stay gapless within a transaction
        ("users", "UPDATE", 0),
        ("audit", "DELETE", 0),
        ("audit", "TRUNCATE", 0),
        ("other", "TRUNCATE", 1),
        ("other", "INSERT", 0),
    ]
    # the tables' Schema records are there all the same
    assert {r["name"] for r in read_jsonl(out) if r["kind"] == "schema"} == {
        "users",
        "audit",
        "other",
    }


def test_the_slot_moves_past_filtered_changes(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE events (id int primary key, v int)")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out, "--only", "events=delete")
    for i in range(20):
        conn.execute("INSERT INTO events VALUES (%s, 0)", (i,))
        conn.execute("UPDATE events SET v = 1 WHERE id = %s", (i,))
    end = db.current_lsn()
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= end, what="the slot past the workload")
    assert p.stop() == 0
    assert modifications(out) == []


def test_bad_only_values_are_one_line_errors(db: Database) -> None:
    for value, words in [
        ("users", "expected TABLE=ACTION"),
        ("users=insert,upsert", "actions among insert, update, delete, truncate"),
        ("=insert", "expected TABLE=ACTION"),
    ]:
        done = run_cli("stream", "--source", db.dsn, "--only", value)
        assert done.returncode == 2, done.stderr
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_routing_applies_to_streamed_transactions(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    """--streaming replays a large transaction at its commit through the same stage."""
    conn = db.connect()
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(
            sql.Identifier(db.name)
        )
    )
    conn.execute("CREATE TABLE big (id int PRIMARY KEY, secret text, payload text)")
    out = tmp_path / "out.jsonl"
    p = start(
        pg2sink_proc,
        out,
        "--streaming",
        "--spill-dir",
        str(tmp_path / "spill"),
        "--only",
        "big=update",
        "--exclude-column",
        "big.secret",
    )
    with conn.transaction():
        conn.execute(
            "INSERT INTO big SELECT i, 'hidden', repeat('p', 100) FROM generate_series(1, 3000) i"
        )
        conn.execute("UPDATE big SET payload = 'q' WHERE id <= 2000")
    wait_for(lambda: len(modifications(out)) >= 2000, what="the streamed updates")
    assert p.stop() == 0
    mods = modifications(out)
    assert {m["operation"] for m in mods} == {"UPDATE"} and len(mods) == 2000
    assert [m["sequence"] for m in mods] == list(range(2000))
    assert all(set(m["after"]) == {"id", "payload"} for m in mods)
    assert b"hidden" not in out.read_bytes()
    assert streamed_transactions(db) >= 1  # the server did stream it
