"""pg2sink's Kafka messages back into records, without I/O: Avro and JSON.

The wire format (pg2sink.schema_registry.wire): magic byte 0, the writer schema's id as 4 bytes
big-endian, the Avro binary body. The Kafka sink's value schema is the Modification
envelope (changelog.avro_schema):

    record <ns>.<table>.Modification
      timestamp (timestamp-micros), sequence, lsn, xid, operation, namespace, name
      before, after      ["null", <ns>.<table>.value]   the Schema record's row record
      unchanged_toast    the `after` fields PostgreSQL did not send (UNCHANGED_TOAST)
      truncate           ["null", {cascade, restart_identity}]

so one envelope names everything a Schema record holds: its `before` branch is the row
record, whose "pg.namespace", "pg.table" and "pg.primary_key" name the table and its key.
`Shape` is one envelope version: the Schema record of that table shape, and the reader of
its messages.

Values come back as the stream's Python values (records.py): fastavro reads the
logical types (Decimal, date, time, datetime in UTC or naive), and what the Avro writer
changed is changed back: a value in a field's "string" branch (typemap.nullable: a
value outside T's domain, written as PostgreSQL's text) is a PgText, an unconstrained
numeric's string a Decimal, a uuid a str, an unchanged TOASTed field UNCHANGED_TOAST.

JSON (--format json, and the schema and message topics): a message is a record's JSON
line (formats/jsonlines.py) without its newline; `json_record` reads it back with the
values in their JSON form (ValueCodec.to_json's), the commit time a datetime.
A `before` image whose columns are null but the key's is the old key PostgreSQL sends
for REPLICA IDENTITY DEFAULT: only the key columns, as the stream has it (Avro cannot tell
it from a REPLICA IDENTITY FULL row whose other columns are all NULL, which comes back as
its key too: the same row for every sink, whose missing columns are NULL).
"""

from __future__ import annotations

import io
from binascii import a2b_base64
from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import fastavro

from pg2sink.changelog.codecs import Kind, kind_of
from pg2sink.changelog.pgvalues import PgText
from pg2sink.changelog.records import Message, Modification, Operation, Schema, Truncation
from pg2sink.errors import SinkError
from pg2sink.formats.jsonenc import loads
from pg2sink.logical.messages import UNCHANGED_TOAST
from pg2sink.schema_registry.wire import MAGIC_BYTE

__all__ = ["HEADER_BYTES", "Shape", "UnreadableError", "json_record", "record_of", "schema_id"]

#: magic byte and schema id
HEADER_BYTES = 5

Fix = Callable[[object], object]


class UnreadableError(SinkError):
    """A message that cannot become a record (not JSON, not an envelope of its schema,
    an unknown kind): the relay names its topic, partition and offset and sends it to
    the dead-letter topic, or stops (--relay-dead-letter-topic)."""


def schema_id(value: bytes) -> int | None:
    """The writer schema's id of a wire-format message; None for anything else (JSON)."""
    if len(value) < HEADER_BYTES or value[0] != MAGIC_BYTE:
        return None
    return int.from_bytes(value[1:HEADER_BYTES], "big")


def _as_is(value: object) -> object:
    return value


def _decimal(value: object) -> object:
    # an unconstrained numeric is an Avro string of its digits (NaN, Infinity too)
    return Decimal(value) if isinstance(value, str) else value


def _uuid(value: object) -> object:
    return str(value) if isinstance(value, UUID) else value


#: what the value of a field of each kind is changed back with (besides the text branch)
_FIXES: Mapping[Kind, Fix] = {Kind.NUMERIC: _decimal, Kind.UUID: _uuid}

#: the kinds whose own Avro type is a string: a str there is no PostgreSQL text
_STRING_KINDS = frozenset((Kind.TEXT, Kind.NUMERIC, Kind.UUID))


def _fix_for(avro: Any) -> Fix:
    """How a value of Avro type `avro` (a field's or an array item's, without "null")
    becomes the stream's value again."""
    if isinstance(avro, list):  # ["null", T] or ["null", T, "string"]
        inner, text = avro[1], len(avro) == 3
    else:
        inner, text = avro, False
    kind = kind_of(inner)
    fix = _FIXES.get(kind, _as_is)
    if kind is Kind.ARRAY:
        item = _fix_for(inner["items"])

        def fix(value: object) -> object:
            if isinstance(value, list):
                return [None if v is None else item(v) for v in value]
            return PgText(value) if isinstance(value, str) else value

        return fix
    if not text or kind in _STRING_KINDS:
        return fix
    inner_fix = fix
    return lambda value: PgText(value) if isinstance(value, str) else inner_fix(value)


