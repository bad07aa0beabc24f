"""--format debezium's row route (DebeziumTable.new_rows, row_encoder): the key and value
the Kafka sink's row encoder makes from an Insert's or Update's pgoutput bytes are those
the record route writes for the same change (JSON with and without schemas, and Avro
through the schema registry), on values a real PostgreSQL sent; what it declines (an
old tuple, a value only the record route handles) is left to the record route."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.catalog.catalog import Catalog
from pg2sink.catalog.server import REPLICATION_SESSION_SETTINGS
from pg2sink.changelog.builder import ChangelogBuilder, RowWriter, TableShape
from pg2sink.changelog.records import Modification, Record, Schema
from pg2sink.formats.avro_native import Encode
from pg2sink.formats.config import Formatting
from pg2sink.formats.debezium_types import UNAVAILABLE
from pg2sink.formats.jsonenc import loads
from pg2sink.formats.kafka import Format, TableFormat
from pg2sink.schema_registry import RegistryClient
from pg2sink.sinks.kafka.config import KafkaConfig, message_format
from tests.conftest import Database, KafkaStack

TABLES = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok')",
    "CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)",
    "CREATE TABLE t (k int8 PRIMARY KEY, i2 int2, i4 int4, o oid, b bool, t text,"
    " vc varchar(20), js json, jb jsonb, u uuid, en mood, dp posint, mo money, x xid,"
    " iv interval, nu numeric, by bytea, f4 float4, f8 float8, n102 numeric(10,2),"
    " n180 numeric(18,0), n5m2 numeric(5,-2), n35 numeric(3,5), d date, tm time,"
    " tm3 time(3), ts timestamp, ts3 timestamp(3), tstz timestamptz, tstz3 timestamptz(3),"
    " ai int4[], atx text[], big text)",
    "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL",
    "CREATE TABLE pair (a int, b text, v text, PRIMARY KEY (a, b))",
    "CREATE TABLE nokey (v text, n numeric(4,1))",
]

# column -> values (SQL literals) the row route writes itself
COMMON: dict[str, list[str]] = {
    "i2": ["0", "-32768", "32767"],
    "i4": ["-2147483648", "2147483647", "7"],
    "o": ["4294967295"],
    "b": ["true", "false"],
    "t": ["''", "'größe ✓ 😀'", "E'tab\\tnew\\nline \\\\ quote'' \"'"],
    "vc": ["'varchar ü'"],
    "js": ["'{\"a\": [1, 2.50, null]}'"],
    "jb": ["'{\"a\": [1, 2.50, null]}'", "'12.5e3'"],
    "u": ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"],
    "en": ["'sad'"],
    "dp": ["1"],
    "mo": ["'-1234567.89'"],
    "x": ["'745'"],
    "iv": ["'1 year 2 mons 3 days 04:05:06.789'", "'-1 day'"],
    "nu": ["0", "0.00000001", "-123456789012345678901234567890.123456789", "1e20"],
    "by": ["''", "'\\x00ff'"],
    "f4": ["0", "'-0'", "1.5", "0.1", "3.4028235e38", "1e-45"],
    "f8": ["'-0'", "0.1", "1.7976931348623157e308", "5e-324", "1e20"],
    "n102": ["0", "12345678.50", "-99999999.99", "0.01", "-0.01", "-128"],
    "n180": ["999999999999999999", "-999999999999999999", "127", "128", "-129", "255"],
    "n5m2": ["12300", "-9999900"],
    "n35": ["0.00123", "-0.00999"],
    "d": ["'1970-01-01'", "'1969-12-31'", "'0001-01-01'", "'9999-12-31'", "'2024-02-29'"],
    "tm": ["'00:00:00'", "'23:59:59.999999'", "'12:34:56.5'"],
    "tm3": ["'12:34:56.789'"],
    "ts": ["'1970-01-01 00:00:00'", "'1969-12-31 23:59:59.999999'", "'0001-01-01 00:00:00'"],
    "ts3": ["'2026-11-21 10:11:12.5'", "'1969-12-31 23:59:59.999'"],
    "tstz": ["'2026-11-21 10:00:00.123456+05:30'", "'1969-12-31 23:59:59.999999+00'"],
    "tstz3": ["'0001-01-01 00:00:00+00'", "'2026-11-21 10:00:00.5-08'"],
    "ai": ["'{}'", "'{1,NULL,-3}'"],
    "atx": ["'{a,NULL,\"b c\"}'"],
    "big": ["NULL", "repeat('x', 3000)"],
}
# column -> values a type cannot hold (Debezium's null) or only the record route reads
SPECIAL: dict[str, list[str]] = {
    "nu": ["'NaN'", "'Infinity'"],
    "f4": ["'NaN'", "'-Infinity'"],
    "f8": ["'Infinity'"],
    "n102": ["'NaN'"],
    "d": ["'infinity'", "'0044-03-15 BC'", "'12345-01-01'"],
    "tm": ["'24:00:00'"],
    "ts": ["'-infinity'", "'0044-03-15 10:00:00 BC'"],
    "tstz": ["'infinity'", "'0044-03-15 10:00:00+00 BC'"],
    "ai": ["'{{1,2},{3,4}}'", "'[0:1]={1,2}'"],
}
#: rows of t: COMMON's values in turn, then each SPECIAL value in a row of its own
ROWS = [{c: vs[i % len(vs)] for c, vs in COMMON.items()} for i in range(6)] + [
    {c: v} for c, vs in SPECIAL.items() for v in vs
]


def _insert(conn: psycopg.Connection[TupleRow], key: int, row: dict[str, str]) -> None:
    # the values are this file's SQL literals (test data), the names quoted identifiers
    conn.execute(
        sql.SQL("INSERT INTO t ({}) VALUES ({})").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in ["k", *row]),
            sql.SQL(", ").join(sql.SQL(v) for v in [str(key), *row.values()]),
        )
    )


class Captured:
    """The record route's records of a slot's changes, and each change's message and
    table shape, through the real builder."""

    def __init__(self, conn: psycopg.Connection[TupleRow], db: Database) -> None:
        self.records: list[Record] = []
        self.shapes: dict[str, TableShape] = {}
        builder = ChangelogBuilder(Catalog(conn), self.records.append, row_writer=self._shape)
        rows = conn.execute(
            "SELECT lsn - '0/0', data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL,"
            " 'proto_version', '1', 'publication_names', %s)",
            (db.slot, db.publication),
        ).fetchall()
        #: (Insert/Update message, its Modification)
        self.changes: list[tuple[bytes, Modification]] = []
        for lsn, raw in rows:
            data = bytes(raw)
            builder.feed(data, int(lsn))
            if data[:1] in (b"I", b"U"):
                m = self.records[-1]
                assert isinstance(m, Modification)
                self.changes.append((data, m))

    def _shape(self, shape: TableShape) -> RowWriter | None:
        self.shapes[shape.name] = shape
        return None  # every change takes the record route

    def schemas(self) -> list[Schema]:
        return [r for r in self.records if isinstance(r, Schema)]


@pytest.fixture
def captured(db: Database) -> Captured:
    options = " ".join(f"-c {k}={v}" for k, v in REPLICATION_SESSION_SETTINGS.items())
    conn = db.connect(options=options)  # values rendered as pg2sink's walsender does
    conn.execute("SET synchronous_commit = on")
    for statement in TABLES:
        conn.execute(statement)
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(db.publication))
    )
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot,))
    for key, row in enumerate(ROWS):
        _insert(conn, key, row)
    with conn.transaction():  # two changes of one transaction, one with unchanged TOAST
        conn.execute("UPDATE t SET t = 'updated' WHERE k = 3")
        conn.execute("UPDATE t SET i4 = -1 WHERE k = 1")
    conn.execute("INSERT INTO pair VALUES (1, 'x', 'one'), (2, 'y', NULL)")
    conn.execute("UPDATE pair SET v = 'uno' WHERE a = 1")
    conn.execute("UPDATE pair SET b = 'z' WHERE a = 2")  # a key change: an old key tuple
    conn.execute("INSERT INTO nokey VALUES ('a', 1.5), (NULL, NULL)")
    conn.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")
    conn.execute("UPDATE nokey SET n = 2.5")  # old rows: the record route's
    return Captured(conn, db)


def _format(kafka: KafkaStack | None, schemas: bool = False) -> Format:
    formatting = Formatting(debezium_schemas=schemas, database="app", host="db1")
    if kafka is None:
        return message_format(KafkaConfig("", format="debezium", formatting=formatting))
    formatting = Formatting(database="app", host="db1", debezium_avro=True)
    cfg = KafkaConfig(kafka.bootstrap_servers, format="debezium", formatting=formatting)
    return message_format(cfg, RegistryClient(kafka.registry_url))


def _compare(captured: Captured, fmt: Format, prefix: str) -> list[bytes]:
    """Each change through both routes: the row route's key and value are the record
    route's, or it declined; the values of the changes it wrote."""
    tables: dict[str, TableFormat] = {}
    encoders: dict[str, Encode | None] = {}
    for s in captured.schemas():
        tables[s.name] = fmt.table(s, f"{prefix}.{s.namespace}.{s.name}")
        encoders[s.name] = tables[s.name].row_encoder(captured.shapes[s.name])
        assert encoders[s.name] is not None, f"no row route for {s.name}"
    written: list[bytes] = []
    for data, m in captured.changes:
        encode = encoders[m.name]
        assert encode is not None
        got = encode(data, m.timestamp, m.sequence, m.lsn, m.xid, m.operation)
        if got is None:
            continue
        assert m.after is not None and m.before is None
        table = tables[m.name]
        assert got == (table.key(m.after), table.value(m)), m
        written.append(got[1])
    return written


