"""The NATS JetStream sink (--sink=nats) against a real nats-server with JetStream.

Messages are read back from the stream itself (nats-py's get_msg by stream sequence), so
a test sees what JetStream stored, repeats included: the de-duplication by Nats-Msg-Id
is observed, not assumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from urllib.parse import unquote

import nats
import nats.js.errors
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
import services

from pg2sink.catalog.types import PgType
from pg2sink.changelog.batches import ImportTable
from pg2sink.changelog.builder import TableShape
from pg2sink.changelog.records import (
    Message,
    Modification,
    Operation,
    Record,
    Schema,
    Truncation,
)
from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for
from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.formats.jsonlines import record_line
from pg2sink.formats.nats import JsonPayload
from pg2sink.imports import jobs
from pg2sink.imports.spark import ImportTask, SparkRunner
from pg2sink.logical import encode
from pg2sink.sinks.nats import sink as nats_sink
from pg2sink.sinks.nats.client import Publisher
from pg2sink.sinks.nats.config import NatsConfig, shown_url, url_secrets
from pg2sink.sinks.nats.imports import NatsImportTarget
from pg2sink.sinks.nats.sink import NatsSink
from pg2sink.sinks.nats.subjects import escape, table_subject
from pg2sink.sinks.nats.wire import AckClient, ack_error, msg_id_header
from tests.conftest import Database, run_cli, wait_for
from tests.imports.test_spark import INTERNAL, check_rows, expected_rows, fill_table, prepare_job
from tests.sinks.kafka.test_kafka_health import api_url, status, status_without_slot
from tests.sinks.nats.nats_support import Stored, delete_stream, start, stored
from tests.support import Proc, own_server

T = datetime(2026, 11, 24, 4, 20, 0, 123456, tzinfo=UTC)


# --- subjects, ids and options, without a server -----------------------------------------


def test_names_are_escaped_injectively_into_one_token() -> None:
    names = ["users", "my.table", "a b", "a*", "b>", "50%", "%2E", "tab\there", "é.ü", ""]
    tokens = [escape(n) for n in names]
    assert tokens[:6] == ["users", "my%2Etable", "a%20b", "a%2A", "b%3E", "50%25"]
    assert escape("é.ü") == "é%2Eü"
    assert len(set(tokens)) == len(names)  # '%2E' the name and '.' the name differ
    for name, token in zip(names, tokens, strict=True):
        assert not any(c in token for c in ". *>\t") and unquote(token) == name
    assert table_subject(JsonPayload(), "pg.x", "my schema", "t.1") == "pg.x.my%20schema.t%2E1"


def test_a_changes_message_id_is_lsn_sequence_and_subject_with_any_name() -> None:
    """The header block made per table once (a subject with '%' escapes in it)."""
    for name in ("t", "50%", "my.t%2E"):
        table = nats_sink._Table("p%d", table_schema(name), JsonPayload())
        assert table.subject.startswith(b"p%d.public.")  # a '%' of its own: not a format
        header = table.change_header % (16777216, 3)
        assert header == msg_id_header(b"16777216:3:" + table.subject)


def test_url_secrets_and_the_url_shown() -> None:
    assert url_secrets("nats://me:hunter2@h:4222") == ["hunter2"]
    assert url_secrets("nats://s3cret-token@h:4222") == ["s3cret-token"]
    assert url_secrets("nats://h:4222") == [] and url_secrets("nats://me:@h:1") == []
    assert shown_url("nats://me:pw@a:1, tls://t@b:2") == "nats://a:1,tls://b:2"
    cfg = NatsConfig(nats_url="nats://u:pw1@h:1", nats_password="pw2", nats_user="u")
    assert sorted(cfg.secrets()) == ["pw1", "pw2"]
    assert "pw" not in repr(cfg)
    assert NatsConfig(nats_subject_prefix="cdc.db1").stream == "cdc_db1"


def test_acks_count_only_without_gaps() -> None:
    publisher = Publisher(NatsConfig())
    publisher._restart(3)
    sizes = [1, 10, 100, 1000]
    publisher._sent.keep([(b"s", b"x" * n, b"") for n in sizes], sizes)  # sent
    for serial in (0, 2, 3, 4):  # 4 was never sent
        publisher._acknowledge(serial)
    assert publisher.acked == (3, 1, 1)  # 1 is missing: 2 and 3 wait for it
    publisher._acknowledge(1)
    assert publisher.acked == (3, 4, 1111) and publisher._sent.resend() == []
    publisher._acknowledge(2)  # a repeat's answer changes nothing
    assert publisher.acked == (3, 4, 1111)
    publisher.stop()  # never started: closes its loop


def test_answers_to_a_publish_are_told_apart() -> None:
    assert ack_error(b'{"stream":"error","seq":1}', None) is None  # a stream named error
    assert ack_error(b'{"stream":"s","seq":2,"duplicate":true}', None) is None
    refused = b'{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}'
    assert ack_error(refused, None) == "maximum messages exceeded (10077)"
    assert ack_error(b"", b"NATS/1.0 503\r\n\r\n") == "no responders"
    assert ack_error(b"-", None) == "an answer that is not a PubAck: b'-'"


def test_replies_are_read_whole_wherever_a_read_cuts_them() -> None:
    """AckParser's own path (MSG frames of the acknowledgement subscription) and nats-py's
    (a reply with headers, a frame of another subscription) in one byte stream, cut in
    two at every position, as the server writes them (two spaces before the size)."""
    ack = b'{"stream":"s", "seq":1}'
    stream = (
        b"MSG _I.1.0 7  %d\r\n%s\r\n" % (len(ack), ack)
        + b"HMSG _I.1.1 7 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
        + b"MSG other 9  2\r\nhi\r\n"
        + b"MSG _I.1.2 7 %d\r\n%s\r\n" % (len(ack), ack)
    )
    got: list[tuple[bytes, bytes, bytes | None]] = []
    client = AckClient()
    client._ack_sid = 7
    client._on_ack = lambda subject, data, headers: got.append((subject, data, headers))
    for cut in range(len(stream) + 1):
        got.clear()
        client._ps.reset()
        asyncio.run(client._ps.parse(stream[:cut]))
        asyncio.run(client._ps.parse(stream[cut:]))
        assert got == [
            (b"_I.1.0", ack, None),
            (b"_I.1.1", b"", b"NATS/1.0 503\r\n\r\n"),
            (b"_I.1.2", ack, None),
        ], cut


def test_an_outbox_destination_that_is_no_subject_is_an_error() -> None:
    sink = NatsSink(NatsConfig())  # refused before anything is sent
    for bad in ("a b", "a..b", "a.>", ""):
        with pytest.raises(SinkError, match=f"outbox destination {bad!r} at LSN 7: dot-sep"):
            sink.publish(bad, None, b"x", [], 7)


NO_SERVER = {"PGHOST": "127.0.0.1", "PGPORT": "1"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nats-subject-prefix", "a..b"], "invalid --nats-subject-prefix 'a..b'"),
        (["--nats-subject-prefix", "a.>"], "invalid --nats-subject-prefix 'a.>'"),
        (["--nats-stream", "a.b"], "invalid --nats-stream 'a.b'"),
        (["--nats-url", "http://h:1"], "invalid --nats-url: expected nats://host:port"),
        (["--nats-password", "pw"], "--nats-password needs --nats-user"),
        (["--nats-creds", "/nonexistent.creds"], "cannot read --nats-creds '/nonexistent.creds'"),
        (["--nats-tls-key", "/etc/hostname"], "--nats-tls-key needs --nats-tls-cert"),
        (["--nats-ack-timeout", "0s"], "must be greater than zero"),
    ],
)
def test_bad_nats_options_exit_2_with_one_line(args: list[str], message: str) -> None:
    res = run_cli("--sink", "nats", *args, env=NO_SERVER)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert message in res.stderr


def test_unreachable_server_is_one_line_exit_2() -> None:
    port = services.free_port()
    res = run_cli("--sink", "nats", "--nats-url", f"nats://me:Hunter2xyz@127.0.0.1:{port}")
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1, res.stderr
    assert f"cannot connect to NATS at nats://127.0.0.1:{port}" in line
    assert "Hunter2xyz" not in res.stderr


def test_secrets_never_appear_in_errors_or_help() -> None:
    secrets = ("Hunter2xyz", "Hunter3xyz", "Hunter4xyz")
    env = {
        **NO_SERVER,
        "PG2SINK_SINK": "nats",
        "PG2SINK_NATS_URL": f"nats://me:{secrets[0]}@127.0.0.1:{services.free_port()}",
        "PG2SINK_NATS_USER": "me",
        "PG2SINK_NATS_PASSWORD": secrets[1],
    }
    outputs = []
    res = run_cli(env=env)
    assert res.returncode == 2 and "cannot connect to NATS" in res.stderr
    outputs.append(res.stderr)
    # a value that does not parse is not quoted back either
    res = run_cli(env={**env, "PG2SINK_NATS_URL": f"http://{secrets[0]}"})
    assert res.returncode == 2 and "invalid --nats-url" in res.stderr
    outputs.append(res.stderr)
    res = run_cli(env={**env, "PG2SINK_NATS_USER": "", "PG2SINK_NATS_TOKEN": secrets[2]})
    assert res.returncode == 2
    outputs.append(res.stderr)
    helped = run_cli("stream", "--help", env={**env, "PG2SINK_NATS_TOKEN": secrets[2]})
    assert "--nats-password" in helped.stdout and "PG2SINK_NATS_TOKEN" in helped.stdout
    outputs += [helped.stdout, helped.stderr]
    for out in outputs:
        assert not any(s in out for s in secrets), out


# --- the sink against the server ---------------------------------------------------------


@contextlib.contextmanager
def opened(cfg: NatsConfig) -> Iterator[NatsSink]:
    """A NatsSink, opened (connected, its stream made sure of), closed at the end."""
    sink = NatsSink(cfg)
    sink.open()
    try:
        yield sink
    finally:
        sink.close()


def table_schema(name: str, namespace: str = "public") -> Schema:
    row = {
        "type": "record",
        "name": "value",
        "namespace": f"{namespace}.{name}",
        "fields": [{"name": "id", "type": ["null", "int"], "default": None, "pg.column": "id"}],
        "pg.primary_key": ["id"],
    }
    return Schema(T, 10, namespace, name, row, primary_key=("id",))


def change(i: int, name: str = "t", op: Operation = Operation.INSERT) -> Modification:
    row: dict[str, object] = {"id": i}
    after, before = (None, row) if op is Operation.DELETE else (row, None)
    return Modification(T, i % 3, 1000 + i, 7, op, "public", name, before, after)


@pytest.fixture
def nats_cfg(nats_url: str, topic_prefix: str) -> Iterator[NatsConfig]:
    cfg = NatsConfig(nats_url=nats_url, nats_subject_prefix=topic_prefix)
    yield cfg
    asyncio.run(delete_stream(nats_url, cfg.stream))


def test_records_arrive_on_their_subjects_with_their_lines(
    nats_cfg: NatsConfig, nats_url: str, topic_prefix: str
) -> None:
    schema = table_schema("my.t")
    insert = Modification(T, 0, 1001, 7, Operation.INSERT, "public", "my.t", None, {"id": 1})
    truncate = Truncation(
        T, 1, 1002, 7, Operation.TRUNCATE, "public", "my.t", None, None, cascade=True
    )
    message = Message(T, 1003, 7, True, "app", b"\x00hi")
    with opened(nats_cfg) as sink:
        records: list[Record] = [schema, insert, truncate, message]
        for record in records:
            sink.write(record)
        sink.checkpoint(1100)
        assert sink.flush() == 1100
    got = stored(nats_url, topic_prefix)
    subject = f"{topic_prefix}.public.my%2Et"
    assert [m.subject for m in got] == [
        f"{subject}.schema",
        subject,
        subject,
        f"{topic_prefix}.messages",
    ]
    # the payload is the file sink's JSON line of the record, without the newline
    for m, record in zip(got, records, strict=True):
        assert m.data + b"\n" == record_line(record)
    assert got[2].value["truncate"] == {"cascade": True, "restart_identity": False}
    assert [m.headers["Nats-Msg-Id"] for m in got] == [
        f"10:{subject}.schema",
        f"1001:0:{subject}",
        f"1002:1:{subject}",
        f"1003:{topic_prefix}.messages",
    ]


def test_the_new_row_shortcut_stores_what_write_stores(
    nats_cfg: NatsConfig, nats_url: str, topic_prefix: str
) -> None:
    """The row writer (the changelog's fast path, no Modification built) publishes the
    bytes `write` publishes for the same change: subject, Nats-Msg-Id and payload."""
    schema = table_schema("t")
    changes = [
        Modification(T, 0, 2001, 9, Operation.INSERT, "public", "t", None, {"id": 1, "v": "é"}),
        Modification(T, 1, 2001, 9, Operation.UPDATE, "public", "t", None, {"id": 2, "v": None}),
    ]
    messages = [
        encode.insert(7, [b"1", "é".encode()]),
        b"U" + encode.insert(7, [b"2", None])[1:],
    ]
    shape = TableShape(
        "public",
        "t",
        ("id", "v"),
        (
            codec_for(
                PgType(oid=23, name="int4", namespace="pg_catalog", kind="b", category="N"), -1
            ),
            codec_for(
                PgType(oid=25, name="text", namespace="pg_catalog", kind="b", category="S"), -1
            ),
        ),
    )
    with opened(nats_cfg) as sink:
        sink.write(schema)
        for m in changes:
            sink.write(m)
        write_row = sink.row_writer(shape)
        assert write_row is not None
        for m, data in zip(changes, messages, strict=True):
            assert write_row(data, m.timestamp, m.sequence + 2, m.lsn, m.xid, m.operation)
        sink.checkpoint(2100)
        assert sink.flush() == 2100
    got = stored(nats_url, topic_prefix)[1:]
    assert len(got) == 4
    for by_write, by_shortcut in zip(got[:2], got[2:], strict=True):
        assert by_shortcut.subject == by_write.subject
        lsn, sequence, subject = by_write.headers["Nats-Msg-Id"].split(":", 2)
        assert by_shortcut.headers["Nats-Msg-Id"] == f"{lsn}:{int(sequence) + 2}:{subject}"
        assert by_shortcut.value == {**by_write.value, "sequence": by_write.value["sequence"] + 2}
        # byte for byte, but for the sequence's digit
        assert by_shortcut.data == by_write.data.replace(
            b'"sequence":%s' % sequence.encode(), b'"sequence":%d' % (int(sequence) + 2)
        )


def test_checkpoints_follow_the_acks_and_a_replay_is_stored_once(
    nats_cfg: NatsConfig, nats_url: str, topic_prefix: str
) -> None:
    def publish(n: int) -> None:
        with opened(nats_cfg) as sink:
            assert sink.acknowledged() is None
            sink.write(table_schema("t"))
            for i in range(n):
                sink.write(change(i))
                if i % 100 == 99:
                    sink.checkpoint(1000 + i + 1)
            sink.write(change(n))  # after the last checkpoint: holds no checkpoint back
            assert sink.flush() == 1000 + n
            sink.checkpoint(5000)
            assert sink.flush() == 5000 and sink.pending_bytes() == 0

    publish(3000)
    first = stored(nats_url, topic_prefix)
    assert len(first) == 3002
    assert [m.value["after"]["id"] for m in first[1:]] == list(range(3001))
    # a replay (a restart after a crash) sends the same ids: JetStream keeps one of each
    publish(3000)
    assert len(stored(nats_url, topic_prefix)) == 3002


def test_a_deleted_stream_is_an_error_and_confirms_nothing_after_it(
    nats_cfg: NatsConfig, nats_url: str, topic_prefix: str
) -> None:
    with opened(nats_cfg) as sink:
        sink.write(table_schema("t"))
        sink.write(change(1))
        sink.checkpoint(1100)
        assert sink.flush() == 1100
        asyncio.run(delete_stream(nats_url, nats_cfg.stream))
        sink.write(change(2))
        sink.checkpoint(1200)
        with pytest.raises(SinkError, match="no JetStream stream holds the subjects") as err:
            wait_for(lambda: sink.flush() == 1200, 10, "the failure")
        assert len(str(err.value).splitlines()) == 1
        assert sink.acknowledged() is None  # started over: nothing past the failure


# --- a server of the test's own, stopped and started ---------------------------------------


@pytest.fixture
def own_nats() -> Iterator[services.NatsServer]:
    with own_server(services.NatsServer, "nats") as server:
        yield server


def publish_one(sink: NatsSink, i: int) -> None:
    """What a (re)started session writes: the table's Schema record, change i and the
    checkpoint after it."""
    sink.write(table_schema("t"))
    sink.write(change(i))
    sink.checkpoint(1000 + i + 100)


def test_a_lost_connection_pauses_confirmations_and_sends_again_in_order(
    own_nats: services.NatsServer, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pg2sink")
    cfg = NatsConfig(nats_url=own_nats.url, nats_subject_prefix=topic_prefix)
    with opened(cfg) as sink:
        publish_one(sink, 1)
        assert sink.flush() == 1101
        own_nats.stop()
        for i in range(2, 5):
            sink.write(change(i))
            sink.checkpoint(1100 + i)
        time.sleep(2)  # reconnect attempts fail meanwhile
        assert sink.flush() == 1101  # not acknowledged: not confirmed, and no error
        own_nats.start()
        wait_for(lambda: sink.flush() == 1104, 30, "the acknowledgements after the outage")
    got = [m for m in stored(own_nats.url, topic_prefix) if not m.subject.endswith(".schema")]
    assert [m.value["after"]["id"] for m in got] == [1, 2, 3, 4]
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert sum("lost the connection to NATS" in m for m in logged) == 1
    assert sum("reachable again" in m for m in logged) == 1


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_a_frozen_server_gets_a_new_connection_after_the_ack_timeout(
    own_nats: services.NatsServer, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that keeps its connections but answers nothing (stopped with SIGSTOP)."""
    caplog.set_level(logging.INFO, logger="pg2sink")
    cfg = NatsConfig(nats_url=own_nats.url, nats_subject_prefix=topic_prefix, nats_ack_timeout=2.0)
    pid = own_nats.pid()
    assert pid is not None
    with opened(cfg) as sink:
        publish_one(sink, 1)
        assert sink.flush() == 1101
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: process_state(pid) == "T", 10, "the server to stop")
            sink.write(change(2))
            sink.checkpoint(1102)
            wait_for(
                lambda: sink.flush() and "no acknowledgement for 2s" in caplog.text,
                10,
                "the timeout",
            )
            assert sink.acknowledged() == 1101  # not acknowledged: not confirmed
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: sink.flush() == 1102, 30, "the acknowledgement on a new connection")
    got = [m for m in stored(own_nats.url, topic_prefix) if not m.subject.endswith(".schema")]
    # the frozen server may have stored the first copy too: one copy either way
    assert [m.value["after"]["id"] for m in got] == [1, 2]


