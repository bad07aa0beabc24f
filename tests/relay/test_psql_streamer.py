"""psql-streamer's events back into records (pg2sink/relay/psql_streamer.py), without
I/O: the events are the bytes formats/psql_streamer.py writes for the sample table
(tests/formats/sample.py), which tests/formats/test_seed_formats.py compares with what
psql-streamer's own code marshals."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from pg2sink.changelog.records import Operation, Truncation
from pg2sink.formats.base import Origin
from pg2sink.formats.jsonenc import loads
from pg2sink.formats.psql_streamer import PsqlStreamerEncoder
from pg2sink.relay.decode import UnreadableError
from pg2sink.relay.psql_streamer import EventTables, is_event
from tests.formats.sample import CHANGES, COMMIT, SCHEMA

ENCODER = PsqlStreamerEncoder(Origin("db1", "app")).table(SCHEMA)


def event(name: str) -> dict[str, object]:
    """The sample change `name` as psql-streamer's event, numbers exact."""
    obj = loads(ENCODER.value(CHANGES[name]), exact_numbers=True)
    assert isinstance(obj, dict) and is_event(obj)
    return obj


def test_events_become_the_changes_with_the_table_learnt_from_them() -> None:
    tables = EventTables({"users": ("id",)})
    schema, insert = tables.records(event("insert"))
    assert schema is not None and schema.namespace == "public" and schema.name == "users"
    assert schema.primary_key == ("id",)
    types = {f["pg.column"]: f["type"][1]["pg.type"] for f in schema.schema["fields"]}
    # JSON numbers are numeric, booleans bool, the rest (times, arrays, json) text
    assert types == {
        "active": "bool", "big": "numeric", "born": "text", "doc": "text", "id": "numeric",
        "name": "text", "score": "numeric", "seen": "text", "tags": "text",
    }  # fmt: skip
    assert insert.operation is Operation.INSERT and insert.before is None
    assert insert.timestamp == COMMIT and insert.lsn == CHANGES["insert"].lsn
    assert insert.after is not None
    assert insert.after["id"] == Decimal(1) and insert.after["score"] == Decimal("12.50")
    assert insert.after["big"] == Decimal(9007199254740993)  # no float on the way
    assert insert.after["tags"] == '["a",null]' and insert.after["born"] == "1990-02-28T00:00:00Z"

    schema, update = tables.records(event("update"))
    assert schema is None  # no new column: the table's Schema record stands
    assert update.operation is Operation.UPDATE and update.after is not None
    assert update.after["name"] == "Bo" and update.after["active"] is False

    _, delete = tables.records(event("delete"))
    assert delete.operation is Operation.DELETE and delete.after is None
    assert delete.before == {"id": Decimal(1)}  # the columns the event set: the key

    _, truncate = tables.records(event("truncate"))
    assert isinstance(truncate, Truncation) and truncate.name == "users"


def test_a_new_column_gives_a_new_schema_record_and_a_table_without_key_none() -> None:
    tables = EventTables({})
    schema, _ = tables.records(event("insert"))
    assert schema is not None and schema.primary_key == ()
    grown = {**event("update"), "Columns": {**event("update")["Columns"], "extra": "x"}}  # type: ignore[dict-item]
    schema, change = tables.records(grown)
    assert schema is not None
    assert [f["pg.column"] for f in schema.schema["fields"]][-1] == "extra"
    assert change.after is not None and change.after["extra"] == "x"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"Columns": {"id": "one"}}, "column 'id' is numeric"),
        ({"Action": "upsert"}, "action 'upsert'"),
        ({"WALPosition": "x"}, "not a psql-streamer event"),
        ({"Timestamp": "yesterday"}, "not a psql-streamer event"),
    ],
)
def test_what_cannot_be_read_is_an_error_naming_why(edit: dict[str, object], message: str) -> None:
    tables = EventTables({})
    tables.records(event("insert"))
    with pytest.raises(UnreadableError, match=message):
        tables.records({**event("update"), **edit})


def test_pg2sink_records_are_no_events() -> None:
    line = json.loads('{"kind":"modification","Action":"x","Table":"t","Columns":{}}')
    assert not is_event(line)
