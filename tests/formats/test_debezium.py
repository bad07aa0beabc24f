"""--format debezium (formats/debezium.py, debezium_types.py): the envelope of each
change of tests/formats/sample.py, its key, its Kafka Connect schemas, and the type
mapping of Debezium's PostgreSQL connector defaults."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from typing import Any

import pytest

from pg2sink import __version__
from pg2sink.changelog.codecs import Kind
from pg2sink.formats.base import Column, Origin
from pg2sink.formats.debezium_types import UNAVAILABLE, convert_value, field_type
from pg2sink.formats.registry import encoder
from pg2sink.logical.messages import UNCHANGED_TOAST
from tests.formats.sample import ANN, CHANGES, IMPORT, SCHEMA, json_form

ORIGIN = Origin("db1", "app", "pg2sink")

# Debezium 3's envelope (before, after, source, transaction, op, ts_ms, ts_us, ts_ns) with
# the source block of its PostgreSQL connector (version, connector, name, ts_ms, snapshot,
# db, sequence, ts_us, ts_ns, schema, table, txId, lsn, xmin, origin, origin_lsn).
# Values: numeric(10,2) 12.50 is Connect's
# Decimal, the unscaled 1250 = 0x04E2 big-endian in base64 "BOI=" (13.00: 1300 = 0x0514,
# "BRQ="); date 1990-02-28 is io.debezium.time.Date, days since 1970-01-01: 7363;
# timestamptz is ZonedTimestamp, UTC ISO 8601; jsonb a string (io.debezium.data.Json).
# ts_ms, ts_us, ts_ns: the commit time 2024-05-01T10:00:00.123456Z in milli-, micro- and
# nanoseconds.
SOURCE = (
    '"source":{{"version":"pg2sink-{version}","connector":"postgresql","name":"pg2sink",'
    '"ts_ms":1714557600123,"snapshot":"{snapshot}","db":"app","sequence":null,'
    '"ts_us":1714557600123456,"ts_ns":1714557600123456000,'
    '"schema":"public","table":"users","txId":{xid},"lsn":{lsn},"xmin":null,"origin":null,'
    '"origin_lsn":null}}'
)
ANN_JSON = (
    '{"id":1,"name":"Ann","score":"BOI=","active":true,"seen":"2024-05-01T09:30:00Z",'
    '"born":7363,"big":9007199254740993,"tags":["a",null],"doc":"{\\"k\\": 1}"}'
)
BO_JSON = (
    '{"id":1,"name":"Bo","score":"BRQ=","active":false,"seen":"2024-05-01T09:30:00Z",'
    '"born":7363,"big":9007199254740993,"tags":["a",null],"doc":"{\\"k\\": 1}"}'
)


def envelope(before: str, after: str, op: str, lsn: int, snapshot: str = "false") -> str:
    xid = "null" if op == "r" else "745"
    source = SOURCE.format(version=__version__, snapshot=snapshot, xid=xid, lsn=lsn)
    return (
        f'{{"before":{before},"after":{after},{source},"transaction":null,"op":"{op}",'
        '"ts_ms":1714557600123,"ts_us":1714557600123456,"ts_ns":1714557600123456000}'
    )


EXPECTED = {
    "insert": envelope("null", ANN_JSON, "c", 23803720),
    "update": envelope(ANN_JSON, BO_JSON, "u", 23803760),
    "delete": envelope(
        '{"id":1,"name":null,"score":null,"active":null,"seen":null,"born":null,"big":null,'
        '"tags":null,"doc":null}',
        "null",
        "d",
        23803800,
    ),
    "truncate": envelope("null", "null", "t", 23803840),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_envelope_of_each_change(change: str) -> None:
    table = encoder("debezium", ORIGIN).table(SCHEMA)
    m = CHANGES[change]
    assert table.value(m).decode() == EXPECTED[change]
    assert table.value(json_form(m)) == table.value(m)


def test_imported_rows_are_snapshot_reads() -> None:
    table = encoder("debezium", ORIGIN).table(SCHEMA)
    assert table.value(IMPORT).decode() == envelope("null", ANN_JSON, "r", 23803720, "true")


def test_key_and_schemas() -> None:
    """The key is the key columns' struct; with --debezium-schemas each document is
    JsonConverter's {"schema", "payload"}, named <prefix>.<schema>.<table>.Key/Envelope."""
    plain = encoder("debezium", ORIGIN).table(SCHEMA)
    assert plain.key(ANN) == b'{"id":1}'
    table = encoder("debezium", ORIGIN, debezium_schemas=True).table(SCHEMA)
    key = json.loads(table.key(ANN) or b"")
    assert key == {
        "schema": {
            "type": "struct",
            "fields": [{"type": "int32", "optional": False, "field": "id"}],
            "optional": False,
            "name": "pg2sink.public.users.Key",
        },
        "payload": {"id": 1},
    }
    value = json.loads(table.value(CHANGES["update"]))
    assert value["payload"] == json.loads(EXPECTED["update"])
    schema = value["schema"]
    assert schema["name"] == "pg2sink.public.users.Envelope"
    assert [f["field"] for f in schema["fields"]] == [
        "before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"
    ]  # fmt: skip
    assert schema["version"] == 2  # Debezium 3's envelope
    after = {f["field"]: f for f in schema["fields"][1]["fields"]}
    # a key column is NOT NULL: a required field, as in Debezium's schema
    assert after["id"] == {"type": "int32", "optional": False, "field": "id"}
    assert after["score"] == {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "score",
    }
    assert after["born"]["name"] == "io.debezium.time.Date"
    assert after["seen"]["name"] == "io.debezium.time.ZonedTimestamp"
    assert after["doc"]["name"] == "io.debezium.data.Json"
    assert after["tags"]["type"] == "array"
    assert schema["fields"][2]["name"] == "io.debezium.connector.postgresql.Source"


