"""--format debezium read by Debezium's own consumer: Kafka Connect (Apache Kafka's
worker) with Debezium's JDBC sink connector (scripts/kafka_connect.py) applies pg2sink's
topics to a second PostgreSQL database, which then equals the source.

The workload covers the common types, inserts, updates, deletes, key changes (a
one-column key, and a two-column key under REPLICA IDENTITY FULL) and a TRUNCATE through
`pg2sink stream`, and imported rows (`op: r`) through the Kafka sink's import target
(an import through the CLI would start Spark: tests/imports/ does). Twice: JSON with
schemas (--debezium-schemas, JsonConverter), and Avro through the schema registry
(--debezium-avro, Apicurio's AvroConverter: Confluent's is not on Maven Central). The
connector creates the target tables from the schemas pg2sink writes; its column types
are its own (numeric without a scale becomes double precision, jsonb
json), so the tables are compared by each value's text, which PostgreSQL writes the
same for both.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import kafka_connect
import psycopg
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
import services
from psycopg import sql

from pg2sink.formats.config import Formatting
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.imports import KafkaImportTarget
from tests.conftest import Database, KafkaStack, fresh_database
from tests.sinks.kafka.test_kafka import start
from tests.sinks.null.test_null import import_table
from tests.support import Proc

TYPES = """
    id int PRIMARY KEY, s text, vc varchar(20), n numeric(12,3), nv numeric, b bool,
    f8 float8, f4 real, i2 smallint, i8 bigint, d date, tm time, ts timestamp,
    tstz timestamptz, u uuid, j json, jb jsonb, by bytea, ai int[], at text[]
"""
ROW = (
    "'{s}', 'vc', 12345.678, 3.25, true, 0.1, 2.5, -7, 9007199254740993, '2024-02-29', "
    "'12:34:56.789', '2024-05-01 10:00:00.5', '2024-05-01 10:00:00.123456+02', "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{\"a\": [1, 2]}}', '{{\"k\": \"v\"}}', "
    "'\\x00ff10', '{{1,2,NULL}}', '{{\"x y\",NULL}}'"
)
#: each table and its key columns, in the order the comparison sorts by
TABLES = {"types": ("id",), "pair": ("a", "b")}


def workload(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Inserts, updates, deletes, key changes and a TRUNCATE, in several transactions."""
    for i in range(10, 20):
        conn.execute(f"INSERT INTO types VALUES ({i}, {ROW.format(s=f'row {i}')})")
    conn.execute("INSERT INTO types (id) VALUES (20)")  # NULL in every other column
    with conn.transaction():
        conn.execute(
            "UPDATE types SET s = 'changed', n = -0.001, tstz = '1999-12-31 23:59:59.999+00',"
            " jb = '[1, {\"b\": null}]', ai = '{}' WHERE id = 11"
        )
        conn.execute("UPDATE types SET id = 111 WHERE id = 12")  # a key change
        conn.execute("UPDATE types SET id = 112, s = 'moved' WHERE id = 13")
        conn.execute("DELETE FROM types WHERE id IN (14, 2)")
    conn.execute("UPDATE types SET id = 12 WHERE id = 111")  # and back
    conn.execute("UPDATE types SET s = NULL, d = NULL, u = NULL WHERE id = 15")
    conn.execute("INSERT INTO pair VALUES (1, 'x', 'one'), (2, 'y', 'two'), (3, 'z', 'three')")
    conn.execute("UPDATE pair SET b = 'x2' WHERE a = 1")  # part of the key changes
    conn.execute("UPDATE pair SET v = 'deux' WHERE a = 2")
    conn.execute("DELETE FROM pair WHERE a = 3")
    conn.execute("TRUNCATE pair")
    conn.execute("INSERT INTO pair VALUES (4, 'w', 'four'), (5, 'v', NULL)")
    conn.execute("UPDATE pair SET a = 6, b = 'u' WHERE a = 5")


Rows = list[dict[str, str | None]]


