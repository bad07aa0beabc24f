"""The --capture-ddl event trigger is shared: it stays while any pg2sink slot uses it.

Two instances (two slots, two publications) on one database, one with --capture-ddl:
starting, stopping and dropping the other never removes the trigger the first relies on.
"""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import psycopg
from psycopg.rows import TupleRow

from pg2sink.config import SecretDsn
from pg2sink.imports.migrate import apply_migrations, set_capture_ddl
from tests.conftest import Database, read_jsonl, run_cli, wait_for
from tests.support import FAST, Proc, scalar

TRIGGER = "pg2sink_capture_ddl"


def _ddl_queries(path: Path) -> list[str]:
    out = []
    for r in read_jsonl(path):
        if r["kind"] == "message" and r["prefix"] == "pg2sink.ddl":
            out.append(json.loads(base64.b64decode(str(r["content"])))["query"])
    return out


def _triggers(conn: psycopg.Connection[TupleRow]) -> int:
    return int(scalar(conn, "SELECT count(*) FROM pg_event_trigger WHERE evtname = %s", (TRIGGER,)))


def test_another_instance_never_removes_the_trigger_in_use(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
    out = tmp_path / "capturing.jsonl"
    capturing = pg2sink_proc("--file-path", str(out), *FAST, "--capture-ddl").start()
    capturing.wait_streaming()
    other_env = {"PG2SINK_SLOT": f"{db.slot}_b", "PG2SINK_PUBLICATION": f"{db.publication}_b"}

    def other_run() -> None:
        other = pg2sink_proc("--file-path", str(tmp_path / "other.jsonl"), env=other_env)
        other.start().wait_streaming()
        assert other.stop() == 0

    other_run()  # a start without --capture-ddl
    assert _triggers(conn) == 1
    conn.execute("ALTER TABLE public.t ADD COLUMN a int")
    wait_for(lambda: "ALTER TABLE public.t ADD COLUMN a int" in _ddl_queries(out), 30, "DDL a")
    other_run()
    dropped = run_cli("drop", env={**capturing.env, **other_env})
    assert dropped.returncode == 0, dropped
    assert "event trigger" not in dropped.stdout
    assert _triggers(conn) == 1
    conn.execute("ALTER TABLE public.t ADD COLUMN b int")
    wait_for(lambda: "ALTER TABLE public.t ADD COLUMN b int" in _ddl_queries(out), 30, "DDL b")
    assert capturing.stop() == 0
    # the last user's drop removes it
    dropped = run_cli("drop", env=capturing.env)
    assert dropped.returncode == 0, dropped
    assert "dropped the --capture-ddl event trigger" in dropped.stdout, dropped
    assert _triggers(conn) == 0


def test_the_trigger_exists_while_a_slot_is_registered(db: Database) -> None:
    conn = db.connect()
    dsn = SecretDsn(db.dsn)
    apply_migrations(dsn, "pg2sink")
    assert set_capture_ddl(dsn, "pg2sink", "a", "pa", True) is True
    assert set_capture_ddl(dsn, "pg2sink", "b", "pb", True) is False  # already there
    assert set_capture_ddl(dsn, "pg2sink", "c", "pc", False) is False  # never registered
    assert set_capture_ddl(dsn, "pg2sink", "a", "pa", False) is False  # b still uses it
    assert _triggers(conn) == 1
    assert set_capture_ddl(dsn, "pg2sink", "b", "pb", False) is True
    assert _triggers(conn) == 0


def test_concurrent_registrations_keep_trigger_and_registry_in_step(db: Database) -> None:
    dsn = SecretDsn(db.dsn)
    apply_migrations(dsn, "pg2sink")
    problems: list[str] = []

    def flip(slot: str) -> None:
        with psycopg.connect(db.dsn, autocommit=True) as own:
            for i in range(25):
                try:
                    set_capture_ddl(dsn, "pg2sink", slot, "p", True)
                    # registered: nobody may drop the trigger until this slot unregisters
                    if not _triggers(own):
                        problems.append(f"{slot} #{i}: registered but no trigger")
                    set_capture_ddl(dsn, "pg2sink", slot, "p", False)
                except Exception as e:  # reported by the main thread
                    problems.append(f"{slot} #{i}: {e!r}")

    threads = [threading.Thread(target=flip, args=(f"s{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert problems == []
    conn = db.connect()
    assert scalar(conn, "SELECT count(*) FROM pg2sink.ddl_capture_users") == 0
    assert _triggers(conn) == 0
