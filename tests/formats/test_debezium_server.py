"""--format debezium beside Debezium itself: Debezium Server (its PostgreSQL connector and
Kafka sink, scripts/debezium.py) and pg2sink stream the same changes of one database to
topics of their own, and their records decode to the same values, message for message.

Compared: each message's key (tombstones included), and the value's `op`, `before`,
`after` and `source.schema`/`table`/`txId`/`lsn`. Not compared, as docs/formats.md says:
the envelope's `ts_ms` (Debezium's clock, pg2sink's commit time), `source.version`,
`name` (the topic prefixes differ here), `sequence` and `xmin` (which pg2sink leaves
null), `snapshot` and `transaction` (null in both here).
Both run with Debezium's JSON without schemas; TRUNCATE passes Debezium's
`skipped.operations` (it skips it by default).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import services
from debezium import DebeziumServer
from psycopg import sql

from tests.conftest import Database, KafkaStack, wait_for
from tests.sinks.kafka.test_kafka import (  # noqa: F401 (reader: a fixture)
    Reader,
    reader,
    registry_get,
    start,
)
from tests.support import Proc

TABLES = {
    "items": "id int PRIMARY KEY, name text, price numeric(10,2), at timestamptz, "
    "ts timestamp, d date, u uuid, doc jsonb, tags text[], big bigint, f float8, ok bool, "
    "raw bytea, t time, n numeric",
    "pair": "a int, b text, v text, PRIMARY KEY (a, b)",
}


def workload(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Inserts, updates, a key change under each identity, deletes and a TRUNCATE."""
    conn.execute(
        "INSERT INTO items VALUES (1, 'ann', 12.50, '2024-05-01 10:00:00.123456+02',"
        " '2024-05-01 10:00:00.5', '2024-02-29', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',"
        " '{\"k\": [1, 2]}', '{a,NULL}', 9007199254740993, 0.1, true, '\\x00ff', '12:34:56.789',"
        " 3.14159)"
    )
    conn.execute("INSERT INTO items (id, name) VALUES (2, 'bo'), (3, NULL)")
    with conn.transaction():
        conn.execute("UPDATE items SET name = 'ann2', price = -0.01, at = now() WHERE id = 1")
        conn.execute("UPDATE items SET id = 20 WHERE id = 2")  # a key change
    conn.execute("DELETE FROM items WHERE id = 3")
    conn.execute("INSERT INTO pair VALUES (1, 'x', 'one'), (2, 'y', NULL)")
    conn.execute("UPDATE pair SET v = 'uno' WHERE a = 1")
    conn.execute("UPDATE pair SET b = 'z' WHERE a = 2")  # a key change, with the old row
    conn.execute("DELETE FROM pair WHERE a = 1")
    conn.execute("TRUNCATE pair")


#: messages each table's topic gets from the workload: items 3 c, 1 u, d + tombstone +
#: c for the key change, d + tombstone; pair 2 c, 1 u, d + tombstone + c, d + tombstone, t
COUNTS = {"items": 9, "pair": 9}


def properties(db: Database, stack: KafkaStack, prefix: str, avro: bool) -> dict[str, str]:
    """Debezium Server: the PostgreSQL connector on its own slot, streaming only, to
    Kafka in JSON without schemas, or in Avro through the registry (Apicurio's
    converter, which Debezium Server ships; its Apicurio API, the ids its Confluent API
    answers with)."""
    src = "debezium.source."
    string = "org.apache.kafka.common.serialization.StringSerializer"
    props = {
        "debezium.sink.type": "kafka",
        "debezium.sink.kafka.producer.bootstrap.servers": stack.bootstrap_servers,
        "debezium.sink.kafka.producer.key.serializer": string,
        "debezium.sink.kafka.producer.value.serializer": string,
        "debezium.format.key.schemas.enable": "false",
        "debezium.format.value.schemas.enable": "false",
        src + "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        src + "offset.storage.file.filename": "offsets.dat",
        src + "offset.flush.interval.ms": "1000",
        src + "database.hostname": db.server.host,
        src + "database.port": str(db.server.port),
        src + "database.user": "postgres",
        src + "database.password": "postgres",  # trust authentication: not checked
        src + "database.dbname": db.name,
        src + "topic.prefix": prefix,
        src + "table.include.list": "public.items,public.pair",
        src + "plugin.name": "pgoutput",
        src + "slot.name": f"dbz_{db.slot}",
        src + "publication.name": f"dbz_{db.publication}",
        src + "publication.autocreate.mode": "filtered",
        src + "snapshot.mode": "no_data",
        src + "skipped.operations": "none",
        "quarkus.log.console.json": "false",
    }
    if avro:
        registry = stack.registry_url.replace("/apis/ccompat/v7", "/apis/registry/v3")
        raw = "org.apache.kafka.common.serialization.ByteArraySerializer"
        props["debezium.sink.kafka.producer.key.serializer"] = raw
        props["debezium.sink.kafka.producer.value.serializer"] = raw
        for part in ("key", "value"):
            props[f"debezium.format.{part}"] = "avro"
            props[f"debezium.format.{part}.apicurio.registry.url"] = registry
            props[f"debezium.format.{part}.apicurio.registry.auto-register"] = "true"
            props[f"debezium.format.{part}.apicurio.registry.find-latest"] = "true"
    return props