def rows(dsn: str, table: str, key: tuple[str, ...]) -> Rows | None:
    """Every row of `table` as the text of each value, sorted by its key; None while the
    table does not exist."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s)"
                " AND attnum > 0 AND NOT attisdropped ORDER BY attname",
                (table,),
            )
        ]
        if not columns:
            return None
        query = sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns),
            sql.Identifier(table),
            sql.SQL(", ").join(map(sql.Identifier, key)),
        )
        return [dict(zip(columns, r, strict=True)) for r in conn.execute(query)]


def differences(got: Rows | None, want: Rows | None) -> list[str]:
    """The rows (or values) that differ, for the failure message."""
    if got is None or want is None or len(got) != len(want):
        return [f"rows {got} != {want}"]
    return [
        f"{c}: {g.get(c)!r} != {w[c]!r} in {w}"
        for g, w in zip(got, want, strict=True)
        for c in w
        if g.get(c) != w[c]
    ]


def write_import(stack: KafkaStack, prefix: str, avro: bool) -> Rows:
    """Rows of table public.t through the Kafka sink's import target (what an import
    sends, `op: r`, without starting Spark for it), and the rows they are."""
    cfg = KafkaConfig(
        bootstrap_servers=stack.bootstrap_servers,
        schema_registry_url=stack.registry_url,
        topic_prefix=prefix,
        format="debezium",
        formatting=Formatting(debezium_schemas=not avro, database="app", debezium_avro=avro),
    )
    table = import_table()  # public.t (id int8 PRIMARY KEY, v text)
    target = KafkaImportTarget(cfg).begin(table.schema)
    batch = pa.RecordBatch.from_arrays([pa.array(["1", "2"]), pa.array(["a", None])], ["c0", "c1"])
    assert target.write_rows(table, iter([batch])) == 2
    return [{"id": "1", "v": "a"}, {"id": "2", "v": None}]


@pytest.fixture
def target(db: Database) -> Iterator[Database]:
    with fresh_database(db.server) as target:
        yield target


@pytest.fixture(scope="module")
def worker(
    tmp_path_factory: pytest.TempPathFactory, kafka_stack: KafkaStack
) -> Iterator[kafka_connect.KafkaConnect]:
    """One worker for the module's tests, with the Avro converter too; each test adds a
    connector of its own."""
    w = kafka_connect.KafkaConnect(
        base=tmp_path_factory.mktemp("connect"),
        port=services.free_port(),
        bootstrap_servers=kafka_stack.bootstrap_servers,
        avro=True,
    )
    try:
        w.start()
    except services.ServiceError as e:
        pytest.fail(f"Kafka Connect with Debezium's JDBC sink did not start: {e}")
    yield w
    w.stop()


# the first run on a machine fetches Debezium Server's distribution (780 MB) from Maven
# Central into the services cache: more than the suite's 300 s may go by
@pytest.mark.timeout(1200)
@pytest.mark.slow
@pytest.mark.parametrize("avro", [False, True], ids=["json-schemas", "avro"])
def test_jdbc_sink_connector_makes_an_equal_copy(
    avro: bool,
    db: Database,
    target: Database,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    worker: kafka_connect.KafkaConnect,
) -> None:
    conn = db.connect()
    conn.execute(f"CREATE TABLE types ({TYPES})")
    conn.execute("CREATE TABLE pair (a int, b text, v text, PRIMARY KEY (a, b))")
    conn.execute("ALTER TABLE pair REPLICA IDENTITY FULL")
    encoding = "--debezium-avro" if avro else "--debezium-schemas"
    args = ("--format", "debezium", encoding, "--tombstones")
    # avro=True only adds --schema-registry-url (avro=False would add --format json)
    p = start(pg2sink_proc, kafka_stack, topic_prefix, *args)
    workload(conn)
    name = f"jdbc-{topic_prefix}"
    config = kafka_connect.jdbc_sink_config(
        f"postgresql://postgres@{target.server.host}:{target.server.port}/{target.name}",
        rf"{topic_prefix}\.public\..*",
        kafka_connect.avro_converters(kafka_stack.registry_url) if avro else None,
    )
    imported = write_import(kafka_stack, topic_prefix, avro)
    worker.add(name, config)
    want = {t: rows(db.dsn, t, key) for t, key in TABLES.items()}
    assert want["types"] is not None and len(want["types"]) == 10
    want["t"] = imported
    got: dict[str, Rows | None] = {}
    deadline = time.monotonic() + 60
    while got != want and time.monotonic() < deadline:
        failure = worker.failure(name)
        assert failure is None, f"the JDBC sink connector failed:\n{failure}"
        time.sleep(0.5)
        got = {t: rows(target.dsn, t, key) for t, key in [*TABLES.items(), ("t", ("id",))]}
    diff = [d for t in want for d in differences(got.get(t), want[t])]
    assert got == want, f"the target differs ({worker.log}):\n" + "\n".join(diff)
    assert p.stop() == 0


def test_the_launchers_target_and_converters() -> None:
    """scripts/kafka_connect.py: --target as the connector's JDBC settings (a URL that is
    not PostgreSQL's refused), and the Avro converters on Apicurio's own API."""
    url, user, password = kafka_connect.jdbc_url("postgresql://ann:Hunter2@db1:6543/copy")
    assert (url, user, password) == ("jdbc:postgresql://db1:6543/copy", "ann", "Hunter2")
    assert kafka_connect.jdbc_url("postgres://h/x")[:2] == (
        "jdbc:postgresql://h:5432/x",
        "postgres",
    )
    with pytest.raises(ValueError, match="postgresql://"):
        kafka_connect.jdbc_url("mysql://h/x")
    converters = kafka_connect.avro_converters("http://r:8080/apis/ccompat/v7")
    assert converters["value.converter.apicurio.registry.url"] == "http://r:8080/apis/registry/v3"
    assert converters["key.converter"] == kafka_connect.AVRO_CONVERTER
    done = subprocess.run(
        [sys.executable, str(kafka_connect.__file__), "jdbc-sink", "--topics-regex", "x",
         "--target", "mysql://h/x", "--bootstrap-servers", "127.0.0.1:1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip() == (
        "connect: --target must be a postgresql://user@host:port/database URL"
    )
