"""relay.decode: the Kafka sink's Avro messages (its own TableEncoder's bytes) read back
into the records the stream wrote: the same values, TOAST markers, TRUNCATE options and
the table shape's Schema record."""

from __future__ import annotations

from typing import Any

import pytest

from pg2sink.changelog.pgvalues import PgText
from pg2sink.changelog.records import Message, Operation, Schema, Truncation
from pg2sink.errors import SinkError
from pg2sink.formats.avro import TableEncoder
from pg2sink.formats.jsonlines import record_line
from pg2sink.logical.messages import UNCHANGED_TOAST
from pg2sink.relay.decode import Shape, json_record, schema_id
from pg2sink.schema_registry import wire_header
from tests.changelog.test_avro import TEXT, T, decode_row, modification, row_schema


def encoded(m: Any, schema_id: int = 7) -> tuple[Shape, bytes]:
    """The Shape of the table's envelope and `m` as the Kafka sink writes it."""
    encoder = TableEncoder("public", "all types", row_schema(), ("id", "order id"))
    return Shape(encoder.value), encoder.encode_value(m, header=wire_header(schema_id))


def test_every_common_type_comes_back_as_the_streams_value() -> None:
    row = decode_row(TEXT)
    shape, value = encoded(modification(row))
    assert schema_id(value) == 7
    got = shape.modification(value)
    assert got == modification(row)
    assert got.after is not None
    assert {k: type(v) for k, v in got.after.items()} == {k: type(v) for k, v in row.items()}


def test_the_schema_record_is_the_streams() -> None:
    shape, _ = encoded(modification(decode_row(TEXT)))
    assert shape.schema(T, 5) == Schema(
        T, 5, "public", "all types", row_schema(), primary_key=("id", "order id")
    )


@pytest.mark.parametrize(
    ("column", "text"),
    [("d", b"infinity"), ("n", b"NaN"), ("tm", b"24:00:00"), ("ts", b"-infinity")],
)
def test_a_value_in_the_text_branch_is_postgresql_text_again(column: str, text: bytes) -> None:
    row = decode_row({"id": b"1", column: text})
    shape, value = encoded(modification(row))
    got = shape.modification(value).after
    assert got is not None
    assert got[column] == text.decode() and isinstance(got[column], PgText)


def test_unchanged_toast_and_a_key_only_before_image() -> None:
    after = decode_row({**dict.fromkeys(TEXT), "id": b"1", "order id": b"2"})
    after["t"] = UNCHANGED_TOAST
    before = decode_row({"id": b"9", "order id": b"2"})
    m = modification(after, before, Operation.UPDATE)
    shape, value = encoded(m)
    got = shape.modification(value)
    assert got.after is not None and got.after["t"] is UNCHANGED_TOAST
    assert got == m


def test_a_truncate_keeps_its_options() -> None:
    t = Truncation(T, 0, 10, 11, Operation.TRUNCATE, "public", "all types", None, None, True)
    shape, value = encoded(t)
    assert shape.modification(value) == t


def test_json_and_torn_messages() -> None:
    assert schema_id(b'{"kind": "modification"}') is None
    assert schema_id(b"\x00\x00") is None
    shape, value = encoded(modification(decode_row(TEXT)))
    with pytest.raises(SinkError, match=r"cannot read a message of public\.all types"):
        shape.modification(value[:12])


def test_json_lines_come_back_as_their_records() -> None:
    """record_line's bytes (the Kafka sink's JSON values, without the newline) read back
    give the same line again: the record with its values in their JSON form."""
    schema = Schema(T, 5, "public", "all types", row_schema(), primary_key=("id", "order id"))
    change = modification({"id": 1, "t": "x", "ai": [1, None]})
    truncation = Truncation(T, 0, 10, 11, Operation.TRUNCATE, "public", "t", None, None, True)
    message = Message(None, 12, None, False, "p", b"\x00\xff")
    for record in (schema, change, truncation, message):
        line = record_line(record)
        again = json_record(line.rstrip(b"\n"))
        assert type(again) is type(record) and record_line(again) == line
    with pytest.raises(SinkError, match="not a pg2sink record's JSON line"):
        json_record(b'{"kind": "other"}')