class Shape:
    """One version of a table's envelope: its Schema record and the reader of its
    messages."""

    def __init__(self, envelope: Mapping[str, Any]) -> None:
        fields = {f["name"]: f for f in envelope["fields"]}
        self.row: dict[str, Any] = dict(fields["before"]["type"][1])
        self.namespace = str(self.row["pg.namespace"])
        self.name = str(self.row["pg.table"])
        self.primary_key = tuple(str(c) for c in self.row.get("pg.primary_key") or ())
        self._reader = fastavro.parse_schema(dict(envelope), named_schemas={})
        #: (Avro field, column, fix) of the row record
        self._columns = tuple(
            (f["name"], str(f["pg.column"]), _fix_for(f["type"])) for f in self.row["fields"]
        )
        #: the key columns (pg.key), and the Avro fields of the others
        self._key = tuple(str(f["pg.column"]) for f in self.row["fields"] if f.get("pg.key"))
        self._others = tuple(f["name"] for f in self.row["fields"] if not f.get("pg.key"))

    def schema(self, timestamp: datetime, lsn: int) -> Schema:
        """The Schema record of this shape, as of the change at `timestamp`, `lsn`."""
        return Schema(
            timestamp, lsn, self.namespace, self.name, self.row, primary_key=self.primary_key
        )

    def modification(self, value: bytes) -> Modification:
        """The Modification of a wire-format message value of this shape."""
        try:
            env = fastavro.schemaless_reader(io.BytesIO(value[HEADER_BYTES:]), self._reader, None)
        except (ValueError, TypeError, EOFError, IndexError) as e:
            raise UnreadableError(
                f"cannot read a message of {self.namespace}.{self.name} as its envelope: {e}"
            ) from None
        assert isinstance(env, dict)
        operation = Operation(env["operation"])
        toast = frozenset(env.get("unchanged_toast") or ())
        before = self._before(env["before"])
        after = self._row(env["after"], toast)
        head = (env["timestamp"], env["sequence"], env["lsn"], env["xid"], operation)
        if env.get("truncate") is not None:
            options = env["truncate"]
            return Truncation(
                *head, env["namespace"], env["name"], before, after,
                cascade=options["cascade"], restart_identity=options["restart_identity"],
            )  # fmt: skip
        return Modification(*head, env["namespace"], env["name"], before, after)

    def _before(self, record: object) -> dict[str, object] | None:
        """The old row, or only its key when the other columns are null (the old key of
        REPLICA IDENTITY DEFAULT, see the module docstring)."""
        row = self._row(record, frozenset())
        if row is None or not self._key:
            return row
        assert isinstance(record, dict)
        if any(record.get(field) is not None for field in self._others):
            return row
        return {column: row[column] for column in self._key}

    def _row(self, record: object, toast: frozenset[str]) -> dict[str, object] | None:
        """A row image keyed by column, the stream's values."""
        if record is None:
            return None
        assert isinstance(record, dict)
        row: dict[str, object] = {}
        for field, column, fix in self._columns:
            value = record.get(field)
            if field in toast:
                row[column] = UNCHANGED_TOAST
            else:
                row[column] = None if value is None else fix(value)
        return row


def _time(text: object) -> datetime:
    assert isinstance(text, str)
    return datetime.fromisoformat(text)


def json_record(value: bytes) -> Schema | Modification | Message:
    """The record of a JSON line (jsonlines.py), its values in their JSON form."""
    try:
        obj = loads(value)
    except ValueError as e:
        raise UnreadableError(f"a message is not JSON: {e}") from None
    return record_of(obj)


def record_of(obj: Any) -> Schema | Modification | Message:
    """The record of a JSON line's object (`json_record`)."""
    try:
        kind = obj["kind"]
        if kind == "schema":
            key = obj["schema"].get("pg.primary_key") or ()
            return Schema(
                _time(obj["timestamp"]), obj["lsn"], obj["namespace"], obj["name"],
                obj["schema"], primary_key=tuple(key),
            )  # fmt: skip
        if kind == "message":
            at = obj["timestamp"]
            return Message(
                None if at is None else _time(at), obj["lsn"], obj["xid"],
                obj["transactional"], obj["prefix"], a2b_base64(obj["content"]),
            )  # fmt: skip
        head = (
            _time(obj["timestamp"]), obj["sequence"], obj["lsn"], obj["xid"],
            Operation(obj["operation"]), obj["namespace"], obj["name"], obj["before"],
            obj["after"],
        )  # fmt: skip
        if kind != "modification":
            raise ValueError(f"unknown kind {kind!r}")
        options = obj.get("truncate")
        if options is not None:
            return Truncation(
                *head, cascade=options["cascade"], restart_identity=options["restart_identity"]
            )
        return Modification(*head)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UnreadableError(f"a message is not a pg2sink record's JSON line: {e!r}") from None
