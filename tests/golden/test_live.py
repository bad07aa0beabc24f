"""The golden workload live: a real PostgreSQL, pg2sink run as users run it, real Kafka.

test_replay.py compares bytes made from captured frames; this compares what pg2sink
writes while the workload runs now against the same golden files, after normalizing the
fields that differ between runs (normalize.py: LSNs, xids, commit times, schema ids,
the topic prefix). It catches what a replay cannot: a change in what the server is asked
for (replication options, session settings) or in the catalog questions.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from tests.conftest import Database, KafkaStack, pg2sink_for, wait_for
from tests.golden import workload
from tests.golden.broker import read_topics
from tests.golden.files import DATA, KafkaMessage, parse_kafka_lines, schemas_by_id
from tests.golden.normalize import json_lines, kafka_messages
from tests.golden.pipeline import STREAMED, TOPIC_PREFIX
from tests.sinks.kafka.test_kafka import kafka_args, registry_get
from tests.support import FAST

#: how long the workload's records may take to arrive, in seconds
ARRIVAL_WAIT = 60.0
#: the workload's table that the capture did not publish
EXCLUDE = ("--exclude-table", workload.UNPUBLISHED)


def _all_arrived(stack: KafkaStack, prefix: str, count: int) -> list[KafkaMessage]:
    """Every message under `prefix` once there are `count` of them (read from the broker's
    topics, so an extra topic is seen too), else nothing."""
    messages = read_topics(stack, prefix)
    return messages if len(messages) >= count else []


def assert_same(got: Sequence[Any], golden: Sequence[Any], what: str) -> None:
    """Record by record, naming the first that differs (a whole-list diff is unreadable)."""
    for i, (a, b) in enumerate(zip(got, golden, strict=False)):
        assert a == b, f"{what}: record {i} differs\n  live:   {a!r:.2000}\n  golden: {b!r:.2000}"
    assert len(got) == len(golden), f"{what}: {len(got)} records live, {len(golden)} golden"


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_file_sink_live_matches_the_golden_file(
    db: Database, tmp_path: Path, streamed: bool
) -> None:
    name = STREAMED["file.jsonl"] if streamed else "file.jsonl"
    golden = (DATA / name).read_bytes()
    out = tmp_path / "out.jsonl"
    conn = db.connect()
    workload.create_schema(conn)
    extra = ["--file-path", str(out), "--messages", *FAST]
    if streamed:
        # the walsender takes it from the database's settings: the first transaction is
        # streamed while it runs, as in the capture
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = {}").format(
                sql.Identifier(db.name), sql.Literal(workload.STREAMED_SIZE)
            )
        )
        extra += ["--streaming", "--spill-dir", str(tmp_path / "spill")]
    p = pg2sink_for(db, tmp_path, *extra, *EXCLUDE).start()
    try:
        p.wait_streaming()
        workload.run_changes(conn)
        lines = golden.count(b"\n")
        wait_for(
            lambda: out.exists() and out.read_bytes().count(b"\n") >= lines,
            ARRIVAL_WAIT,
            f"pg2sink to write {lines} lines",
        )
    finally:
        p.stop()
    assert_same(json_lines(out.read_bytes()), json_lines(golden), "file sink")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_kafka_sink_live_matches_the_golden_file(
    db: Database, tmp_path: Path, kafka_stack: KafkaStack, topic_prefix: str, fmt: str
) -> None:
    avro = fmt == "avro"
    golden = parse_kafka_lines((DATA / f"kafka_{fmt}.jsonl").read_bytes(), text=not avro)
    extra = ["--messages", "--tombstones"] if avro else ["--messages"]
    conn = db.connect()
    workload.create_schema(conn)
    args = kafka_args(kafka_stack, topic_prefix, *extra, *EXCLUDE, avro=avro)
    p = pg2sink_for(db, tmp_path, *args)
    try:
        p.start().wait_streaming()
        workload.run_changes(conn)
        live = wait_for(
            lambda: _all_arrived(kafka_stack, topic_prefix, len(golden)),
            ARRIVAL_WAIT,
            f"{len(golden)} Kafka messages",
        )
    finally:
        p.stop()
    golden_schemas = schemas_by_id((DATA / "kafka_avro.registry.json").read_bytes())

    @functools.cache
    def live_schema(schema_id: int) -> Any:
        return json.loads(registry_get(kafka_stack, f"schemas/ids/{schema_id}")["schema"])

    got = kafka_messages(live, topic_prefix, live_schema if avro else None)
    want = kafka_messages(golden, TOPIC_PREFIX, golden_schemas.__getitem__ if avro else None)
    assert sorted(got) == sorted(want)
    for topic in want:
        assert_same(got[topic], want[topic], f"topic {topic}")
