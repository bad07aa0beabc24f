"""--capture-ddl: each DDL statement reaches the sink as a Message record, in commit order."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

from tests.conftest import Database, Pg2Sink, read_jsonl, run_cli, wait_for


def test_ddl_statements_arrive_in_commit_order(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
    out = tmp_path / "changes.jsonl"
    proc = pg2sink_proc("--file-path", str(out), "--capture-ddl").start()
    proc.wait_streaming()
    conn.execute("INSERT INTO public.t VALUES (1)")
    with conn.transaction():
        conn.execute("ALTER TABLE public.t ADD COLUMN note text")
        conn.execute("INSERT INTO public.t VALUES (2, 'after the ALTER')")
    conn.execute("SELECT pg_logical_emit_message(true, 'app', 'not forwarded')")

    def lines() -> list[dict[str, object]]:
        return [r for r in read_jsonl(out) if r["kind"] in ("message", "modification")]

    got = wait_for(lambda: len(lines()) >= 3 and lines(), 30, "the three records")
    assert proc.stop() == 0
    assert [r["kind"] for r in got] == ["modification", "message", "modification"]
    ddl = got[1]
    assert ddl["prefix"] == "pg2sink.ddl" and ddl["transactional"] is True
    assert ddl["xid"] == got[2]["xid"]  # inside the transaction that ran it
    content = json.loads(base64.b64decode(str(ddl["content"])))
    assert content == {"tag": "ALTER TABLE", "query": "ALTER TABLE public.t ADD COLUMN note text"}
    row = conn.execute(
        "SELECT count(*) FROM pg_event_trigger WHERE evtname = 'pg2sink_capture_ddl'"
    ).fetchone()
    assert row == (1,)
    # without the flag, the next start removes the trigger
    again = pg2sink_proc("--file-path", str(out)).start()
    again.wait_streaming()
    assert again.stop() == 0
    row = conn.execute("SELECT count(*) FROM pg_event_trigger").fetchone()
    assert row == (0,)
    # and so does pg2sink drop
    env = {"PG2SINK_SOURCE": db.dsn, "PG2SINK_SLOT": db.slot, "PG2SINK_PUBLICATION": db.publication}
    proc = pg2sink_proc("--file-path", str(out), "--capture-ddl").start()
    proc.wait_streaming()
    assert proc.stop() == 0
    dropped = run_cli("drop", env=env)
    assert "dropped the --capture-ddl event trigger" in dropped.stdout, dropped
    assert conn.execute("SELECT count(*) FROM pg_event_trigger").fetchone() == (0,)
