"""--format wal-listener on the NATS sink, end to end through the CLI: what a
wal-listener consumer reads from wal-listener's subjects, byte for byte
(formats/wal_listener.py, docs/formats.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from datetime import UTC, datetime

import nats
import nats.errors
import nats.js.errors
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from nats.aio.msg import Msg

from pg2sink.errors import ConfigError
from pg2sink.formats.config import Formatting
from pg2sink.formats.nats import JsonPayload, WalListenerPayload
from pg2sink.formats.wal_listener import WalListenerEncoder
from pg2sink.sinks.nats.config import NatsConfig
from pg2sink.sinks.nats.imports import NatsImportTarget
from pg2sink.sinks.nats.subjects import covers, table_subject
from tests.conftest import Database, wait_for
from tests.sinks.nats.nats_support import Stored, delete_stream, start, stored
from tests.sinks.null.test_null import import_table
from tests.support import Proc

#: wal-listener's Event (listener/nats_publisher.go at 261cd6e) as easyjson marshals it:
#: the fields in their order under their tags; data (a Go map, whose order easyjson
#: leaves to Go: pg2sink writes the table's) with bool and int4 parsed and every other
#: value PostgreSQL's text; ID and EventTime (a random uuid.UUID and the commit time) are
#: filled in from the message once their shape is checked
WAL_LISTENER_EVENTS = [
    b'{"id":"%(id)s","schema":"public","table":"users","action":"INSERT","data":{"id":1,'
    b'"name":"ada","active":true,"n":"7","seen":"2024-05-01 10:00:00.123456+00"},'
    b'"commitTime":"%(time)s"}',
    b'{"id":"%(id)s","schema":"public","table":"users","action":"UPDATE","data":{"id":1,'
    b'"name":"ada lovelace","active":null,"n":"7","seen":"2024-05-01 10:00:00.123456+00"},'
    b'"commitTime":"%(time)s"}',
    b'{"id":"%(id)s","schema":"public","table":"users","action":"DELETE","data":{"id":1},'
    b'"commitTime":"%(time)s"}',
    b'{"id":"%(id)s","schema":"public","table":"users","action":"TRUNCATE","data":{},'
    b'"commitTime":"%(time)s"}',
]
#: a uuid.UUID's and a UTC time.Time's JSON (RFC 3339, trailing zeros of the fraction cut)
_ID = re.compile(rb'"id":"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"')
_TIME = re.compile(rb'"commitTime":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d*[1-9])?Z)"')


def as_wal_listener_marshals(got: bytes, template: bytes) -> bytes:
    """`template` with the message's id and commitTime, once they have their Go shape."""
    found_id, found_time = _ID.search(got), _TIME.search(got)
    assert found_id and found_time, got
    return template % {b"id": found_id.group(1), b"time": found_time.group(1)}


async def _consume(url: str, subject: str, count: int) -> list[Stored]:
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=5)
        deadline = time.monotonic() + 30
        while True:  # until pg2sink's stream holds the subject (at the table's first change)
            try:
                # no stream named: nats.go and nats-py find the stream holding the subject
                sub = await js.pull_subscribe(subject, durable="wal-consumer")
                break
            except nats.js.errors.NotFoundError:
                assert time.monotonic() < deadline, f"no stream holds {subject}"
                await asyncio.sleep(0.2)
        got: list[Msg] = []
        deadline = time.monotonic() + 30
        while len(got) < count:
            assert time.monotonic() < deadline, f"{len(got)} of {count} messages on {subject}"
            with contextlib.suppress(nats.errors.TimeoutError):
                got += await sub.fetch(count - len(got), timeout=5)
        with contextlib.suppress(nats.errors.TimeoutError):  # and nothing more
            got += await sub.fetch(1, timeout=1)
        for m in got:  # read: not to be sent again
            await m.ack()
        return [Stored(m.subject, m.data, dict(m.headers or {})) for m in got]
    finally:
        await nc.close()


