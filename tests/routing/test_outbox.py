"""--outbox end to end through Kafka, NATS and Kinesis: pg2sink run as a process on a real
PostgreSQL and a real broker (nats-server, kinesalite), the messages read back raw.

Each INSERT into an outbox table is one message on the topic its row names (on NATS:
the subject under the prefix; on Kinesis: the stream), its value the
payload column's bytes exactly and its key the key column's text; the application's
DELETE of the row in the same transaction, and later UPDATEs and DELETEs, send nothing;
the outbox table itself gets no topic of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import confluent_kafka as ck
import orjson
from botocore.exceptions import ClientError

from tests.conftest import Database, KafkaStack, Pg2Sink, run_cli
from tests.imports.support import wait_confirmed
from tests.sinks.kafka.test_kafka import Reader, kafka_args, reader, start
from tests.sinks.kinesis.kinesis_support import (
    AWS_ENV,
    create_stream,
    kinesis_args,
    kinesis_client,
    read_stream,
)
from tests.sinks.nats.nats_support import delete_stream, stored
from tests.support import FAST

__all__ = ["reader"]  # the fixture, imported for these tests


def test_outbox_inserts_are_messages_on_the_topic_they_name(
    db: Database,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    pg2sink_proc: Callable[..., object],
    reader: Callable[..., Reader],
) -> None:
    conn = db.connect()
    for table, payload in [("events", "jsonb"), ("blobs", "bytea")]:
        conn.execute(
            f"CREATE TABLE {table} (id bigserial PRIMARY KEY, topic text NOT NULL,"
            f" payload {payload}, aggregate_id text, headers jsonb)"
        )
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int)")
    placed, files = f"{topic_prefix}-orders", f"{topic_prefix}-files"
    p = start(
        pg2sink_proc,  # type: ignore[arg-type]
        kafka_stack,
        topic_prefix,
        "--outbox",
        "public.events",
        "--outbox",
        "blobs",
        "--outbox-key-column",
        "aggregate_id",
        "--outbox-headers-column",
        "headers",
    )
    event = "INSERT INTO events (topic, payload, aggregate_id) VALUES (%s, %s, %s)"
    with conn.transaction():  # the domain change and its event, the outbox cleaned at once
        conn.execute("INSERT INTO orders VALUES (1, 10)")
        conn.execute(event, (placed, '{"order": 1, "total": 10}', "order-1"))
        conn.execute("DELETE FROM events")
    conn.execute(
        "INSERT INTO blobs (topic, payload) VALUES (%s, %s)", (files, b"\x00\x01 raw \x7f")
    )
    conn.execute(event, (placed, '{"order": 2}', "order-2"))
    conn.execute("UPDATE events SET payload = '{}'")
    conn.execute("DELETE FROM events")
    conn.execute("TRUNCATE blobs")
    conn.execute(
        "INSERT INTO events (topic, payload, headers) VALUES (%s, '{\"order\": 3}', %s)",
        (placed, '{"type": "OrderPlaced", "version": 2, "none": null}'),
    )

    consumer = reader(placed, files, avro=False)
    consumer.read(4)
    got = consumer.read_for(2.0)  # and nothing more comes
    assert p.stop() == 0
    by_topic = {t: [(m.raw_key, m.raw_value) for m in got if m.topic == t] for t in (placed, files)}
    # jsonb: PostgreSQL's text of the value, exactly
    assert by_topic[placed] == [
        (b"order-1", b'{"order": 1, "total": 10}'),
        (b"order-2", b'{"order": 2}'),
        (None, b'{"order": 3}'),
    ]
    assert by_topic[files] == [(None, b"\x00\x01 raw \x7f")]  # bytea: the bytes
    assert all(int(m.headers["lsn"]) > 0 for m in got)
    # --outbox-headers-column: the object's members (a string as is, others as JSON)
    assert [sorted(m.headers) for m in got if m.topic == placed] == [
        ["lsn"],
        ["lsn"],
        ["lsn", "none", "type", "version"],
    ]
    last = [m for m in got if m.topic == placed][-1]
    assert last.headers["type"] == "OrderPlaced" and last.headers["version"] == "2"
    topics = ck.admin.AdminClient({"bootstrap.servers": kafka_stack.bootstrap_servers})
    names = set(topics.list_topics(timeout=10).topics)
    assert f"{topic_prefix}.public.orders" in names  # the other tables stream as ever
    assert not any(
        n.startswith((f"{topic_prefix}.public.events", f"{topic_prefix}.public.blobs"))
        for n in names
    )


def test_outbox_needs_kafka_nats_or_kinesis(db: Database, tmp_path: Path) -> None:
    done = run_cli(
        "stream", "--source", db.dsn, "--file-path", str(tmp_path / "o"), "--outbox", "events"
    )
    assert done.returncode == 2
    assert "--outbox publishes to Kafka, NATS and Kinesis only" in done.stderr
    nats = ("--sink", "nats", "--nats-url", "nats://127.0.0.1:1", "--outbox", "events")
    done = run_cli("stream", "--source", db.dsn, *nats, "--outbox-headers-column", "h")
    assert done.returncode == 2
    assert "--outbox-headers-column: only Kafka messages have headers here" in done.stderr
    assert db.slot_confirmed_lsn() is None  # refused before anything was made


def test_an_outbox_without_its_columns_is_refused_at_start(
    db: Database,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    pg2sink_proc: Callable[..., Pg2Sink],
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE events (id bigserial PRIMARY KEY, subject text, body json)")
    p = pg2sink_proc(*kafka_args(kafka_stack, topic_prefix, "--outbox", "events")).start()
    assert p.proc is not None and p.proc.wait(30) == 2  # at start
    assert (
        "--outbox public.events: no column 'topic' (--outbox-topic-column); its columns: "
        "id, subject, body"
    ) in p.stderr()


def test_outbox_inserts_are_messages_on_nats_subjects(
    db: Database, nats_url: str, topic_prefix: str, pg2sink_proc: Callable[..., Pg2Sink]
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE events (id bigserial PRIMARY KEY, topic text, payload text)")
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    p = pg2sink_proc(
        "--sink", "nats", "--nats-url", nats_url, "--nats-subject-prefix", topic_prefix,
        *FAST, "--outbox", "events",
    ).start()  # fmt: skip
    p.wait_streaming()
    try:
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            conn.execute("INSERT INTO events (topic, payload) VALUES ('orders.placed', 'one')")
            conn.execute("DELETE FROM events")
        conn.execute("INSERT INTO events (topic, payload) VALUES ('orders.placed', 'two')")
        conn.execute("UPDATE events SET payload = 'three'")
        wait_confirmed(db, p)
        assert p.stop() == 0
        got = [(m.subject, m.data) for m in stored(nats_url, topic_prefix)]
    finally:
        asyncio.run(delete_stream(nats_url, topic_prefix))
    placed = f"{topic_prefix}.orders.placed"
    # the orders change as ever (its Schema record, then the change), the outbox's inserts
    assert [(s, d) for s, d in got if s == placed] == [(placed, b"one"), (placed, b"two")]
    assert f"{topic_prefix}.public.orders" in {s for s, _ in got}
    assert not any(".events" in s for s, _ in got)  # no Schema record, no change of it


def test_outbox_inserts_are_records_on_the_kinesis_streams_they_name(
    db: Database, kinesis_endpoint: str, topic_prefix: str, pg2sink_proc: Callable[..., Pg2Sink]
) -> None:
    client = kinesis_client(kinesis_endpoint)
    own, placed, missing = topic_prefix, f"{topic_prefix}-placed", f"{topic_prefix}-missing"
    create_stream(client, own, 1)
    create_stream(client, placed, 2)
    conn = db.connect()
    conn.execute(
        "CREATE TABLE events (id bigserial PRIMARY KEY, topic text, payload bytea, agg text)"
    )
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    args = kinesis_args(kinesis_endpoint, own, "--outbox", "events", "--outbox-key-column", "agg")
    p = pg2sink_proc(*args, env=dict(AWS_ENV)).start()
    p.wait_streaming()
    event = "INSERT INTO events (topic, payload, agg) VALUES (%s, %s, %s)"
    try:
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            conn.execute(event, (placed, b"\x00one", "order-1"))
            conn.execute("DELETE FROM events")
        conn.execute(event, (placed, b"two", None))
        conn.execute(event, (own, b"three", "order-1"))  # the sink's own stream
        conn.execute("UPDATE events SET payload = 'four'")
        wait_confirmed(db, p)
        # a stream that does not exist stops the stream with one line, unconfirmed: once
        # it exists, a restart sends the message
        conn.execute(event, (missing, b"five", None))
        assert p.proc is not None and p.proc.wait(30) == 2
        assert f"the outbox names Kinesis stream {missing!r}, which does not exist" in p.stderr()
        create_stream(client, missing, 1)
        again = pg2sink_proc(*args, env=dict(AWS_ENV)).start()
        again.wait_streaming()
        wait_confirmed(db, again)
        assert again.stop() == 0
        got = {s: [(k, d) for _, k, d in read_stream(client, s)] for s in (own, placed, missing)}
    finally:
        for name in (own, placed, missing):
            with contextlib.suppress(ClientError):
                client.delete_stream(StreamName=name)
    assert got[missing] == [(missing, b"five")]
    # the payload's bytes; the key column's text, else the stream's name
    assert sorted(got[placed]) == sorted([(placed, b"two"), ("order-1", b"\x00one")])
    orders = [d for k, d in got[own] if k in ("public.orders", '{"id":1}')]
    assert [orjson.loads(d)["kind"] for d in orders] == ["schema", "modification"]
    assert [(k, d) for k, d in got[own] if k == "order-1"] == [("order-1", b"three")]
    assert len(got[own]) == 3  # nothing of the outbox table itself
