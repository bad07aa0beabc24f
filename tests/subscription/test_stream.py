"""End to end: a real PostgreSQL, pg2sink run as a process, the file sink's JSON lines."""

from __future__ import annotations

import base64
import json
import signal
import time as time_module
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Database, read_jsonl, run_cli, start_postgres, wait_for
from tests.support import FAST, Proc, modifications, start


def exact(path: Path) -> list[dict[str, Any]]:
    """Records parsed with exact decimals (the JSON numbers of numeric columns)."""
    if not path.exists():
        return []
    return [json.loads(line, parse_float=Decimal) for line in path.read_text().splitlines()]


def test_changes_across_tables_and_schemas(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE SCHEMA app")
    conn.execute("CREATE TABLE public.users (id int primary key, name text)")
    conn.execute(
        "CREATE TABLE app.orders (id bigint primary key, user_id int, total numeric(10,2))"
    )
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out, "--schema", "public", "--schema", "app")

    with conn.transaction():
        conn.execute("INSERT INTO users VALUES (1, 'ada'), (2, 'bob')")
        conn.execute("INSERT INTO app.orders VALUES (10, 1, 12.50)")
    conn.execute("UPDATE users SET name = 'ada lovelace' WHERE id = 1")
    conn.execute("DELETE FROM users WHERE id = 2")
    conn.execute("UPDATE users SET id = 3 WHERE id = 1")  # key change
    conn.execute("TRUNCATE app.orders, users")

    wait_for(lambda: len(modifications(out)) >= 8, what="8 modifications")
    assert p.stop() == 0
    records = exact(out)
    mods = [r for r in records if r["kind"] == "modification"]
    summary = [(m["namespace"], m["name"], m["operation"], m["sequence"]) for m in mods]
    assert summary == [
        ("public", "users", "INSERT", 0),
        ("public", "users", "INSERT", 1),
        ("app", "orders", "INSERT", 2),
        ("public", "users", "UPDATE", 0),
        ("public", "users", "DELETE", 0),
        ("public", "users", "UPDATE", 0),
        ("app", "orders", "TRUNCATE", 0),
        ("public", "users", "TRUNCATE", 1),
    ]
    # same transaction → same xid and commit timestamp; later ones differ
    assert mods[0]["xid"] == mods[2]["xid"] != mods[3]["xid"]
    assert mods[0]["timestamp"] == mods[2]["timestamp"]
    assert mods[2]["after"] == {"id": 10, "user_id": 1, "total": Decimal("12.50")}
    assert mods[3]["before"] is None  # DEFAULT identity, key unchanged
    assert mods[3]["after"] == {"id": 1, "name": "ada lovelace"}
    assert mods[4]["before"] == {"id": 2} and mods[4]["after"] is None
    assert mods[5]["before"] == {"id": 1}  # old key, so consumers can delete it
    assert mods[5]["after"] == {"id": 3, "name": "ada lovelace"}
    assert mods[6]["before"] is None and mods[6]["after"] is None
    lsns = [m["lsn"] for m in mods]
    assert lsns == sorted(lsns)
    # A Schema line precedes each table's first Modification.
    seen: set[tuple[str, str]] = set()
    for r in records:
        key = (r["namespace"], r["name"])
        if r["kind"] == "schema":
            seen.add(key)
            assert r["schema"]["type"] == "record"
            assert r["lsn"] > 0
        else:
            assert key in seen, f"modification of {key} before its schema"
    orders_schema = next(r for r in records if r["kind"] == "schema" and r["name"] == "orders")
    assert orders_schema["schema"]["pg.primary_key"] == ["id"]
    total = next(f for f in orders_schema["schema"]["fields"] if f["name"] == "total")
    assert total["type"][1]["logicalType"] == "decimal"
    assert (total["type"][1]["precision"], total["type"][1]["scale"]) == (10, 2)


COMMON_TYPES = """
CREATE TABLE typed (
    id int8 primary key, i2 int2, i4 int4, n numeric(12,4), nu numeric, f8 float8,
    t text, vc varchar(10), b bool, by bytea, u uuid, d date, tm time, ts timestamp,
    tstz timestamptz, j jsonb, ai int4[], at text[], nothing text
)
"""


