"""The JSON form of each record kind (README "Records"), one line per record.

The file sink writes these lines; Kafka's JSON format and its schema and message topics
write the same objects. The sinks' writers of new rows (Sink.row_writer, file and NATS)
build the plain Modification's object with `NewRowLines`, the same keys in the same
order, and the golden files (tests/golden) hold both to the same bytes.
"""

from __future__ import annotations

from datetime import datetime

import orjson

from pg2sink.changelog.records import (
    Message,
    Modification,
    Operation,
    Record,
    Schema,
    Truncation,
)
from pg2sink.formats.jsonenc import LINE_OPTIONS, OPTIONS, default, dumps, dumps_line

__all__ = [
    "NewRowLines",
    "import_envelope",
    "message_object",
    "modification_object",
    "record_line",
    "schema_line",
]


def schema_line(record: Schema) -> bytes:
    """The JSON line of a Schema record."""
    return dumps_line(
        {
            "kind": "schema",
            "timestamp": record.timestamp,
            "lsn": record.lsn,
            "namespace": record.namespace,
            "name": record.name,
            "schema": record.schema,
        }
    )


def modification_object(m: Modification) -> dict[str, object]:
    """The JSON object of a Modification; a Truncation adds its options."""
    obj: dict[str, object] = {
        "kind": "modification",
        "timestamp": m.timestamp,
        "sequence": m.sequence,
        "lsn": m.lsn,
        "xid": m.xid,
        "operation": m.operation,
        "namespace": m.namespace,
        "name": m.name,
        "before": m.before,
        "after": m.after,
    }
    if isinstance(m, Truncation):
        obj["truncate"] = {"cascade": m.cascade, "restart_identity": m.restart_identity}
    return obj


class NewRowLines:
    """The JSON of one table's plain Modifications (an Insert's or Update's new row) from their
    fields, for a sink's RowWriter (sinks.base.WritesRows): `modification_object`'s
    object written as a dict (orjson writes a dict faster than a slotted dataclass),
    with the commit time, the same for every change of a transaction, formatted once per
    transaction and reused as a raw fragment. `newline`: a JSON line (the file sink) or
    the object alone (a NATS message)."""

    __slots__ = ("_name", "_namespace", "_options", "_timestamp", "_timestamp_json")

    def __init__(self, namespace: str, name: str, *, newline: bool) -> None:
        self._namespace = namespace
        self._name = name
        self._options = LINE_OPTIONS if newline else OPTIONS
        self._timestamp: object = None
        self._timestamp_json = orjson.Fragment(b"null")

    def encode(
        self,
        timestamp: datetime,
        sequence: int,
        lsn: int,
        xid: int,
        operation: Operation,
        after: dict[str, object],
    ) -> bytes:
        """The JSON of Modification(timestamp, sequence, lsn, xid, operation, namespace,
        name, None, after)."""
        if timestamp is not self._timestamp:
            self._timestamp = timestamp
            self._timestamp_json = orjson.Fragment(dumps(timestamp))
        return orjson.dumps(
            {
                "kind": "modification",
                "timestamp": self._timestamp_json,
                "sequence": sequence,
                "lsn": lsn,
                "xid": xid,
                "operation": operation,
                "namespace": self._namespace,
                "name": self._name,
                "before": None,
                "after": after,
            },
            default=default,
            option=self._options,
        )


def message_object(m: Message) -> dict[str, object]:
    """The JSON object of a Message record; `content` is base64 (docs/changes.md)."""
    return {
        "kind": "message",
        "timestamp": m.timestamp,
        "lsn": m.lsn,
        "xid": m.xid,
        "transactional": m.transactional,
        "prefix": m.prefix,
        "content": m.content,
    }


def record_line(record: Record) -> bytes:
    """The JSON line of any record."""
    if isinstance(record, Schema):
        return schema_line(record)
    if isinstance(record, Message):
        return dumps_line(message_object(record))
    return dumps_line(modification_object(record))


def import_envelope(schema: Schema) -> tuple[bytes, bytes]:
    """The constant parts of an import row's Modification line, around its sequence
    number and its row: `head + b"%d" % sequence + middle + row_json + b"}\\n"` is the
    line `record_line` writes for Modification(schema.timestamp, sequence, schema.lsn, 0,
    IMPORT, namespace, name, None, row). The keys, their order and the constant values
    are `modification_object`'s, each member encoded on its own."""
    obj = modification_object(
        Modification(
            schema.timestamp, 0, schema.lsn, 0, Operation.IMPORT, schema.namespace, schema.name,
            None, None,
        )
    )  # fmt: skip
    members = [dumps(key) + b":" + dumps(value) for key, value in obj.items()]
    keys = list(obj)
    sequence, after = keys.index("sequence"), keys.index("after")
    if after != len(keys) - 1:
        raise AssertionError("the row must be the last member of a Modification's object")
    head = b"{" + b"".join(m + b"," for m in members[:sequence]) + dumps("sequence") + b":"
    middle = b"".join(b"," + m for m in members[sequence + 1 : after]) + b"," + dumps("after")
    return head, middle + b":"
