"""--format wal-listener on the NATS sink, end to end through the CLI: what a
wal-listener consumer reads from the subjects (formats/wal_listener.py, docs/formats.md)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from pg2sink.formats.config import Formatting
from pg2sink.sinks.nats.config import NatsConfig
from pg2sink.sinks.nats.imports import NatsImportTarget
from tests.conftest import Database, wait_for
from tests.sinks.nats.nats_support import delete_stream, start, stored
from tests.sinks.null.test_null import import_table
from tests.support import Proc


@pytest.mark.slow
def test_wal_listener_events_on_the_subjects(
    db: Database, pg2sink_proc: Proc, nats_url: str, topic_prefix: str
) -> None:
    conn = db.connect()
    conn.execute(
        "CREATE TABLE users "
        "(id int primary key, name text, active bool, n bigint, seen timestamptz)"
    )
    p = start(pg2sink_proc, nats_url, topic_prefix, "--format", "wal-listener")
    seen = datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
    conn.execute("INSERT INTO users VALUES (1, 'ada', true, 7, %s)", (seen,))
    conn.execute("UPDATE users SET name = 'ada lovelace', active = NULL WHERE id = 1")
    conn.execute("DELETE FROM users WHERE id = 1")
    conn.execute("TRUNCATE users")
    written = db.current_lsn()
    subject = f"{topic_prefix}.public.users"
    try:
        got = wait_for(
            lambda: (
                (m := [s for s in stored(nats_url, topic_prefix) if s.subject == subject])
                and len(m) == 4
                and m
            ),
            30,
            "four events",
        )
        events = [json.loads(m.data) for m in got]
        # the keys and their order of wal-listener's Event (easyjson tags)
        assert all(
            list(e) == ["id", "schema", "table", "action", "data", "commitTime"] for e in events
        )
        assert [e["action"] for e in events] == ["INSERT", "UPDATE", "DELETE", "TRUNCATE"]
        assert {(e["schema"], e["table"]) for e in events} == {("public", "users")}
        # bool and int4 parsed, every other type PostgreSQL's text (AssertValue)
        assert events[0]["data"] == {
            "id": 1,
            "name": "ada",
            "active": True,
            "n": "7",
            "seen": "2024-05-01 10:00:00.123456+00",
        }
        assert events[1]["data"]["name"] == "ada lovelace" and events[1]["data"]["active"] is None
        assert events[2]["data"] == {"id": 1} and events[3]["data"] == {}
        assert len({uuid.UUID(e["id"]) for e in events}) == 4
        for e in events:  # Go's time.Time: RFC 3339, UTC
            assert datetime.fromisoformat(e["commitTime"]).tzinfo is not None
        # Schema records stay pg2sink's JSON, on their own subject
        schemas = [m for m in stored(nats_url, topic_prefix) if m.subject == f"{subject}.schema"]
        assert json.loads(schemas[0].data)["kind"] == "schema"
        wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= written, 30, "the slot to pass them")
        assert p.stop() == 0
    finally:
        asyncio.run(delete_stream(nats_url, topic_prefix))


def test_a_format_the_sink_does_not_take_is_one_line_exit_2() -> None:
    from tests.conftest import run_cli

    res = run_cli("--sink", "nats", "--format", "avro")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "pg2sink: error: --sink=nats does not take --format avro: choose one of json, "
        "pg-kinesis, wal-listener, psql-streamer, debezium"
    ]
    res = run_cli("--sink", "file", "--format", "json")
    assert res.returncode == 2 and "--format is for --sink kafka, nats or kinesis" in res.stderr


def test_imported_rows_in_a_seed_format(nats_url: str, topic_prefix: str) -> None:
    """The import target's rows, as psql-streamer inserts naming the source; the Schema
    record stays pg2sink's JSON on its own subject."""
    table = import_table()
    cfg = NatsConfig(
        nats_url=nats_url,
        nats_subject_prefix=topic_prefix,
        format="psql-streamer",
        formatting=Formatting(host="db1", database="app"),
    )
    try:
        target = NatsImportTarget(cfg).begin(table.schema)
        batch = pa.RecordBatch.from_arrays([pa.array(["1"]), pa.array(["a"])], ["c0", "c1"])
        assert target.write_rows(table, iter([batch])) == 1
        got = {m.subject: json.loads(m.data) for m in stored(nats_url, topic_prefix)}
        subject = f"{topic_prefix}.public.t"
        assert got[f"{subject}.schema"]["kind"] == "schema"
        event = got[subject]
        assert (event["Host"], event["Database"], event["Table"]) == ("db1", "app", "t")
        assert (event["Action"], event["Columns"]) == ("insert", {"id": 1, "v": "a"})
    finally:
        asyncio.run(delete_stream(nats_url, topic_prefix))
