"""--format psql-streamer and --format debezium on the Kafka sink, end to end through the
CLI: what their consumers read from the topics (formats/, docs/formats.md)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from psycopg.conninfo import conninfo_to_dict

from pg2sink import __version__
from pg2sink.formats.config import Formatting
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.imports import KafkaImportTarget
from tests.conftest import Database, KafkaStack, wait_for
from tests.sinks.kafka.test_kafka import Reader, reader, start  # noqa: F401 (reader: a fixture)
from tests.sinks.null.test_null import import_table
from tests.support import Proc


@pytest.mark.slow
def test_psql_streamer_events_on_the_topics(
    db: Database,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    reader: Callable[..., Reader],  # noqa: F811 (test_kafka's fixture, imported)
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text, born date, score float8)")
    # avro=True only adds --schema-registry-url (avro=False would add --format json)
    p = start(pg2sink_proc, kafka_stack, topic_prefix, "--format", "psql-streamer")
    conn.execute("INSERT INTO users VALUES (1, 'ada', '1815-12-10', 0.5)")
    conn.execute("UPDATE users SET name = 'ada lovelace' WHERE id = 1")
    conn.execute("DELETE FROM users WHERE id = 1")
    written = db.current_lsn()
    got = reader(f"{topic_prefix}.public.users", avro=False).read(3)
    events = [json.loads(m.raw_value or b"") for m in got]
    # psql-streamer's Event: json.Marshal of its untagged fields, in declaration order
    keys = ["Host", "Database", "Table", "Action", "WALPosition", "Timestamp", "UUID", "Columns"]
    assert all(list(e) == keys for e in events)
    dsn = conninfo_to_dict(db.dsn)  # the source's host and database, never its password
    assert {(e["Host"], e["Database"], e["Table"]) for e in events} == {
        (dsn["host"], dsn["dbname"], "users")
    }
    assert [e["Action"] for e in events] == ["insert", "update", "delete"]
    assert events[0]["Columns"] == {
        "born": "1815-12-10T00:00:00Z",  # pgx's time.Time of a date
        "id": 1,
        "name": "ada",
        "score": 0.5,
    }
    assert events[1]["Columns"]["name"] == "ada lovelace"
    # a DELETE: every column, the key's set and the rest null, as psql-streamer decoded
    # pgoutput's old-key tuple
    assert events[2]["Columns"] == {"born": None, "id": 1, "name": None, "score": None}
    assert events[0]["WALPosition"] < events[1]["WALPosition"] < events[2]["WALPosition"]
    assert [m.raw_key for m in got] == [b'{"id":1}'] * 3
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= written, 30, "the slot to pass them")
    assert p.stop() == 0


@pytest.mark.slow
def test_debezium_envelopes_keyed_by_the_key_struct(
    db: Database,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    reader: Callable[..., Reader],  # noqa: F811 (test_kafka's fixture, imported)
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE items (id int PRIMARY KEY, price numeric(8,2), at timestamp)")
    p = start(
        pg2sink_proc,
        kafka_stack,
        topic_prefix,
        "--format",
        "debezium",
        "--debezium-schemas",
        "--tombstones",
    )
    conn.execute("INSERT INTO items VALUES (7, 1.50, '2024-05-01 10:00:00.25')")
    conn.execute("DELETE FROM items")
    got = reader(f"{topic_prefix}.public.items", avro=False).read(3)
    insert, delete, tombstone = got
    key = json.loads(insert.raw_key or b"")
    assert key["payload"] == {"id": 7}
    assert key["schema"]["name"] == f"{topic_prefix}.public.items.Key"
    value = json.loads(insert.raw_value or b"")
    assert value["schema"]["name"] == f"{topic_prefix}.public.items.Envelope"
    payload = value["payload"]
    assert payload["op"] == "c" and payload["before"] is None
    # 1.50 at scale 2: the unscaled 150 = 0x0096, base64 "AJY="; a timestamp(6) in
    # MicroTimestamp: microseconds since the epoch
    assert payload["after"] == {"id": 7, "price": "AJY=", "at": 1714557600250000}
    source = payload["source"]
    assert source["connector"] == "postgresql" and source["name"] == topic_prefix
    assert source["version"] == f"pg2sink-{__version__}"
    assert (source["db"], source["schema"], source["table"]) == (
        conninfo_to_dict(db.dsn)["dbname"],
        "public",
        "items",
    )
    assert source["snapshot"] == "false" and isinstance(source["txId"], int)
    deleted = json.loads(delete.raw_value or b"")["payload"]
    assert deleted["op"] == "d" and deleted["before"] == {"id": 7, "price": None, "at": None}
    assert tombstone.raw_key == insert.raw_key and tombstone.raw_value is None
    assert p.stop() == 0


def test_imported_rows_are_debezium_snapshot_reads(
    kafka_stack: KafkaStack,
    topic_prefix: str,
    reader: Callable[..., Reader],  # noqa: F811 (test_kafka's fixture, imported)
) -> None:
    """An import through the Kafka sink's import target: op r, source.snapshot "true"."""
    table = import_table()
    cfg = KafkaConfig(
        bootstrap_servers=kafka_stack.bootstrap_servers,
        topic_prefix=topic_prefix,
        format="debezium",
        formatting=Formatting(database="app"),
    )
    target = KafkaImportTarget(cfg).begin(table.schema)
    batch = pa.RecordBatch.from_arrays([pa.array(["1", "2"]), pa.array(["a", None])], ["c0", "c1"])
    assert target.write_rows(table, iter([batch])) == 2
    got = reader(f"{topic_prefix}.public.t", avro=False).read(2)
    events = sorted((json.loads(m.raw_value or b"") for m in got), key=lambda e: e["after"]["id"])
    assert [e["op"] for e in events] == ["r", "r"]
    assert [e["after"] for e in events] == [{"id": 1, "v": "a"}, {"id": 2, "v": None}]
    assert {(e["source"]["snapshot"], e["source"]["db"]) for e in events} == {("true", "app")}
    assert sorted(m.raw_key or b"" for m in got) == [b'{"id":1}', b'{"id":2}']
