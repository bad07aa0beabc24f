"""`pg2sink relay`: two databases stream to Kafka (Avro), one relay writes both into one
DuckDB file, whose latest-state views equal both sources (docs/relay.md).

Real servers only: the session's PostgreSQL (two databases, two slots), the Kafka broker
and schema registry of `kafka_stack`, DuckDB. The tables have different names in the two
databases: the DuckDB sink keys its tables by schema.table, so equal names would share
one raw table (docs/relay.md says so).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.conftest import (
    Database,
    KafkaStack,
    Pg2Sink,
    clean_env,
    fresh_database,
    pg2sink_for,
    read_jsonl,
    run_cli,
    wait_for,
)
from tests.sinks.duckdb.test_duckdb import duck_rows, pg_rows
from tests.sinks.kafka.test_kafka import kafka_args
from tests.sinks.warehouse_support import duck_query

pytestmark = pytest.mark.slow


def relay_proc(stack: KafkaStack, workdir: Path, *extra: str) -> Pg2Sink:
    """A (not started) `pg2sink relay` reading `stack`'s broker and registry."""
    args = ["relay", "--from-kafka", stack.bootstrap_servers]
    args += ["--schema-registry-url", stack.registry_url, *extra]
    return Pg2Sink(args=args, env=clean_env(), workdir=workdir)


def wait_relaying(p: Pg2Sink) -> None:
    def ready() -> bool:
        assert p.proc is not None
        if p.proc.poll() is not None:
            raise AssertionError(f"relay exited {p.proc.returncode}:\n{p.stderr()}")
        return "pg2sink relay is relaying" in p.stderr()

    wait_for(ready, 30, "the relay to start")


def lag(stack: KafkaStack, group: str, topics: list[str]) -> int:
    """Messages in `topics` past `group`'s committed offsets (all of them if none)."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": group})
    try:
        parts = [TopicPartition(t, 0) for t in topics]
        behind = 0
        for tp in consumer.committed(parts, timeout=10):
            _, high = consumer.get_watermark_offsets(tp, timeout=10)
            behind += high - max(tp.offset, 0)
        return behind
    finally:
        consumer.close()


def caught_up(db: Database) -> None:
    """The stream confirmed everything written so far: Kafka holds it."""
    target = db.current_lsn()
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= target, 60, "pg2sink to catch up")


def relay_everything(
    relay: Pg2Sink, stack: KafkaStack, group: str, topics: list[str], dbs: list[Database]
) -> None:
    """Start the relay, wait until Kafka holds every change of `dbs` and the relay
    committed every message of `topics`, then stop it (it holds the DuckDB file)."""
    relay.start()
    wait_relaying(relay)
    for db in dbs:
        caught_up(db)
    wait_for(lambda: lag(stack, group, topics) == 0, 60, "the relay to commit")
    assert relay.stop() == 0, relay.stderr()


@pytest.fixture
def second_db(pg_server: Any) -> Iterator[Database]:
    with fresh_database(pg_server) as other:
        yield other


TABLE = "(id int PRIMARY KEY, name text, price numeric(10,2), at timestamptz, day date)"


def workload(conn: psycopg.Connection[Any], table: str, base: int) -> int:
    """Inserts, updates, a key change and deletes on `table`; the number of changes."""
    conn.execute(
        f"INSERT INTO {table} SELECT i, 'n' || i, i * 1.25, "
        "'2026-11-24 05:00+00'::timestamptz + i * interval '1 minute', "
        "date '2026-01-01' + i FROM generate_series(%s::int, %s::int) i",
        (base, base + 19),
    )
    with conn.transaction():  # several changes in one transaction, two tables' worth
        conn.execute(
            f"UPDATE {table} SET name = name || '!' WHERE id %% 3 = 0 AND id BETWEEN %s AND %s",
            (base, base + 19),
        )
        conn.execute(f"UPDATE {table} SET id = id + 1000 WHERE id = %s", (base + 1,))
    conn.execute(f"DELETE FROM {table} WHERE id IN (%s, %s)", (base + 2, base + 4))
    updated = len(range(base + (-base % 3), base + 20, 3))
    return 20 + updated + 1 + 2


def test_two_databases_fan_in_to_one_duckdb_file(
    db: Database, second_db: Database, kafka_stack: KafkaStack, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    prefixes = (f"ra{tag}", f"rb{tag}")
    sources = ((db, "shop_a"), (second_db, "shop_b"))
    conns = []
    streams = []
    for (source, table), prefix in zip(sources, prefixes, strict=True):
        conn = source.connect()
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute(f"CREATE TABLE {table} {TABLE}")
        conns.append(conn)
        p = pg2sink_for(source, tmp_path, *kafka_args(kafka_stack, prefix)).start()
        p.wait_streaming()
        streams.append(p)
    changes = [workload(c, t, 1) for c, (_, t) in zip(conns, sources, strict=True)]
    topics = [f"{prefixes[0]}.public.shop_a", f"{prefixes[1]}.public.shop_b"]
    path = tmp_path / "fan-in.duckdb"
    group = f"relay-{tag}"
    relay = relay_proc(
        kafka_stack,
        tmp_path,
        "--topics",
        rf"({prefixes[0]}|{prefixes[1]})\..*",
        "--group-id",
        group,
        "--sink",
        "duckdb",
        "--duckdb-path",
        str(path),
    )
    dbs = [db, second_db]
    try:
        relay_everything(relay, kafka_stack, group, topics, dbs)
        # the offsets are committed: the file holds every change
        for conn, (_, table) in zip(conns, sources, strict=True):
            assert duck_rows(path, f"public_{table}", "id") == pg_rows(conn, table, "id")
        # a second run continues from the committed offsets: nothing is written twice
        again = zip(changes, conns, sources, strict=True)
        changes = [n + workload(c, t, 100) for n, c, (_, t) in again]
        relay_everything(relay, kafka_stack, group, topics, dbs)
    finally:
        for p in (*streams, relay):
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)
    for conn, (_, table), n in zip(conns, sources, changes, strict=True):
        assert duck_rows(path, f"public_{table}", "id") == pg_rows(conn, table, "id")
        assert duck_query(path, f"SELECT count(*) FROM public_{table}_raw") == [(n,)]
    ((slot, mark),) = duck_query(path, "SELECT slot, lsn FROM pg2sink_state")
    assert slot == f"relay.{group}" and mark > 0


def test_equal_table_names_of_two_databases(
    db: Database, second_db: Database, kafka_stack: KafkaStack, tmp_path: Path
) -> None:
    """public.t in both databases: the relay refuses to merge them; with
    --relay-schema-prefix each lands in a table named after its topic's prefix."""
    tag = uuid.uuid4().hex[:8]
    prefixes = (f"ca{tag}", f"cb{tag}")
    conns, streams = [], []
    for source, prefix, base in ((db, prefixes[0], 1), (second_db, prefixes[1], 5)):
        conn = source.connect()
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute(f"CREATE TABLE t {TABLE}")
        conns.append(conn)
        stream = pg2sink_for(source, tmp_path, *kafka_args(kafka_stack, prefix)).start()
        streams.append(stream)
        stream.wait_streaming()
        workload(conn, "t", base)  # keys 5 to 20 in both: merged, they would collide
        caught_up(source)
    topics = [f"{p}.public.t" for p in prefixes]
    pattern = rf"({prefixes[0]}|{prefixes[1]})\.public\..*"
    path = tmp_path / "names.duckdb"
    sink = ("--sink", "duckdb", "--duckdb-path", str(path))
    refused = relay_proc(kafka_stack, tmp_path, "--topics", pattern, "--group-id", tag, *sink)
    group = f"prefixed-{tag}"
    relay = relay_proc(
        kafka_stack, tmp_path, "--topics", pattern, "--group-id", group,
        "--relay-schema-prefix", *sink,
    )  # fmt: skip
    try:
        refused.start()
        assert refused.proc is not None and refused.proc.wait(60) != 0
        assert "table public.t comes from topics" in refused.stderr()
        assert lag(kafka_stack, tag, topics) > 0  # nothing past the refusal committed
        relay_everything(relay, kafka_stack, group, topics, [db, second_db])
    finally:
        for p in (*streams, refused, relay):
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)
    for conn, prefix in zip(conns, prefixes, strict=True):
        assert duck_rows(path, f"{prefix}_public_t", "id") == pg_rows(conn, "t", "id")