@pytest.fixture(params=[False, True], ids=["json", "avro"])
def avro(request: pytest.FixtureRequest) -> bool:
    """JSON without schemas, or Avro through the registry (--debezium-avro)."""
    return bool(request.param)


@pytest.fixture
def debezium_server(
    db: Database, tmp_path: Path, kafka_stack: KafkaStack, topic_prefix: str, avro: bool
) -> Iterator[DebeziumServer]:
    conn = db.connect()
    for table, columns in TABLES.items():
        conn.execute(
            sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table), sql.SQL(columns))
        )
    conn.execute("ALTER TABLE pair REPLICA IDENTITY FULL")
    server = DebeziumServer(
        base=tmp_path / "debezium",
        port=services.free_port(),
        properties=properties(db, kafka_stack, f"dbz{topic_prefix}", avro),
        avro=avro,
    )
    try:
        server.start()
    except services.ServiceError as e:
        pytest.fail(f"Debezium Server did not start: {e}")
    try:
        yield server
    finally:
        server.stop()
        with psycopg.connect(db.dsn, autocommit=True) as c:
            c.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s AND NOT active",
                (f"dbz_{db.slot}",),
            )


def compared(message: Any, avro: bool) -> tuple[Any, ...]:
    """What both tools must agree on in one message (see the module docstring): JSON
    parsed, Avro decoded through the registry."""
    if message.raw_value is None:
        return (message.key if avro else json.loads(message.raw_key), "tombstone")
    key = message.key if avro else json.loads(message.raw_key) if message.raw_key else None
    value = message.value if avro else json.loads(message.raw_value)
    source = value["source"]
    return (
        key,
        value["op"],
        value["before"],
        value["after"],
        (source["schema"], source["table"], source["txId"], source["lsn"]),
    )


_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))


def expanded(stack: KafkaStack, subject: str, version: str = "latest") -> Any:
    """A registered Avro schema with every named type written out where it is used
    (Debezium Server's converter registers its records as references, pg2sink refers
    to a record by name after its first use)."""
    got = registry_get(stack, f"subjects/{subject}/versions/{version}")
    named: dict[str, Any] = {}
    for ref in got.get("references") or []:
        named[ref["name"]] = expanded(stack, ref["subject"], str(ref["version"]))
    return _inline(json.loads(got["schema"]), named, "")


def _inline(schema: Any, named: dict[str, Any], namespace: str) -> Any:
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema
        return named.get(schema) or named[f"{namespace}.{schema}"]
    if isinstance(schema, list):
        return [_inline(s, named, namespace) for s in schema]
    if schema.get("type") == "record":
        ns = schema.get("namespace", namespace)
        out = {k: v for k, v in schema.items() if k not in ("namespace", "fields")}
        out["name"] = f"{ns}.{schema['name']}" if ns else schema["name"]
        fields = [{**f, "type": _inline(f["type"], named, ns)} for f in schema["fields"]]
        named[out["name"]] = out = {**out, "fields": fields}
        return out
    if schema.get("type") == "array":
        return {**schema, "items": _inline(schema["items"], named, namespace)}
    return schema


# the first run on a machine fetches Debezium Server's distribution (780 MB) from Maven
# Central into the services cache: more than the suite's 300 s may go by
@pytest.mark.timeout(1200)
@pytest.mark.slow
def test_same_values_as_debezium_server(
    avro: bool,
    db: Database,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    debezium_server: DebeziumServer,
    reader: Callable[..., Reader],  # noqa: F811 (test_kafka's fixture, imported)
) -> None:
    slot = f"dbz_{db.slot}"
    with psycopg.connect(db.dsn, autocommit=True) as c:
        wait_for(
            lambda: c.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", (slot,)
            ).fetchone(),
            60,
            "Debezium's slot",
        )
    args = ("--format", "debezium", "--tombstones", *(["--debezium-avro"] if avro else []))
    p = start(pg2sink_proc, kafka_stack, topic_prefix, *args)  # and --schema-registry-url
    workload(db.connect())
    for table, n in COUNTS.items():
        ours = reader(f"{topic_prefix}.public.{table}", avro=avro).read(n)
        theirs = reader(f"dbz{topic_prefix}.public.{table}", avro=avro).read(n, timeout=90)
        assert len(ours) == len(theirs) == n
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert compared(a, avro) == compared(b, avro), f"{table} message {i}"
        if avro:  # and the same Avro schemas, but for the topic prefix in their names
            for part in ("key", "value"):
                mine = expanded(kafka_stack, f"{topic_prefix}.public.{table}-{part}")
                debezium = expanded(kafka_stack, f"dbz{topic_prefix}.public.{table}-{part}")
                assert json.dumps(debezium).replace(f'"dbz{topic_prefix}.', '"P.') == (
                    json.dumps(mine).replace(f'"{topic_prefix}.', '"P.')
                ), f"{table}-{part}"
    assert p.stop() == 0