def wal_listener_consumer(url: str, subject: str, count: int) -> list[Stored]:
    """The messages a consumer of wal-listener's subject reads, as one moved to JetStream
    would: a durable consumer (stan.DurableName's successor) of that subject alone,
    `count` messages and whatever else is there."""
    return asyncio.run(_consume(url, subject, count))


@pytest.mark.slow
@pytest.mark.parametrize("dot", ["", "."])
def test_wal_listener_events_on_wal_listener_subjects(
    db: Database, pg2sink_proc: Proc, nats_url: str, topic_prefix: str, dot: str
) -> None:
    """A consumer subscribed as wal-listener's were, to `<prefix><schema>_<table>`, reads
    the events byte for byte as wal-listener marshalled them, and no Schema record is
    published anywhere in the stream. A prefix `pre` gives `prepublic_users`, outside
    the stream's `pre.>` (added to the stream's subjects); `pre.` gives
    `pre.public_users`, inside it."""
    prefix, stream = topic_prefix + dot, topic_prefix + dot.replace(".", "_")
    conn = db.connect()
    conn.execute(
        "CREATE TABLE users "
        "(id int primary key, name text, active bool, n bigint, seen timestamptz)"
    )
    p = start(pg2sink_proc, nats_url, prefix, "--format", "wal-listener")
    seen = datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
    conn.execute("INSERT INTO users VALUES (1, 'ada', true, 7, %s)", (seen,))
    conn.execute("UPDATE users SET name = 'ada lovelace', active = NULL WHERE id = 1")
    conn.execute("DELETE FROM users WHERE id = 1")
    conn.execute("TRUNCATE users")
    written = db.current_lsn()
    subject = f"{prefix}public_users"  # wal-listener's: topicPrefix + schema_table
    try:
        got = wal_listener_consumer(nats_url, subject, 4)
        assert [m.subject for m in got] == [subject] * 4
        for m, template in zip(got, WAL_LISTENER_EVENTS, strict=True):
            assert m.data == as_wal_listener_marshals(m.data, template)
        assert len({m.data[7:43] for m in got}) == 4  # a uuid of each change
        # the stream holds these four and nothing else: no Schema record
        assert [(m.subject, m.data) for m in stored(nats_url, stream)] == [
            (m.subject, m.data) for m in got
        ]
        wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= written, 30, "the slot to pass them")
        assert p.stop() == 0
        assert "Schema records are not published" in p.stderr()
        added = f"JetStream stream {stream} now holds subject {subject}"
        assert (added in p.stderr()) == (dot == "")
    finally:
        asyncio.run(delete_stream(nats_url, stream))


def test_wal_listener_subjects_and_the_stream_filters_that_hold_them() -> None:
    """wal-listener's rule (GetSubjectName) on escaped names, and which of the stream's
    subject filters hold a subject (a table's is added to the stream unless one does)."""
    payload = WalListenerPayload(WalListenerEncoder())
    assert table_subject(payload, "pre", "public", "users") == "prepublic_users"
    assert table_subject(payload, "app.", "my schema", "t.1") == "app.my%20schema_t%2E1"
    assert table_subject(JsonPayload(), "app", "public", "users") == "app.public.users"
    assert not payload.schema_records and JsonPayload().schema_records
    assert covers(["app.>"], "app.public_users") and not covers(["app.>"], "app")
    assert not covers(["pre.>"], "prepublic_users") and covers(["x", "*"], "prepublic_users")
    assert covers(["a.*.c"], "a.b.c") and not covers(["a.*.c"], "a.b.c.d")
    assert covers(["a.>"], "a.b.c") and not covers(["a.b"], "a.b.c")
    # the prefix may end in '.' for wal-listener's subjects, not for pg2sink's
    NatsConfig(nats_subject_prefix="app.", format="wal-listener").check()
    with pytest.raises(ConfigError, match=re.escape("invalid --nats-subject-prefix 'app.'")):
        NatsConfig(nats_subject_prefix="app.").check()


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