def test_a_kill_9_loses_nothing(db: Database, kafka_stack: KafkaStack, tmp_path: Path) -> None:
    """The relay killed while it writes: the committed offsets never pass what the file
    holds, so a restart completes the view (changes may repeat in the raw table)."""
    prefix, group = f"rk{uuid.uuid4().hex[:8]}", f"relay-{uuid.uuid4().hex[:8]}"
    conn = db.connect()
    conn.execute(f"CREATE TABLE shop_k {TABLE}")
    stream = pg2sink_for(db, tmp_path, *kafka_args(kafka_stack, prefix)).start()
    path = tmp_path / "killed.duckdb"
    relay = relay_proc(
        kafka_stack, tmp_path, "--topics", rf"{prefix}\..*", "--group-id", group,
        "--relay-batch-size", "50", "--sink", "duckdb", "--duckdb-path", str(path),
        # the killed member leaves the group when its session times out (default 45 s)
        "--relay-kafka-config", "session.timeout.ms=6000",
    )  # fmt: skip
    topics = [f"{prefix}.public.shop_k"]
    try:
        stream.wait_streaming()
        for i in range(0, 3000, 10):  # 300 transactions of 10 rows
            conn.execute(
                "INSERT INTO shop_k (id, name) SELECT i, 'n' FROM generate_series(%s::int, %s) i",
                (i, i + 9),
            )
        caught_up(db)
        relay.start()
        wait_for(lambda: lag(kafka_stack, group, topics) < 3000, 60, "the relay to commit")
        relay.kill()
        left = lag(kafka_stack, group, topics)
        assert 0 < left < 3000
        relay_everything(relay, kafka_stack, group, topics, [db])
    finally:
        for p in (stream, relay):
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)
    assert duck_rows(path, "public_shop_k", "id") == pg_rows(conn, "shop_k", "id")
    ((raw,),) = duck_query(path, "SELECT count(DISTINCT _pg2sink_lsn) FROM public_shop_k_raw")
    assert raw == 3000


