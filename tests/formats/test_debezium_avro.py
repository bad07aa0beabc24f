"""--format debezium --debezium-avro (formats/debezium_avro.py): the Avro schemas of
Debezium's envelope by AvroConverter's rules, and the events read back through the
registry by confluent-kafka's AvroDeserializer."""

from __future__ import annotations

import io
import json
from base64 import b64decode
from collections.abc import Callable
from datetime import date
from decimal import Decimal
from typing import Any

import fastavro
import pytest

from pg2sink.formats.base import Origin
from pg2sink.formats.debezium import DebeziumEncoder
from pg2sink.formats.debezium_avro import avro_schema, avro_value
from tests.conftest import Database, KafkaStack
from tests.formats.sample import CHANGES, SCHEMA
from tests.sinks.kafka.test_kafka import Reader, reader, registry_get, start  # noqa: F401
from tests.support import Proc

TABLE = DebeziumEncoder(Origin("db1", "app", "app")).table(SCHEMA)


def fields(record: dict[str, Any]) -> dict[str, Any]:
    return {f["name"]: f for f in record["fields"]}


def test_envelope_schema_by_avro_converter_rules() -> None:
    envelope = avro_schema(TABLE.value_schema)
    assert (envelope["name"], envelope["namespace"]) == ("Envelope", "app.public.users")
    assert envelope["connect.name"] == "app.public.users.Envelope"
    top = fields(envelope)
    assert list(top) == [
        "before",
        "after",
        "source",
        "transaction",
        "op",
        "ts_ms",
        "ts_us",
        "ts_ns",
    ]
    value = top["before"]["type"][1]
    assert top["before"]["default"] is None and top["before"]["type"][0] == "null"
    assert (value["name"], value["namespace"]) == ("Value", "app.public.users")
    # a record is defined once; the second use refers to it by its full name
    assert top["after"]["type"] == ["null", "app.public.users.Value"]
    row = fields(value)
    assert row["score"]["type"] == [
        "null",
        {
            "type": "bytes",
            "connect.version": 1,
            "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
            "connect.name": "org.apache.kafka.connect.data.Decimal",
            "logicalType": "decimal",
            "precision": 10,
            "scale": 2,
        },
    ]
    born = row["born"]["type"][1]
    assert born == {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}
    assert row["tags"]["type"] == ["null", {"type": "array", "items": ["null", "string"]}]
    source = top["source"]["type"]
    assert (source["name"], source["namespace"]) == ("Source", "io.debezium.connector.postgresql")
    # a field with a Connect default: its type first in the union, the default kept
    snapshot = fields(source)["snapshot"]
    assert snapshot["default"] == "false" and snapshot["type"][1] == "null"
    assert snapshot["type"][0]["connect.name"] == "io.debezium.data.Enum"
    key = avro_schema(TABLE.key_schema or {})
    assert key["name"] == "Key" and key["fields"] == [{"name": "id", "type": "int"}]


def from_json(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """A JSON payload's row with its numeric(10,2) as the Decimal Avro's type decodes."""
    if row is None or row.get("score") is None:
        return row
    unscaled = int.from_bytes(b64decode(row["score"]), "big", signed=True)
    return {**row, "score": Decimal(unscaled).scaleb(-2)}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_values_round_trip_through_avro(change: str) -> None:
    """The Avro body decodes to the JSON payload's values."""
    m = CHANGES[change]
    schema = fastavro.parse_schema(avro_schema(TABLE.value_schema))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, avro_value(TABLE.value_schema, TABLE.payload(m)))
    out.seek(0)
    back: Any = fastavro.schemaless_reader(out, schema, schema)
    want = json.loads(TABLE.value(m))
    want["before"], want["after"] = from_json(want["before"]), from_json(want["after"])
    assert back == want
    if change == "insert":
        assert back["after"]["score"] == Decimal("12.50")


@pytest.mark.slow
def test_read_back_by_confluent_avro_deserializer(
    db: Database,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    reader: Callable[..., Reader],  # noqa: F811 (test_kafka's fixture, imported)
) -> None:
    conn = db.connect()
    conn.execute(
        "CREATE TABLE items (id int PRIMARY KEY, price numeric(8,2), at timestamp,"
        " d date, doc jsonb, raw bytea, n numeric, s smallint)"
    )
    p = start(pg2sink_proc, kafka_stack, topic_prefix, "--format", "debezium", "--debezium-avro")
    conn.execute(
        "INSERT INTO items VALUES (7, 1.50, '2024-05-01 10:00:00.25', '2024-02-29',"
        " '{\"k\": 1}', '\\x00ff', 0.001, -3)"
    )
    conn.execute("UPDATE items SET id = 8 WHERE id = 7")
    topic = f"{topic_prefix}.public.items"
    got = reader(topic).read(3)
    assert [m.value["op"] for m in got] == ["c", "d", "c"]
    assert [m.key for m in got] == [{"id": 7}, {"id": 7}, {"id": 8}]
    after = got[0].value["after"]
    assert after == {
        "id": 7,
        "price": Decimal("1.50"),  # the decimal logical type
        "at": 1714557600250000,  # io.debezium.time.MicroTimestamp
        "d": (date(2024, 2, 29) - date(1970, 1, 1)).days,  # io.debezium.time.Date
        "doc": '{"k": 1}',
        "raw": b"\x00\xff",
        "n": {"scale": 3, "value": b"\x01"},  # io.debezium.data.VariableScaleDecimal
        "s": -3,
    }
    assert got[1].value["before"]["id"] == 7 and got[1].value["after"] is None
    source = got[0].value["source"]
    assert (source["schema"], source["table"], source["snapshot"]) == ("public", "items", "false")
    subject = registry_get(kafka_stack, f"subjects/{topic}-value/versions/latest")
    schema = json.loads(subject["schema"])
    assert schema["connect.name"] == f"{topic}.Envelope"
    assert p.stop() == 0
