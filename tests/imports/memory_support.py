"""The import memory tests' table, workload and sinks (tests/imports/test_memory.py and
test_memory_servers.py; docs/imports.md, "Memory"): a table of 20,000 rows, 5% of them
carrying 2 MB of incompressible text stored EXTERNAL (TOAST does not shrink it),
imported by pg2sink with a 512 MB driver heap while a writer updates it (small columns,
leaving the TOASTed value unchanged; new 200 KB values; deletes; inserts; key changes).
`run_wide_import` runs it into one sink and compares the sink's latest state with the
table: the changelog replayed from the file, the Kafka topic, the NATS stream or the
Kinesis stream, and the DuckDB and BigQuery sinks' views (the null sink keeps nothing:
there, the import read every row). Kinesis holds records of at most 1 MiB, so its large
rows are 600 KB; Kafka's topic and producer and the NATS server take 8 MiB messages
(their defaults refuse 1 MB and more, with an error naming the setting)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import duckdb
import psycopg
import pytest
from psycopg.rows import TupleRow

from tests.conftest import Database, Pg2Sink, wait_for
from tests.imports import test_consistency as consistency
from tests.imports.support import IMPORTS_ON, jobs_state, wait_confirmed
from tests.sinks.kafka.kafka_support import create_topic
from tests.sinks.kinesis.kinesis_support import (
    AWS_ENV,
    create_stream,
    kinesis_args,
    kinesis_client,
    read_stream,
)
from tests.sinks.nats.nats_support import LargePayloadNats, nats_args, stored
from tests.sinks.warehouse_support import PROJECT, bigquery_args, bq_rows
from tests.support import FAST, own_server, scalar

ROWS = 20_000
#: every BIG_EVERY-th row carries BIG_BYTES of text
BIG_EVERY = 20
BIG_BYTES = 2 << 20
#: the large rows of the Kinesis sink's run (a record holds at most 1 MiB)
KINESIS_BIG_BYTES = 600_000
HEAP = "512m"

State = dict[int, tuple[str, str]]


def random_text(n: int, rng: random.Random) -> str:
    """`n` characters of base64 of random bytes: nothing for pglz to compress."""
    return base64.b64encode(rng.randbytes(n * 3 // 4 + 3)).decode()[:n]


def digest(text: str | None) -> str:
    return "null" if text is None else hashlib.md5(text.encode()).hexdigest()


def create(conn: psycopg.Connection[TupleRow], big_bytes: int) -> None:
    conn.execute("CREATE TABLE public.wide (id int PRIMARY KEY, small text, big text)")
    conn.execute("ALTER TABLE public.wide ALTER COLUMN big SET STORAGE EXTERNAL")
    rng = random.Random(2)
    with conn.cursor() as cur, cur.copy("COPY public.wide FROM STDIN") as copy:
        for i in range(1, ROWS + 1):
            big = random_text(big_bytes, rng) if i % BIG_EVERY == 0 else f"b{i}"
            copy.write_row((i, f"s{i}", big))
    conn.execute("ANALYZE public.wide")


class Writer(consistency.Writer):
    """Small random transactions on public.wide until stopped."""

    def _change(self, c: psycopg.Connection[TupleRow]) -> None:
        rng = self.rng
        op = rng.random()
        k = rng.randint(1, ROWS)
        if op < 0.65:  # `big` unchanged: its TOASTed value is not sent
            c.execute("UPDATE public.wide SET small = %s WHERE id = %s", (f"u{rng.random()}", k))
        elif op < 0.68:
            c.execute(
                "UPDATE public.wide SET big = %s WHERE id = %s", (random_text(200_000, rng), k)
            )
        elif op < 0.75:
            c.execute("DELETE FROM public.wide WHERE id = %s", (k,))
        elif op < 0.85:
            c.execute(
                "INSERT INTO public.wide VALUES (%s, 'new', %s) ON CONFLICT (id) DO UPDATE "
                "SET small = 'upserted'",
                (ROWS + rng.randint(1, 5_000), random_text(200_000 if op < 0.78 else 20, rng)),
            )
        else:  # a key change
            new = ROWS + 10_000 + rng.randint(1, 100_000)
            c.execute(
                "UPDATE public.wide SET id = %s WHERE id = %s"
                " AND NOT EXISTS (SELECT FROM public.wide WHERE id = %s)",
                (new, k, new),
            )


def table_state(conn: psycopg.Connection[TupleRow]) -> State:
    rows = conn.execute("SELECT id, small, md5(big) FROM public.wide").fetchall()
    return {int(r[0]): (r[1], r[2] or "null") for r in rows}


def replayed(records: Iterable[dict[str, Any]]) -> State:
    """The changelog's records (as the file sink writes them, one JSON object each)
    replayed in order, each `big` kept as its md5: INSERT, UPDATE and IMPORT upsert, an
    UPDATE whose before holds another key removes it, DELETE removes, an unchanged TOASTed
    value keeps the key's previous one (unknown before the key's IMPORT row, which comes
    later and replaces it)."""
    state: State = {}
    for r in records:
        if r.get("kind") != "modification" or r.get("name") != "wide":
            continue
        if r["operation"] == "DELETE":
            state.pop(r["before"]["id"], None)
            continue
        after = r["after"]
        old = state.get(after["id"])
        if r["before"] is not None:
            old = state.pop(r["before"]["id"], old)
        big = after["big"]
        if isinstance(big, dict) and big.get("unchanged_toast"):
            # no base yet: a change the import's snapshot sees, ahead of its IMPORT row
            value = old[1] if old is not None else "unknown"
        else:
            value = digest(big)
        state[after["id"]] = (after["small"], value)
    return state


def lines(path: Path) -> Iterator[dict[str, Any]]:
    """The file sink's complete lines."""
    with open(path, "rb") as f:
        for line in f:
            with contextlib.suppress(json.JSONDecodeError):
                yield json.loads(line)