def test_exactly_once_into_duckdb(db: Database, kafka_stack: KafkaStack, tmp_path: Path) -> None:
    """--relay-exactly-once: the offsets live in the DuckDB file, so a group whose committed
    offsets fell behind the file (a crash between DuckDB's commit and Kafka's, made here
    by committing offset 0) writes nothing twice."""
    prefix, group = f"re{uuid.uuid4().hex[:8]}", f"relay-{uuid.uuid4().hex[:8]}"
    conn = db.connect()
    conn.execute("SET TimeZone = 'UTC'")
    conn.execute(f"CREATE TABLE shop_e {TABLE}")
    stream = pg2sink_for(db, tmp_path, *kafka_args(kafka_stack, prefix)).start()
    path = tmp_path / "once.duckdb"
    relay = relay_proc(
        kafka_stack, tmp_path, "--topics", rf"{prefix}\..*", "--group-id", group,
        "--relay-exactly-once", "--relay-batch-size", "7", "--sink", "duckdb",
        "--duckdb-path", str(path),
    )  # fmt: skip
    topic = f"{prefix}.public.shop_e"
    try:
        stream.wait_streaming()
        changes = workload(conn, "shop_e", 1)
        relay_everything(relay, kafka_stack, group, [topic], [db])
        stored = duck_query(path, "SELECT topic, next_offset FROM pg2sink_relay_offsets")
        assert stored == [(topic, changes)]
        consumer = Consumer({"bootstrap.servers": kafka_stack.bootstrap_servers, "group.id": group})
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        consumer.close()
        changes += workload(conn, "shop_e", 100)
        relay_everything(relay, kafka_stack, group, [topic], [db])
    finally:
        for p in (stream, relay):
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)
    assert "starts at offset" in relay.stderr()
    assert duck_rows(path, "public_shop_e", "id") == pg_rows(conn, "shop_e", "id")
    assert duck_query(path, "SELECT count(*) FROM public_shop_e_raw") == [(changes,)]


def test_json_topics_into_the_file_sink(
    db: Database, kafka_stack: KafkaStack, tmp_path: Path
) -> None:
    """--format json with --schema-topic: the relay writes each table's Schema record
    (from the schema topic) before its changes, the changes as the stream wrote them."""
    prefix, group = f"rj{uuid.uuid4().hex[:8]}", f"relay-{uuid.uuid4().hex[:8]}"
    conn = db.connect()
    conn.execute(f"CREATE TABLE shop_j {TABLE}")
    schemas = f"{prefix}.schemas"
    args = kafka_args(kafka_stack, prefix, "--schema-topic", schemas, avro=False)
    stream = pg2sink_for(db, tmp_path, *args).start()
    out = tmp_path / "relayed.jsonl"
    relay = relay_proc(
        kafka_stack, tmp_path, "--topics", rf"{prefix}\.public\..*", "--group-id", group,
        "--from-schema-topic", schemas, "--sink", "file", "--file-path", str(out),
    )  # fmt: skip
    try:
        stream.wait_streaming()
        changes = workload(conn, "shop_j", 1)
        relay_everything(relay, kafka_stack, group, [f"{prefix}.public.shop_j"], [db])
    finally:
        for p in (stream, relay):
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)
    records = read_jsonl(out)
    assert records[0]["kind"] == "schema" and records[0]["name"] == "shop_j"
    assert records[0]["schema"]["pg.primary_key"] == ["id"]
    mods = [r for r in records if r["kind"] == "modification"]
    assert len(mods) == changes
    latest: dict[int, dict[str, Any]] = {}
    for m in mods:  # the changes, applied in order, give the table
        if m["before"] is not None:
            latest.pop(m["before"]["id"], None)
        if m["after"] is not None:
            latest[m["after"]["id"]] = m["after"]
    rows = conn.execute("SELECT id, name, price::float8 FROM shop_j ORDER BY id").fetchall()
    assert [(r["id"], r["name"], r["price"]) for _, r in sorted(latest.items())] == rows


def test_relay_needs_its_options() -> None:
    done = run_cli("relay", "--sink", "null", "--topics", "x")
    assert done.returncode == 2
    assert done.stderr.strip() == "pg2sink: error: pg2sink relay needs --from-kafka SERVERS"
    done = run_cli("relay", "--sink", "null", "--from-kafka", "b:1", "--topics", "(")
    assert done.returncode == 2 and "--topics '(' is no regular expression" in done.stderr
    done = run_cli(
        "relay", "--sink", "null", "--from-kafka", "b:1", "--topics", "x",
        "--relay-primary-key", "users",
    )  # fmt: skip
    assert done.returncode == 2
    assert "--relay-primary-key: 'users': expected TABLE=COLUMN[,COLUMN...]" in done.stderr


def test_relay_help_shows_the_sinks_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pg2sink", "relay", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    ).stdout
    for option in ("--from-kafka", "--topics", "--group-id", "--duckdb-path", "--nats-url"):
        assert option in out
