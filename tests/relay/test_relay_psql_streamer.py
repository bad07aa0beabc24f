"""`pg2sink relay` reading psql-streamer's events (docs/relay.md, "psql-streamer's
topics"): a real pg2sink streams a table to Kafka with --format psql-streamer (the bytes
of psql-streamer's Kafka sink, tests/formats/test_seed_formats.py), a message that is no
event lands in the middle of the topic, and the relay writes the events into DuckDB:
its latest-state view equals the table, the bad message is in the dead-letter topic
with headers naming where it was, and the relay's HTTP API counted both. Without
--relay-dead-letter-topic the same message stops the relay with one line naming its
topic, partition and offset, and no offset past it is committed.

No key change in the workload: psql-streamer's update event carries the new row only,
so a key change leaves the old key's row behind (docs/relay.md says so).
"""

from __future__ import annotations

import re
import urllib.request
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest

from tests.conftest import Database, KafkaStack, Pg2Sink, pg2sink_for, wait_for
from tests.relay.test_relay import caught_up, lag, relay_proc, wait_relaying
from tests.sinks.kafka.kafka_support import create_topic, message_headers
from tests.sinks.warehouse_support import duck_query
from tests.support import FAST

pytestmark = pytest.mark.slow

TABLE = "ps_users"


def writes(conn: Any, base: int) -> None:
    """Inserts, updates (one transaction of several) and deletes of TABLE."""
    conn.execute(
        f"INSERT INTO {TABLE} SELECT i, 'n' || i, i * 1.25, i %% 2 = 0 "
        "FROM generate_series(%s::int, %s::int) i",
        (base, base + 19),
    )
    with conn.transaction():
        conn.execute(f"UPDATE {TABLE} SET name = name || '!' WHERE id % 3 = 0")
        conn.execute(f"UPDATE {TABLE} SET price = NULL, active = NOT active WHERE id = %s", (base,))
    conn.execute(f"DELETE FROM {TABLE} WHERE id IN (%s, %s)", (base + 2, base + 4))


def http_url(relay: Pg2Sink) -> str:
    found = re.search(r"HTTP API on (http://\S+)", relay.stderr())
    assert found, relay.stderr()
    return found.group(1)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def dead_letters(stack: KafkaStack, topic: str) -> list[Any]:
    consumer = ck.Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "x"})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        out = []
        while (msg := consumer.poll(5)) is not None:
            assert msg.error() is None, msg.error()
            out.append(msg)
        return out
    finally:
        consumer.close()


def test_psql_streamer_events_into_duckdb_with_a_dead_letter(
    db: Database, kafka_stack: KafkaStack, tmp_path: Path
) -> None:
    prefix, group = f"ps{uuid.uuid4().hex[:8]}", f"relay-{uuid.uuid4().hex[:8]}"
    topic, dead = f"{prefix}.public.{TABLE}", f"{prefix}.dead"
    create_topic(kafka_stack.bootstrap_servers, topic, 1)
    create_topic(kafka_stack.bootstrap_servers, dead, 1)
    conn = db.connect()
    conn.execute(
        f"CREATE TABLE {TABLE} (id int PRIMARY KEY, name text, price numeric(10,2), active bool)"
    )
    stream = pg2sink_for(
        db, tmp_path, "--sink", "kafka", "--kafka-bootstrap-servers",
        kafka_stack.bootstrap_servers, "--topic-prefix", prefix, "--format", "psql-streamer",
        *FAST,
    ).start()  # fmt: skip
    path = tmp_path / "relayed.duckdb"
    relay = relay_proc(
        kafka_stack, tmp_path, "--topics", rf"{prefix}\.public\..*", "--group-id", group,
        "--relay-primary-key", f"{TABLE}=id", "--relay-dead-letter-topic", dead,
        "--sink", "duckdb", "--duckdb-path", str(path),
    )  # fmt: skip
    try:
        stream.wait_streaming()
        writes(conn, 1)
        caught_up(db)
        producer = ck.Producer({"bootstrap.servers": kafka_stack.bootstrap_servers})
        producer.produce(topic, b"not an event", b"k", headers=[("h", b"v")])
        assert producer.flush(10) == 0
        writes(conn, 100)
        caught_up(db)
        relay.start()
        wait_relaying(relay)
        wait_for(lambda: lag(kafka_stack, group, [topic]) == 0, 60, "the relay to commit")
        url = http_url(relay)
        status, body = get(f"{url}/status")
        assert status == 200, body
        _, metrics = get(f"{url}/metrics")
        text = metrics.decode()
        assert 'pg2sink_errors_total{kind="dead_letter"} 1.0' in text, text
        assert re.search(rf'pg2sink_changes_total{{.*table="{TABLE}".*}} [1-9]', text), text
        assert relay.stop() == 0, relay.stderr()
    finally:
        for p in (stream, relay):
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)
    err = relay.stderr()
    assert f"the message of topic '{topic}' [0] at offset " in err
    # the events' numbers are unconstrained numeric: DuckDB keeps their text, exactly
    rows = duck_query(path, f"SELECT id, name, price, active FROM public_{TABLE}")
    got = sorted((int(r[0]), r[1], None if r[2] is None else Decimal(r[2]), r[3]) for r in rows)
    want = conn.execute(f"SELECT id, name, price, active FROM {TABLE} ORDER BY id").fetchall()
    assert got == want
    (letter,) = dead_letters(kafka_stack, dead)
    assert letter.value() == b"not an event" and letter.key() == b"k"
    headers = message_headers(letter.headers())
    assert headers["h"] == "v"
    assert headers["pg2sink.dead_letter.topic"] == topic
    assert headers["pg2sink.dead_letter.partition"] == "0"
    assert int(headers["pg2sink.dead_letter.offset"]) > 0
    assert "neither Avro nor JSON" in headers["pg2sink.dead_letter.error"]

    # without a dead-letter topic: the relay stops at the message, its offset uncommitted
    other = f"relay-{uuid.uuid4().hex[:8]}"
    stopped = relay_proc(
        kafka_stack, tmp_path, "--topics", rf"{prefix}\.public\..*", "--group-id", other,
        "--sink", "file", "--file-path", str(tmp_path / "stopped.jsonl"),
    ).start()  # fmt: skip
    assert stopped.proc is not None
    assert stopped.proc.wait(60) != 0
    lines = [line for line in stopped.stderr().splitlines() if "error" in line]
    offset = headers["pg2sink.dead_letter.offset"]
    assert lines == [
        f"pg2sink: error: cannot read the message of topic '{topic}' [0] at offset {offset}: "
        "a message is neither Avro nor JSON: invalid literal, expected 'null': line 1 column 1 "
        "(char 0) (--relay-dead-letter-topic sets such messages aside instead of stopping)"
    ], stopped.stderr()
    assert lag(kafka_stack, other, [topic]) > 0