def test_common_types_round_trip_exactly(db: Database, pg2sink_proc: Proc, tmp_path: Path) -> None:
    conn = db.connect()
    conn.execute(COMMON_TYPES)
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    row = {
        "id": 9_000_000_000,
        "i2": -32768,
        "i4": 2147483647,
        "n": Decimal("12345678.1234"),
        "nu": Decimal("3.14159265358979323846264338327950288419716939937510"),
        "f8": 0.1,
        "t": 'Zoë 日本語 🐘 "quoted" \\ backslash\nnewline',
        "vc": "short",
        "b": True,
        "by": b"\x00\x01\xfe\xff binary",
        "u": UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        "d": date(2024, 2, 29),
        "tm": time(23, 59, 59, 999999),
        "ts": datetime(2024, 5, 1, 10, 0, 0, 123456),
        "tstz": datetime(2024, 5, 1, 10, 0, 0, 1, tzinfo=UTC),
        "j": {"k": [1, 2.5, None, "v"], "nested": {"a": True}},
        "ai": [1, None, 3],
        "at": ["a b", None, '"q"', "NULL"],
        "nothing": None,
    }
    cols = ", ".join(row)
    marks = ", ".join(["%s"] * len(row))
    values = [Jsonb(v) if k == "j" else v for k, v in row.items()]
    conn.execute(f"INSERT INTO typed ({cols}) VALUES ({marks})", values)
    wait_for(lambda: modifications(out), what="the insert")
    p.stop()
    after = next(r for r in exact(out) if r["kind"] == "modification")["after"]

    assert after["id"] == row["id"] and after["i2"] == row["i2"] and after["i4"] == row["i4"]
    assert after["n"] == row["n"] and after["nu"] == row["nu"]
    assert Decimal(after["f8"]) == Decimal(repr(row["f8"]))
    assert after["t"] == row["t"] and after["vc"] == row["vc"]
    assert after["b"] is True
    assert base64.b64decode(after["by"]) == row["by"]
    assert UUID(after["u"]) == row["u"]
    assert date.fromisoformat(after["d"]) == row["d"]
    assert time.fromisoformat(after["tm"]) == row["tm"]
    assert datetime.fromisoformat(after["ts"]) == row["ts"]
    assert datetime.fromisoformat(after["tstz"]) == row["tstz"]
    assert json.loads(after["j"]) == row["j"]
    assert after["ai"] == row["ai"] and after["at"] == row["at"]
    assert after["nothing"] is None