@pytest.mark.parametrize("schemas", [False, True], ids=["json", "json-schemas"])
def test_json_envelopes_are_the_record_routes(captured: Captured, schemas: bool) -> None:
    written = _compare(captured, _format(None, schemas), "app")
    plain = [c for c in captured.changes if c[0][:1] == b"I" or c[1].before is None]
    # every insert of COMMON's values and both updates without old tuple: the row route
    assert len(written) >= 6 + 2 + 3 + 2
    assert len(plain) > len(written)  # some SPECIAL values were left to the record route
    payloads = [loads(v)["payload"] if schemas else loads(v) for v in written]
    assert {p["op"] for p in payloads} == {"c", "u"}
    toast = next(p for p in payloads if p["op"] == "u" and p["after"]["i4"] == -1)
    assert toast["after"]["big"] == UNAVAILABLE  # unchanged TOAST: Debezium's placeholder


def test_avro_envelopes_are_the_record_routes(
    captured: Captured, kafka_stack: KafkaStack, topic_prefix: str
) -> None:
    fmt = _format(kafka_stack)
    try:
        written = _compare(captured, fmt, topic_prefix)
    finally:
        fmt.close()
    assert len(written) >= 6 + 2 + 3 + 2


def test_old_tuples_take_the_record_route(captured: Captured) -> None:
    fmt = _format(None)
    old = [(d, m) for d, m in captured.changes if m.before is not None]
    assert {m.name for _, m in old} == {"pair", "nokey"}
    for data, m in old:
        s = next(s for s in captured.schemas() if s.name == m.name)
        encode = fmt.table(s, "app").row_encoder(captured.shapes[m.name])
        assert encode is not None
        assert encode(data, m.timestamp, m.sequence, m.lsn, m.xid, m.operation) is None