def column(pg_type: str, avro: dict[str, Any], kind: Kind | None) -> Column:
    return Column("c", pg_type, {**avro, "pg.type": pg_type}, kind, False)


TIMESTAMP = {"type": "long", "logicalType": "local-timestamp-micros"}
TIME = {"type": "long", "logicalType": "time-micros"}


@pytest.mark.parametrize(
    ("col", "value", "name", "expected"),
    [
        # time.precision.mode=adaptive: precision <= 3 milliseconds, else microseconds
        (column("timestamp", TIMESTAMP, Kind.TIMESTAMP), "2024-05-01T10:00:00.123456",
         "io.debezium.time.MicroTimestamp", 1714557600123456),
        (column("timestamp(3)", TIMESTAMP, Kind.TIMESTAMP), "2024-05-01T10:00:00.123",
         "io.debezium.time.Timestamp", 1714557600123),
        (column("timestamp", TIMESTAMP, Kind.TIMESTAMP), "infinity",
         "io.debezium.time.MicroTimestamp", None),
        (column("time", TIME, Kind.TIME), "12:34:56.5", "io.debezium.time.MicroTime",
         45296500000),
        (column("time(0)", TIME, Kind.TIME), "24:00:00", "io.debezium.time.Time", 86400000),
        # interval.handling.mode=numeric: a month is 365.25/12 days
        (column("interval", {"type": "string"}, Kind.TEXT), "P1M1DT1S",
         "io.debezium.time.MicroDuration", 2629800000000 + 86400000000 + 1000000),
        (column("uuid", {"type": "string", "logicalType": "uuid"}, Kind.UUID),
         "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "io.debezium.data.Uuid",
         "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        # decimal.handling.mode=precise: -1.5 at scale 2 is -150 = 0xFF6A
        (column("numeric(5,2)", {"type": "bytes", "logicalType": "decimal", "precision": 5,
                                 "scale": 2}, Kind.DECIMAL), Decimal("-1.5"),
         "org.apache.kafka.connect.data.Decimal", base64.b64encode(b"\xff\x6a").decode()),
        (column("numeric(5,2)", {"type": "bytes", "logicalType": "decimal", "precision": 5,
                                 "scale": 2}, Kind.DECIMAL), "NaN",
         "org.apache.kafka.connect.data.Decimal", None),
        # an unconstrained numeric: VariableScaleDecimal {scale, value}; 0.001 is 1 at 3
        (column("numeric", {"type": "string"}, Kind.NUMERIC), Decimal("0.001"),
         "io.debezium.data.VariableScaleDecimal", {"scale": 3, "value": "AQ=="}),
        (column("float8", {"type": "double"}, Kind.DOUBLE), "Infinity", None, None),
    ],
)  # fmt: skip
def test_type_mapping(col: Column, value: object, name: str | None, expected: object) -> None:
    ft = field_type(col)
    assert ft.schema.get("name") == name
    assert convert_value(ft, value) == expected


def test_unchanged_toast_is_the_placeholder_in_strings() -> None:
    text = field_type(column("text", {"type": "string"}, Kind.TEXT))
    number = field_type(column("int8", {"type": "long"}, Kind.LONG))
    assert convert_value(text, UNCHANGED_TOAST) == UNAVAILABLE
    assert convert_value(number, UNCHANGED_TOAST) is None