@contextlib.contextmanager
def room_for_100_and_server_stopped(
    own_nats: services.NatsServer, topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[NatsSink]:
    """A sink with room for 100 messages in flight, change 1 acknowledged, then its
    server stopped (an ack timeout of 1s)."""
    monkeypatch.setattr(nats_sink, "MAX_IN_FLIGHT", 100)
    cfg = NatsConfig(nats_url=own_nats.url, nats_subject_prefix=topic_prefix, nats_ack_timeout=1.0)
    with opened(cfg) as sink:
        publish_one(sink, 1)
        assert sink.flush() == 1101
        own_nats.stop()
        yield sink


def test_a_server_away_too_long_while_writes_wait_is_unavailable(
    own_nats: services.NatsServer, topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with room_for_100_and_server_stopped(own_nats, topic_prefix, monkeypatch) as sink:
        with pytest.raises(SinkUnavailableError, match="unreachable for more than"):
            for i in range(2, 2000):  # room for 100 only
                sink.write(change(i))
        assert sink.acknowledged() is None  # started over for the replay
        own_nats.start()
        publish_one(sink, 2)  # the replay from 1101
        wait_for(lambda: sink.flush() == 1102, 30, "the replay's acknowledgement")
    got = [m for m in stored(own_nats.url, topic_prefix) if not m.subject.endswith(".schema")]
    assert [m.value["after"]["id"] for m in got][:2] == [1, 2]


def test_writes_wait_for_room_when_every_transaction_asks_for_acknowledgements(
    own_nats: services.NatsServer, topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Single-row transactions: the stream asks for acknowledgements after each commit,
    which hands the batch over before it fills; the room check must still run."""
    with room_for_100_and_server_stopped(own_nats, topic_prefix, monkeypatch) as sink:
        written = 1
        with pytest.raises(SinkUnavailableError, match="unreachable for more than"):
            for i in range(2, 2000):
                sink.write(change(i))
                written = i
                sink.checkpoint(1100 + i)
                sink.acknowledged()
        # the write that found no room waited, then raised: at most MAX_IN_FLIGHT + 1
        # messages were handed over unacknowledged (1,998 without the check)
        assert written <= 1 + 100 + 1, written
        own_nats.start()


# --- end to end through the CLI ----------------------------------------------------------


@pytest.mark.slow
def test_changes_on_two_tables_round_trip(
    db: Database, pg2sink_proc: Proc, nats_url: str, topic_prefix: str
) -> None:
    conn = db.connect()
    conn.execute("CREATE SCHEMA app")
    conn.execute("CREATE TABLE public.users (id int primary key, name text, seen timestamptz)")
    conn.execute("CREATE TABLE app.orders (id bigint primary key, total numeric)")
    p = start(pg2sink_proc, nats_url, topic_prefix, "--schema", "public", "--schema", "app")
    seen = datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
    with conn.transaction():
        conn.execute("INSERT INTO users VALUES (1, 'ada', %s)", (seen,))
        conn.execute("INSERT INTO app.orders VALUES (10, 3.14159265358979323846)")
    conn.execute("UPDATE users SET name = 'ada lovelace' WHERE id = 1")
    conn.execute("DELETE FROM app.orders WHERE id = 10")
    written = db.current_lsn()

    def changes() -> list[Stored]:
        got = stored(nats_url, topic_prefix)
        return [m for m in got if m.value["kind"] == "modification"]

    got = wait_for(lambda: len(changes()) == 4 and changes(), 30, "four changes")
    users, orders = f"{topic_prefix}.public.users", f"{topic_prefix}.app.orders"
    assert [(m.subject, m.value["operation"]) for m in got] == [
        (users, "INSERT"),
        (orders, "INSERT"),
        (users, "UPDATE"),
        (orders, "DELETE"),
    ]
    assert got[0].value["after"] == {"id": 1, "name": "ada", "seen": "2024-05-01T10:00:00.123456Z"}
    assert got[1].value["after"] == {"id": 10, "total": Decimal("3.14159265358979323846")}
    assert got[2].value["after"]["name"] == "ada lovelace"
    assert got[3].value["before"] == {"id": 10} and got[3].value["after"] is None
    assert got[0].value["xid"] == got[1].value["xid"]
    for m in got:
        v = m.value
        assert m.headers["Nats-Msg-Id"] == f"{v['lsn']}:{v['sequence']}:{m.subject}"
    schemas = [m for m in stored(nats_url, topic_prefix) if m.subject.endswith(".schema")]
    assert sorted(m.subject for m in schemas) == [f"{orders}.schema", f"{users}.schema"]
    # the slot passes the changes once JetStream holds them
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= written, 30, "the slot to pass them")
    assert p.stop() == 0
    assert "created JetStream stream" in p.stderr()


#: How long the outage test keeps the server stopped, in seconds (the issue's 30 s).
OUTAGE = 30.0


@pytest.mark.slow
def test_a_30s_server_outage_confirms_only_acknowledged_changes_and_loses_none(
    db: Database, pg2sink_proc: Proc, own_nats: services.NatsServer, topic_prefix: str
) -> None:
    """The test's own server stopped for 30 s while a 20-row transaction commits every
    second, then started again on the same port and store: the stream waits, logs once
    each way, and JetStream holds every change once and in order."""
    conn = db.connect()
    conn.execute("CREATE TABLE kv (id int primary key)")
    p = start(
        pg2sink_proc, own_nats.url, topic_prefix, "--nats-ack-timeout", "2s", "--log-level", "debug"
    )

    def ids() -> list[int]:
        got = stored(own_nats.url, topic_prefix)
        return [m.value["after"]["id"] for m in got if m.value["kind"] == "modification"]

    for i in range(1, 6):
        conn.execute("INSERT INTO kv VALUES (%s)", (i,))
    wait_for(lambda: ids() == [1, 2, 3, 4, 5], 30, "the first five")
    own_nats.stop()
    stopped = time.monotonic()
    conn.execute("INSERT INTO kv VALUES (6)")
    after_six = db.current_lsn()
    last = 6
    while time.monotonic() - stopped < OUTAGE:
        with conn.transaction():
            for i in range(last + 1, last + 21):
                conn.execute("INSERT INTO kv VALUES (%s)", (i,))
        last += 20
        time.sleep(1)
    confirmed = db.slot_confirmed_lsn()
    assert confirmed is not None and confirmed < after_six  # 6 was never acknowledged
    own_nats.start()
    for i in range(last + 1, last + 6):
        conn.execute("INSERT INTO kv VALUES (%s)", (i,))
    last += 5
    wait_for(lambda: len(ids()) >= last, 90, "every insert after the outage")
    written = db.current_lsn()
    # nothing lost, and the copies sent before, during and after the outage stored once
    assert ids() == list(range(1, last + 1))
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= written, 30, "the slot to pass them")
    err = p.stderr()
    # the stream waited (no session ended): one line when NATS went, one when it came back
    assert err.count("lost the connection to NATS") == 1
    assert err.count("reachable again") == 1 and "streaming stopped" not in err
    assert p.stop() == 0


@pytest.mark.slow
def test_a_30s_server_outage_shows_on_status_within_5s_each_way(
    db: Database, pg2sink_proc: Proc, own_nats: services.NatsServer, topic_prefix: str
) -> None:
    """The test's own server stopped for 30 s while a row is inserted every second:
    GET /status answers 500 (the sink's reason naming NATS) within 5 s of the stop and
    for the whole outage, with nothing confirmed; 200 again within 5 s of the server's
    return, and JetStream then holds every change once, in order."""
    conn = db.connect()
    conn.execute("CREATE TABLE kv (id int primary key)")
    p = start(pg2sink_proc, own_nats.url, topic_prefix, "--nats-ack-timeout", "2s")
    url = api_url(p)

    def ids() -> list[int]:
        got = stored(own_nats.url, topic_prefix)
        return [m.value["after"]["id"] for m in got if m.value["kind"] == "modification"]

    conn.execute("INSERT INTO kv VALUES (1)")
    wait_for(lambda: ids() == [1], 30, "the first row")
    assert status(url)[0] == 200
    own_nats.stop()
    stopped = time.monotonic()
    conn.execute("INSERT INTO kv VALUES (2)")
    after_two = db.current_lsn()
    wait_for(lambda: status(url)[0] == 500, 5, "/status 500 within 5 s of the stop")
    code, body = status(url)
    assert code == 500 and f"NATS at {own_nats.url} is unreachable" in body["problems"]["sink"]
    assert body["replication"] == "ok"
    last = 2
    while time.monotonic() - stopped < OUTAGE:
        last += 1
        conn.execute("INSERT INTO kv VALUES (%s)", (last,))
        time.sleep(1)
        assert status(url)[0] == 500
        confirmed = db.slot_confirmed_lsn()
        assert confirmed is not None and confirmed < after_two  # 2 was never acknowledged
    own_nats.start()
    wait_for(lambda: status(url)[0] == 200, 5, "/status 200 within 5 s of the return")
    assert status_without_slot(url) == (200, {"status": "ok", "replication": "ok", "sink": "ok"})
    wait_for(lambda: len(ids()) >= last, 60, "every insert after the outage")
    written = db.current_lsn()
    assert ids() == list(range(1, last + 1))  # nothing lost, each once, in order
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= written, 30, "the slot to pass them")
    assert p.stop() == 0


@pytest.mark.slow
def test_kill_9_and_restart_loses_nothing_and_keeps_each_key_in_order(
    db: Database, pg2sink_proc: Proc, nats_url: str, topic_prefix: str
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE kv (id int primary key, v int)")
    p = start(pg2sink_proc, nats_url, topic_prefix)
    conn.execute("INSERT INTO kv SELECT g, 0 FROM generate_series(1, 10) g")
    rounds = 2000
    # one transaction of 20,000 updates, then a few small ones
    conn.execute(f"DO $$ BEGIN FOR i IN 1..{rounds - 5} LOOP UPDATE kv SET v = i; END LOOP; END $$")
    for v in range(rounds - 4, rounds + 1):
        conn.execute("UPDATE kv SET v = %s", (v,))
    total = 10 * (rounds + 1)

    def changes() -> int:
        return subject_messages(nats_url, topic_prefix, f"{topic_prefix}.public.kv")

    wait_for(lambda: changes() >= 2000, 30, "some changes")
    p.kill()  # mid-stream: published, acknowledged, confirmed, each possibly not yet
    assert changes() < total
    p.start()
    p.wait_streaming()
    wait_for(lambda: changes() >= total, 60, "the rest")
    seen: dict[int, list[int]] = {}
    for m in stored(nats_url, topic_prefix):
        if m.value["kind"] == "modification":
            seen.setdefault(m.value["after"]["id"], []).append(m.value["after"]["v"])
    # every change of every key once (the replay's repeats dropped by Nats-Msg-Id), in order
    assert seen == {k: list(range(rounds + 1)) for k in range(1, 11)}
    assert p.stop() == 0


async def _subject_messages(url: str, stream: str, subject: str) -> int:
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        info = await nc.jetstream(timeout=5).stream_info(stream, subjects_filter=subject)
        return int((info.state.subjects or {}).get(subject, 0))
    finally:
        await nc.close()


def subject_messages(url: str, stream: str, subject: str) -> int:
    """How many messages of `subject` the stream holds."""
    return asyncio.run(_subject_messages(url, stream, subject))


@pytest.mark.slow
def test_secrets_stay_out_of_debug_logs(
    db: Database, pg2sink_proc: Proc, nats_url: str, topic_prefix: str
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    # a server without authentication ignores the credentials, which stay secrets
    url = nats_url.replace("nats://", "nats://me:Hunter2xyz@")
    p = start(pg2sink_proc, url, topic_prefix, "--log-level", "debug")
    conn.execute("INSERT INTO t VALUES (1)")
    wait_for(lambda: len(stored(nats_url, topic_prefix)) == 2, 30, "the insert")
    assert p.stop() == 0
    err = p.stderr()
    assert "connected to NATS at nats://127.0.0.1:" in err and "Hunter2xyz" not in err


# --- imports -------------------------------------------------------------------------------


def import_table(name: str, key: tuple[str, ...]) -> ImportTable:
    types = (
        PgType(oid=20, name="int8", namespace="pg_catalog", kind="b", category="N"),
        PgType(oid=25, name="text", namespace="pg_catalog", kind="b", category="S"),
    )
    columns = [
        RowColumn(n, codec_for(t, -1), n in key) for n, t in zip(("id", "v"), types, strict=True)
    ]
    row = avro_row_schema("public", name, columns)
    return ImportTable(Schema(T, 77, "public", name, row, primary_key=key), types, (-1, -1))


def test_imports_publish_rows_and_a_retried_partition_is_stored_once(
    nats_cfg: NatsConfig, nats_url: str, topic_prefix: str
) -> None:
    keyed, keyless = import_table("k", ("id",)), import_table("n", ())
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["1", "2", "3"]), pa.array(["a", None, "c"])], names=["c0", "c1"]
    )
    target = NatsImportTarget(nats_cfg)
    assert target.begin(keyed.schema) == target and target.problem() is None
    for _ in range(2):  # a partition retried after its executor died
        assert target.write_rows(keyed, iter([batch])) == 3
    target.begin(keyless.schema)
    for _ in range(2):
        assert target.write_rows(keyless, iter([batch])) == 3
    got = stored(nats_url, topic_prefix)
    k, n = f"{topic_prefix}.public.k", f"{topic_prefix}.public.n"
    # the Schema records once (by the driver), the keyed rows once (their key is their id),
    # the rows without a key twice: nothing tells two equal rows apart (at-least-once)
    assert [m.subject for m in got] == [f"{k}.schema", k, k, k, f"{n}.schema", *[n] * 6]
    assert [m.value["after"] for m in got[1:4]] == [
        {"id": 1, "v": "a"},
        {"id": 2, "v": None},
        {"id": 3, "v": "c"},
    ]
    assert {m.value["operation"] for m in got if m.value["kind"] == "modification"} == {"IMPORT"}
    assert got[1].headers["Nats-Msg-Id"] == f'import:77:{k}:{{"id":1}}'
    assert "Nats-Msg-Id" not in got[5].headers
    assert got[1].data + b"\n" == record_line(keyed.modification(0, {"id": 1, "v": "a"}))


# --- logins --------------------------------------------------------------------------------


class PasswordNats(services.NatsServer):
    """A nats-server that lets in user `me` with password PASSWORD only."""

    def command(self) -> list[str]:
        return [*super().command(), "--user", "me", "--pass", PASSWORD]


PASSWORD = "Hunter5xyz"


@pytest.fixture
def password_nats() -> Iterator[PasswordNats]:
    with own_server(PasswordNats, "nats") as server:
        yield server


def test_logins_by_user_and_password_and_a_refused_one(
    password_nats: PasswordNats, topic_prefix: str
) -> None:
    cfg = NatsConfig(
        nats_url=password_nats.url,
        nats_subject_prefix=topic_prefix,
        nats_user="me",
        nats_password=PASSWORD,
    )
    with opened(cfg) as sink:  # connected, and the stream created
        sink.write(table_schema("t"))
        sink.checkpoint(20)
        assert sink.flush() == 20
    wrong = f"nats://me:{PASSWORD}-not@{password_nats.url.removeprefix('nats://')}"
    res = run_cli("--sink", "nats", "--nats-url", wrong, env=NO_SERVER)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"cannot connect to NATS at {password_nats.url}: " in res.stderr
    assert "authorization violation" in res.stderr.lower()
    assert PASSWORD not in res.stderr


def test_a_message_over_max_payload_names_the_limit(
    nats_cfg: NatsConfig, nats_url: str, topic_prefix: str
) -> None:
    with opened(nats_cfg) as sink:
        sink.write(table_schema("t"))
        sink.checkpoint(100)
        big = Modification(T, 0, 1001, 7, Operation.INSERT, "public", "t", None, {"v": "x" * 2**21})
        sink.write(big)
        sink.write(change(2))  # after the failure: never confirmed
        sink.checkpoint(1200)
        with pytest.raises(SinkError, match=r"larger than the NATS server's max_payload") as err:
            wait_for(lambda: sink.flush() == 1200, 10, "the failure")
        # the JSON line of the change, and its Nats-Msg-Id header block
        header = msg_id_header(f"1001:0:{topic_prefix}.public.t".encode())
        size = 2_097_333 + len(header)
        assert f"({size:,} bytes with its headers)" in str(err.value)
        assert "max_payload (1,048,576)" in str(err.value)
    # the Schema record only: neither the large change nor the one after it
    assert [m.subject for m in stored(nats_url, topic_prefix)] == [
        f"{topic_prefix}.public.t.schema"
    ]


@pytest.mark.slow
def test_an_import_through_spark_publishes_every_row_once(
    db: Database, nats_cfg: NatsConfig, nats_url: str, topic_prefix: str
) -> None:
    conn = db.connect()
    rows = 5_000
    fill_table(conn, rows)
    job = prepare_job(db, "mix", 4)
    expected = expected_rows(conn)
    conn.execute("UPDATE mix SET name = 'after the snapshot' WHERE id <= 100")
    target = NatsImportTarget(nats_cfg)
    partitions = tuple(range(len(job.plan.predicates)))
    task = ImportTask(job.id, job.plan, partitions, job.snapshot.name, db.dsn, INTERNAL, target)
    runner = SparkRunner("local[2]")
    try:
        assert runner.run(task) == rows
    finally:
        runner.close()
        job.snapshot.close()
    assert all(p.done for p in jobs.load_partitions(conn, INTERNAL, job.id))
    got = stored(nats_url, topic_prefix)
    subject = f"{topic_prefix}.public.mix"
    # the driver's Schema record once, then one message per row, values as in the snapshot
    assert [m.subject for m in got[:1]] == [f"{subject}.schema"]
    assert {m.subject for m in got[1:]} == {subject}
    check_rows([m.value for m in got[1:]], expected)