def kafka_values(bootstrap: str, topic: str) -> Iterator[dict[str, Any]]:
    """The values of `topic`'s one partition, in order, to its end."""
    consumer = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        end = consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), 10)[1]
        consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        offset = 0
        while offset < end:
            msg = consumer.poll(10)
            assert msg is not None, f"{topic} not read to its end ({offset} of {end})"
            assert msg.error() is None, msg.error()
            offset = (msg.offset() or 0) + 1
            value = msg.value()
            if value:
                yield json.loads(value)
    finally:
        consumer.close()


def duckdb_state(path: Path) -> State:
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.execute("SELECT id, small, md5(big) FROM public_wide").fetchall()
    return {int(r[0]): (r[1], r[2] or "null") for r in rows}


def wait_for_job(db: Database, proc: Pg2Sink, table: str, state: str, timeout: float) -> None:
    """Until the table's job is in `state` (pg2sink must keep running meanwhile)."""

    def reached() -> bool:
        assert proc.proc is not None and proc.proc.poll() is None, proc.stderr()
        try:
            return jobs_state(db).get(table) == state
        except psycopg.errors.UndefinedTable:
            return False

    wait_for(reached, timeout, f"the import of {table} to be {state}")


class Target:
    """One sink of the test: its command line, and its state of public.wide read back
    (None for the null sink, which keeps nothing)."""

    def __init__(self, name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.name = name
        self.big = BIG_BYTES
        self.path = tmp_path / "out"
        prefix = request.getfixturevalue("topic_prefix")
        self.prefix = prefix
        if name == "file":
            self.args = ["--file-path", str(self.path)]
        elif name == "duckdb":
            self.args = ["--sink", "duckdb", "--duckdb-path", str(self.path)]
        elif name == "null":
            self.args = ["--sink", "null"]
        elif name == "kafka":
            self.bootstrap = request.getfixturevalue("kafka_stack").bootstrap_servers
            # one partition: a key change's removal of the old key keeps its place
            # before a later insert of that key; the topic takes messages of 8 MiB
            self.topic = f"{prefix}.public.wide"
            create_topic(self.bootstrap, self.topic, 1, {"max.message.bytes": str(8 << 20)})
            self.args = [
                "--sink", "kafka", "--kafka-bootstrap-servers", self.bootstrap,
                "--format", "json", "--topic-prefix", prefix,
                "--kafka-config", f"message.max.bytes={8 << 20}",
            ]  # fmt: skip
        elif name == "nats":
            self.nats = request.getfixturevalue("large_payload_nats")
            self.args = nats_args(self.nats.url, prefix)
        elif name == "kinesis":
            # Kinesis takes records of at most 1 MiB: the large rows are 600 KB here
            # (5% of 20,000 still hold 600 MB, more than the 512 MB heap)
            self.big = KINESIS_BIG_BYTES
            self.endpoint = request.getfixturevalue("kinesis_endpoint")
            create_stream(kinesis_client(self.endpoint), prefix, 1)
            self.args = kinesis_args(self.endpoint, prefix)
        else:
            self.endpoint = request.getfixturevalue("bigquery_endpoint")
            self.dataset = f"{PROJECT}.d_{prefix}"
            self.args = bigquery_args(self.endpoint, prefix)

        if name not in ("nats", "kinesis"):  # their launchers' options hold FAST
            self.args += FAST

    @property
    def env(self) -> dict[str, str]:
        return {**IMPORTS_ON, **(AWS_ENV if self.name == "kinesis" else {})}

    def state(self) -> State | None:
        if self.name == "file":
            return replayed(lines(self.path))
        if self.name == "duckdb":
            return duckdb_state(self.path)
        if self.name == "kafka":
            return replayed(kafka_values(self.bootstrap, self.topic))
        if self.name == "nats":
            return replayed(
                m.value
                for m in stored(self.nats.url, self.prefix, batch=16)
                if m.subject.endswith(".wide")
            )
        if self.name == "kinesis":
            client = kinesis_client(self.endpoint)
            return replayed(json.loads(data) for _, _, data in read_stream(client, self.prefix))
        if self.name == "bigquery":
            query = f"SELECT id, small, TO_HEX(MD5(big)) FROM `{self.dataset}.public_wide`"
            return {int(r[0]): (r[1], r[2] or "null") for r in bq_rows(self.endpoint, query)}
        return None


@pytest.fixture
def large_payload_nats() -> Iterator[LargePayloadNats]:
    with own_server(LargePayloadNats, "nats") as server:
        yield server


def run_wide_import(
    sink: str, db: Database, pg2sink_proc: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The module docstring's import into `sink`, its state compared with the table."""
    target = Target(sink, tmp_path, request)
    conn = db.connect()
    create(conn, target.big)
    seed = int.from_bytes(os.urandom(2))
    print(f"writer seed {seed}")
    writer = Writer(db.dsn, seed, pause=0.05)
    writer.start()
    try:
        proc: Pg2Sink = pg2sink_proc(
            *target.args,
            "--spark-driver-memory",
            HEAP,
            env=target.env,
        )
        proc.start()
        proc.wait_streaming(60)

        wait_for_job(db, proc, "public.wide", "done", 600)
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.error is None, writer.error
    assert writer.transactions > 20
    wait_confirmed(db, proc, timeout=300)
    assert proc.stop() == 0
    err = proc.stderr()
    assert "OutOfMemoryError" not in err and "starting a new Spark session" not in err, err
    want = table_state(conn)
    got = target.state()
    if got is None:  # the null sink: every row of the snapshot was read
        imported = scalar(conn, "SELECT sum(rows) FROM pg2sink.import_partitions")
        assert ROWS * 0.9 < imported <= ROWS + 5_000
        return
    assert got.keys() == want.keys()
    assert got == want
