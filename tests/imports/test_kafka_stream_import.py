"""`pg2sink --sink kafka` with imports: the engine, the gate and the Kafka sink together.

Rows the table held at the start arrive as IMPORT messages on the table's topic, the
changes made during the import as the stream's messages, and per key, in partition
order, the topic converges to the table (real broker and registry, Avro)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.conftest import Database, KafkaStack, Pg2Sink
from tests.imports.support import start_with_imports, wait_confirmed, wait_imported
from tests.sinks.kafka.test_kafka import Reader

pytestmark = pytest.mark.slow


def test_import_and_stream_to_kafka_converge(
    db: Database,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    pg2sink_proc: Callable[..., Pg2Sink],
    tmp_path: Path,
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.acct (id int PRIMARY KEY, balance int)")
    conn.execute("INSERT INTO public.acct SELECT g, g FROM generate_series(1, 20000) g")
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(db.dsn, autocommit=True) as c:
            n = 0
            while not stop.is_set():
                n += 1
                c.execute(
                    "UPDATE public.acct SET balance = balance + 1 WHERE id = %s", (n * 37 % 20000,)
                )
                if n % 10 == 0:
                    c.execute("DELETE FROM public.acct WHERE id = %s", (n * 11 % 20000 + 1,))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        proc = start_with_imports(
            pg2sink_proc,
            tmp_path / "unused.jsonl",
            "--sink",
            "kafka",
            "--kafka-bootstrap-servers",
            kafka_stack.bootstrap_servers,
            "--schema-registry-url",
            kafka_stack.registry_url,
            "--topic-prefix",
            topic_prefix,
        )
        wait_imported(db, {"public.acct"}, proc)
    finally:
        stop.set()
        writer.join(30)
    wait_confirmed(db, proc)
    assert proc.stop() == 0

    reader = Reader(
        kafka_stack.bootstrap_servers, [f"{topic_prefix}.public.acct"], kafka_stack.registry_url
    )
    try:
        messages = reader.read_for(15)
    finally:
        reader.close()
    imported = [m for m in messages if m.value is not None and m.value["operation"] == "IMPORT"]
    assert len(imported) > 10_000  # the writer deletes rows from the start
    state: dict[int, int] = {}
    for m in sorted(messages, key=lambda m: (m.partition, m.offset)):
        v = m.value
        if v is None:
            continue
        if v["operation"] == "DELETE":
            state.pop(v["before"]["id"], None)
        else:
            state[v["after"]["id"]] = v["after"]["balance"]
    want: dict[int, int] = dict(conn.execute("SELECT id, balance FROM public.acct").fetchall())
    assert state == want
