"""SparkRunner to the real Kafka broker and schema registry (Avro), read back as users do.

200k rows of the bench column mix are imported through an exported snapshot; every
message is read back with confluent-kafka's AvroDeserializer through the registry:
one IMPORT message per row, values equal to the database's, keys = the primary key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pg2sink.imports import jobs
from pg2sink.imports.spark import ImportTask, SparkRunner
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.imports import KafkaImportTarget
from tests.conftest import Database, KafkaStack
from tests.imports.test_spark import INTERNAL, expected_rows, fill_table, prepare_job
from tests.sinks.kafka.test_kafka import Reader

pytestmark = pytest.mark.slow

ROWS = 200_000


def test_import_to_kafka_avro(
    db: Database, kafka_stack: KafkaStack, topic_prefix: str, tmp_path: Path
) -> None:
    conn = db.connect()
    fill_table(conn, ROWS)
    job = prepare_job(db, "mix", 4)
    expected = expected_rows(conn)
    conn.execute("UPDATE mix SET name = 'after the snapshot' WHERE id <= 100")
    cfg = KafkaConfig(
        kafka_stack.bootstrap_servers,
        schema_registry_url=kafka_stack.registry_url,
        topic_prefix=topic_prefix,
        schema_topic=f"{topic_prefix}.schemas",
    )
    task = ImportTask(
        job.id,
        job.plan,
        tuple(range(len(job.plan.predicates))),
        job.snapshot.name,
        db.dsn,
        INTERNAL,
        KafkaImportTarget(cfg),
    )
    runner = SparkRunner("local[2]")
    try:
        assert runner.run(task) == ROWS
    finally:
        runner.close()
        job.snapshot.close()
    assert all(p.done for p in jobs.load_partitions(conn, INTERNAL, job.id))

    topic = f"{topic_prefix}.public.mix"
    reader = Reader(kafka_stack.bootstrap_servers, [topic], kafka_stack.registry_url)
    try:
        messages = reader.read(ROWS, timeout=180)
        # nothing beyond one message per row arrives
        assert len(reader.read_for(2.0)) == ROWS
    finally:
        reader.close()
    seen = set()
    for m in messages:
        value = m.value
        assert value["operation"] == "IMPORT"
        assert value["before"] is None
        assert m.headers["operation"] == "IMPORT"
        after = value["after"]
        assert m.key == {"id": after["id"]}
        assert after == expected[after["id"]], after["id"]
        seen.add(after["id"])
    assert seen == set(expected)

    # the Schema record went to --schema-topic once, from the driver
    schemas = Reader(kafka_stack.bootstrap_servers, [f"{topic_prefix}.schemas"], None)
    try:
        records = schemas.read_for(3.0)
    finally:
        schemas.close()
    assert [r.key for r in records] == ["public.mix"]