BIG = "x" * 50_000 + "y" * 50_000  # 100 KB; compresses well, forced external below


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_unchanged_toast_value_is_never_null(
    identity: str, db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE docs (id int primary key, body text, rev int)")
    conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")  # no compression
    conn.execute(f"ALTER TABLE docs REPLICA IDENTITY {identity}")
    conn.execute("INSERT INTO docs VALUES (1, %s, 1)", (BIG,))
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    conn.execute("UPDATE docs SET rev = 2 WHERE id = 1")
    wait_for(lambda: modifications(out), what="the update")
    p.stop()
    update = modifications(out)[0]
    assert update["operation"] == "UPDATE" and update["after"]["rev"] == 2
    if identity == "FULL":
        assert update["after"]["body"] == BIG
        assert update["before"] == {"id": 1, "body": BIG, "rev": 1}
    else:
        assert update["after"]["body"] == {"unchanged_toast": True}
        assert update["before"] is None


def test_new_table_joins_and_streams(db: Database, pg2sink_proc: Proc, tmp_path: Path) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE first (id int primary key)")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    conn.execute("CREATE TABLE later (id int primary key, v text)")
    wait_for(lambda: "table public.later joined" in p.stderr(), what="the new table to join")
    conn.execute("INSERT INTO later VALUES (1, 'hello')")
    wait_for(lambda: modifications(out), what="the insert into the new table")
    p.stop()
    assert modifications(out)[0]["name"] == "later"
    assert modifications(out)[0]["after"] == {"id": 1, "v": "hello"}


def test_add_column_emits_a_new_schema_before_the_next_modification(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE evolving (id int primary key)")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    conn.execute("INSERT INTO evolving VALUES (1)")
    wait_for(lambda: modifications(out), what="the first insert")
    conn.execute("ALTER TABLE evolving ADD COLUMN note text DEFAULT 'n/a'")
    conn.execute("INSERT INTO evolving VALUES (2, 'second')")
    wait_for(lambda: len(modifications(out)) == 2, what="the second insert")
    p.stop()
    kinds = [
        (
            r["kind"],
            [f["name"] for f in r["schema"]["fields"]] if r["kind"] == "schema" else r["after"],
        )
        for r in read_jsonl(out)
    ]
    assert kinds == [
        ("schema", ["id"]),
        ("modification", {"id": 1}),
        ("schema", ["id", "note"]),
        ("modification", {"id": 2, "note": "second"}),
    ]


def test_kill_9_between_commits_loses_nothing(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE counter (k int primary key, v int)")
    conn.execute("INSERT INTO counter SELECT k, 0 FROM generate_series(1, 5) k")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    committed = 0
    for round_ in range(1, 4):
        for v in range(1, 41):
            conn.execute("UPDATE counter SET v = %s WHERE k = %s", (v + 100 * round_, v % 5 + 1))
            committed += 1
        p.kill()  # no final flush, no final status
        p = start(pg2sink_proc, out)
    wait_for(
        lambda: (
            len({m["lsn"] for m in modifications(out) if m["operation"] == "UPDATE"}) >= committed
        ),
        what="every committed update",
    )
    p.stop()
    updates = [m for m in modifications(out) if m["operation"] == "UPDATE"]
    # at least once: every commit present; duplicates only as replays
    assert len({u["lsn"] for u in updates}) == committed
    # per-key order: the first occurrence of each change per key is in commit order
    for k in range(1, 6):
        first_seen: list[int] = []
        for u in updates:
            if u["after"]["k"] == k and u["lsn"] not in first_seen:
                first_seen.append(u["lsn"])
        assert first_seen == sorted(first_seen)
    final = {u["after"]["k"]: u["after"]["v"] for u in sorted(updates, key=lambda u: u["lsn"])}
    assert final == dict(conn.execute("SELECT k, v FROM counter").fetchall())


def test_clean_stop_confirms_everything_written(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    out = tmp_path / "out.jsonl"
    # With a 1h flush interval nothing is flushed during the test (neither at the
    # deadline nor early when caught up): only the final flush on SIGTERM can confirm.
    p = pg2sink_proc(
        "--file-path", str(out), "--flush-interval", "1h", "--heartbeat-interval", "1h"
    ).start()
    p.wait_streaming()
    before = db.slot_confirmed_lsn()
    conn.execute("INSERT INTO t VALUES (1)")
    lsn_after_commit = db.current_lsn()
    time_module.sleep(1.0)  # the change reaches pg2sink but is not flushed yet
    assert db.slot_confirmed_lsn() == before, p.stderr()
    assert p.stop(signal.SIGTERM) == 0
    assert [m["after"] for m in modifications(out)] == [{"id": 1}]
    confirmed = db.slot_confirmed_lsn()
    assert confirmed is not None and confirmed >= lsn_after_commit


def test_caught_up_stream_is_confirmed_before_the_flush_deadline(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    out = tmp_path / "out.jsonl"
    # 20s interval: an early flush (at most every 2s) must confirm the insert long
    # before the deadline, because pg2sink has caught up with the server.
    p = pg2sink_proc("--file-path", str(out), "--flush-interval", "20s").start()
    p.wait_streaming()
    time_module.sleep(2.1)
    conn.execute("INSERT INTO t VALUES (1)")
    lsn_after_commit = db.current_lsn()
    wait_for(
        lambda: (db.slot_confirmed_lsn() or 0) >= lsn_after_commit,
        timeout=10,
        what="the insert to be confirmed early",
    )
    assert [m["after"] for m in modifications(out)] == [{"id": 1}]
    p.stop()


def test_decode_only_prints_messages_and_never_advances_the_slot(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key, v text)")
    out = tmp_path / "decoded.txt"
    p = start(pg2sink_proc, out, "--decode-only")
    before = db.slot_confirmed_lsn()
    conn.execute("INSERT INTO t VALUES (1, 'one')")
    conn.execute("UPDATE t SET v = 'uno' WHERE id = 1")
    wait_for(lambda: out.exists() and out.read_text().count("COMMIT") >= 2, what="two commits")
    assert p.stop() == 0
    text = out.read_text()
    assert "BEGIN" in text and "RELATION" in text and "INSERT" in text and "UPDATE" in text
    assert "'uno'" in text
    assert db.slot_confirmed_lsn() == before
    # and the changes are still there for a real run
    real = tmp_path / "real.jsonl"
    p2 = start(pg2sink_proc, real)
    wait_for(lambda: len(modifications(real)) == 2, what="the changes after --decode-only")
    p2.stop()


def test_idle_slot_advances_past_unrelated_commits(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE SCHEMA unpublished")
    conn.execute("CREATE TABLE published (id int primary key)")
    conn.execute("CREATE TABLE unpublished.noise (id serial primary key, pad text)")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out, "--heartbeat-interval", "0.5s")
    for _ in range(20):
        conn.execute("INSERT INTO unpublished.noise (pad) VALUES (repeat('x', 1000))")
    target = db.current_lsn()
    wait_for(
        lambda: (db.slot_confirmed_lsn() or 0) >= target,
        timeout=30,
        what="the confirmed LSN to pass the unrelated commits",
    )
    p.stop()
    assert modifications(out) == []


def test_busy_slot_is_an_error_unless_retry_initial(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    active = start(pg2sink_proc, tmp_path / "a.jsonl")
    second = pg2sink_proc("--file-path", str(tmp_path / "b.jsonl"), *FAST).start()
    assert second.proc is not None
    assert second.proc.wait(30) == 2
    err = second.stderr().strip().splitlines()
    assert err[-1].startswith("pg2sink: error: replication slot") and "--retry-initial" in err[-1]

    standby = pg2sink_proc(
        "--file-path",
        str(tmp_path / "c.jsonl"),
        *FAST,
        "--retry-initial",
        "--retry-interval",
        "0.2s",
    ).start()
    wait_for(lambda: "retrying" in standby.stderr(), what="the standby to wait")
    active.kill()
    standby.wait_streaming()
    conn.execute("INSERT INTO t VALUES (42)")
    wait_for(lambda: modifications(tmp_path / "c.jsonl"), what="the standby to stream")
    standby.stop()


def test_unreachable_server_exits_2_with_one_clear_line() -> None:
    res = run_cli("--source", "host=127.0.0.1 port=1 user=x password=hunter2 connect_timeout=2")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("pg2sink: error: cannot connect to PostgreSQL")
    assert "hunter2" not in res.stderr + res.stdout


def test_bad_dsn_exits_2() -> None:
    res = run_cli("--source", "not a dsn at all")
    assert res.returncode == 2
    assert res.stderr.startswith("pg2sink: error: invalid --source")


def test_wal_level_replica_exits_2_naming_the_fix() -> None:
    with start_postgres(wal_level="replica") as server:
        res = run_cli("--source", server.dsn())
    assert res.returncode == 2
    assert "wal_level is 'replica'" in res.stderr and "wal_level = logical" in res.stderr


def test_drop_removes_slot_and_publication(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    p = start(pg2sink_proc, tmp_path / "o.jsonl")
    p.stop()
    env = {**pg2sink_proc().env}
    res = run_cli("drop", env=env)
    assert res.returncode == 0, res.stderr
    assert f"dropped replication slot {db.slot}" in res.stdout
    assert f"dropped publication {db.publication}" in res.stdout
    assert db.slot_confirmed_lsn() is None


def test_composite_primary_key_is_listed_in_key_order(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE pairs (a int, b int, v text, PRIMARY KEY (b, a))")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    conn.execute("INSERT INTO pairs VALUES (1, 2, 'x')")
    conn.execute("DELETE FROM pairs")
    wait_for(lambda: len(modifications(out)) == 2, what="insert and delete")
    p.stop()
    schema = next(r for r in read_jsonl(out) if r["kind"] == "schema")["schema"]
    assert schema["pg.primary_key"] == ["b", "a"]
    assert [f["pg.key"] for f in schema["fields"]] == [True, True, False]
    assert modifications(out)[1]["before"] == {"a": 1, "b": 2}
