"""--format pg-kinesis on the Kinesis sink, end to end through the CLI: the records a
pg_kinesis consumer reads from the stream (formats/pg_kinesis.py, docs/formats.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from pg2sink.sinks.kinesis.config import KinesisConfig
from pg2sink.sinks.kinesis.imports import KinesisImportTarget
from tests.conftest import Database, wait_for
from tests.sinks.kinesis.kinesis_support import create_stream, kinesis_client, read_stream, start
from tests.sinks.kinesis.test_kinesis import aws_env  # noqa: F401 (a fixture)
from tests.sinks.null.test_null import import_table
from tests.support import Proc


@pytest.fixture
def one_shard(kinesis_endpoint: str, topic_prefix: str) -> Iterator[str]:
    """A new 1-shard stream (one order for every record), deleted afterwards."""
    client = kinesis_client(kinesis_endpoint)
    create_stream(client, topic_prefix, 1)
    yield topic_prefix
    client.delete_stream(StreamName=topic_prefix)


@pytest.mark.slow
def test_pg_kinesis_records_on_the_stream(
    db: Database, pg2sink_proc: Proc, kinesis_endpoint: str, one_shard: str
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text, total numeric(10,2))")
    conn.execute("ALTER TABLE users REPLICA IDENTITY FULL")
    p = start(pg2sink_proc, kinesis_endpoint, one_shard, "--format", "pg-kinesis")
    conn.execute("INSERT INTO users VALUES (1, 'ada', 12.50)")
    conn.execute("UPDATE users SET name = 'ada lovelace' WHERE id = 1")
    conn.execute("DELETE FROM users WHERE id = 1")
    written = db.current_lsn()
    client = kinesis_client(kinesis_endpoint)
    got = wait_for(
        lambda: (r := read_stream(client, one_shard)) and len(r) >= 3 and r, 30, "three records"
    )
    assert len(got) == 3  # changes only: no Schema record in a seed tool's stream
    records = [json.loads(data) for _, _, data in got]
    assert [k for _, k, _ in got] == ['{"id":1}'] * 3  # pg2sink's partition keys
    # marshalWALToJSON's struct order; lsn as pgx.FormatLSN writes it
    assert all(list(r) == ["time", "lsn", "table", "operation", "columns"] for r in records)
    assert all(r["lsn"].count("/") == 1 and r["table"] == "public.users" for r in records)
    assert [r["operation"] for r in records] == ["INSERT", "UPDATE", "DELETE"]
    assert records[0]["columns"] == {
        "id": {"new": {"q": "false", "t": "integer", "v": "1"}},
        "name": {"new": {"q": "true", "t": "text", "v": "ada"}},
        "total": {"new": {"q": "false", "t": "numeric", "v": "12.50"}},
    }
    # REPLICA IDENTITY FULL: "old" beside "new" where the value changed
    assert records[1]["columns"]["name"] == {
        "new": {"q": "true", "t": "text", "v": "ada lovelace"},
        "old": {"q": "true", "t": "text", "v": "ada"},
    }
    assert "old" not in records[1]["columns"]["total"]
    assert records[2]["columns"]["id"] == {"old": {"q": "false", "t": "integer", "v": "1"}}
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= written, 30, "the slot to pass them")
    assert p.stop() == 0


def test_imported_rows_in_a_seed_format_without_the_schema_record(
    aws_env: None,  # noqa: F811 (test_kinesis's fixture, imported)
    kinesis_endpoint: str,
    one_shard: str,
) -> None:
    """The import target puts only the rows, as INSERTs of wal-listener's shape."""
    table = import_table()
    cfg = KinesisConfig(one_shard, kinesis_endpoint=kinesis_endpoint, format="wal-listener")
    target = KinesisImportTarget(cfg).begin(table.schema)
    batch = pa.RecordBatch.from_arrays([pa.array(["1", "2"]), pa.array(["a", None])], ["c0", "c1"])
    assert target.write_rows(table, iter([batch])) == 2
    got = read_stream(kinesis_client(kinesis_endpoint), one_shard)
    events = [json.loads(data) for _, _, data in got]
    assert [(e["action"], e["data"]) for e in events] == [
        ("INSERT", {"id": "1", "v": "a"}),  # int8: a string in wal-listener's data
        ("INSERT", {"id": "2", "v": None}),
    ]
    assert [k for _, k, _ in got] == ['{"id":1}', '{"id":2}']
