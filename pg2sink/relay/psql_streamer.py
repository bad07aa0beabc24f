"""psql-streamer's events (its Kafka sink's JSON, as formats/psql_streamer.py writes them)
back into records, without I/O, for `pg2sink relay` (docs/relay.md, "psql-streamer's
topics").

An event names its table but neither the table's schema nor its column types nor its key:

    {"Host":"db1","Database":"app","Table":"users","Action":"insert",
     "WALPosition":24023128,"Timestamp":"2024-05-01T10:00:00.123456Z",
     "UUID":"<uuid>","Columns":{"id":1,"name":"Ann"}}

So each table's Schema record is made from its events: the table in schema `public`
(psql-streamer dropped the schema name), its columns in the order they first appear,
each typed by its first non-null value (a JSON number: numeric, which holds integers and
fractions alike; a boolean: boolean; anything else: text, an object or array as its
JSON text) and text while only null has been seen; its key the columns the user names
with --relay-primary-key TABLE=COL[,COL...] (none otherwise: a keyless table). A
column first seen in a later event gives the table a new Schema record with it added at
the end. A value that does not fit its column's type (a string in a numeric column) is
an error naming the column: the message is unreadable (a dead letter, or the relay stops).

Action insert and update carry the new row in `after` (psql-streamer had no old row);
delete carries the old key in `before`: the columns the event set (psql-streamer sent
every column, null but the key's); truncate empties the table. WALPosition is the LSN;
Timestamp the commit time. psql-streamer had no transaction id: each event is a
transaction of its own (xid 0, sequence 0).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from pg2sink.catalog.types import PgType
from pg2sink.changelog.records import Modification, Operation, Schema, Truncation
from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for
from pg2sink.relay.decode import UnreadableError

__all__ = ["NAMESPACE", "EventTables", "is_event"]

#: the schema psql-streamer's tables are given (its events name none)
NAMESPACE = "public"

_NUMERIC = PgType(oid=1700, name="numeric", namespace="pg_catalog", kind="b", category="N")
_BOOL = PgType(oid=16, name="bool", namespace="pg_catalog", kind="b", category="B")
_TEXT = PgType(oid=25, name="text", namespace="pg_catalog", kind="b", category="S")

_ACTIONS = {
    "insert": Operation.INSERT,
    "update": Operation.UPDATE,
    "delete": Operation.DELETE,
    "truncate": Operation.TRUNCATE,
}
#: Go's time.Time JSON may carry nanoseconds; Python's datetime holds microseconds
_FRACTION = re.compile(r"(\.\d{6})\d+")


def is_event(obj: Mapping[str, Any]) -> bool:
    """Whether a JSON object is a psql-streamer event (pg2sink's records have "kind")."""
    return "kind" not in obj and "Action" in obj and "Table" in obj and "Columns" in obj


def _type_of(value: object) -> PgType:
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, int | float | Decimal):
        return _NUMERIC
    return _TEXT


def _value(column: str, pg: PgType, value: object) -> object:
    """`value` as the stream's value of a column of type `pg`."""
    if value is None:
        return None
    if pg is _TEXT:
        if isinstance(value, dict | list):
            return json.dumps(value, separators=(",", ":"), sort_keys=True)
        return value if isinstance(value, str) else json.dumps(value)
    if _type_of(value) is not pg:
        raise UnreadableError(
            f"column {column!r} is {pg.name} (its first value's type) but holds {value!r}"
        )
    return Decimal(value) if isinstance(value, int) and not isinstance(value, bool) else value


class _Table:
    """One table's columns and key, learnt from its events."""

    def __init__(self, name: str, key: tuple[str, ...]) -> None:
        self.name = name
        self.key = key
        self.types: dict[str, PgType] = {}

    def learn(self, columns: Mapping[str, object]) -> bool:
        """Add the columns not seen yet; whether any was."""
        new = [c for c in columns if c not in self.types]
        for c in new:
            self.types[c] = _type_of(columns[c]) if columns[c] is not None else _TEXT
        return bool(new)

    def schema(self, timestamp: datetime, lsn: int) -> Schema:
        columns = [RowColumn(c, codec_for(t, -1), c in self.key) for c, t in self.types.items()]
        row = avro_row_schema(NAMESPACE, self.name, columns, primary_key=self.key)
        return Schema(timestamp, lsn, NAMESPACE, self.name, row, primary_key=self.key)

    def row(self, columns: Mapping[str, object]) -> dict[str, object]:
        return {c: _value(c, t, columns.get(c)) for c, t in self.types.items()}


class EventTables:
    """The tables of the events relayed so far; `records` turns one event into records."""

    def __init__(self, keys: Mapping[str, tuple[str, ...]]) -> None:
        #: --relay-primary-key: table name (or public.name) -> key columns
        self._keys = dict(keys)
        self._tables: dict[str, _Table] = {}

    def records(self, obj: Mapping[str, Any]) -> tuple[Schema | None, Modification]:
        """The records of event `obj`: its table's Schema record when the event shows the
        table (or a column) for the first time (else None), and its change."""
        try:
            name, action = str(obj["Table"]), str(obj["Action"]).lower()
            columns = obj["Columns"] or {}
            lsn = int(obj["WALPosition"])
            timestamp = datetime.fromisoformat(_FRACTION.sub(r"\1", str(obj["Timestamp"])))
        except (KeyError, TypeError, ValueError) as e:
            raise UnreadableError(f"not a psql-streamer event: {e!r}") from None
        if timestamp.tzinfo is None:
            timestamp = timestamp.replace(tzinfo=UTC)
        operation = _ACTIONS.get(action)
        if operation is None or not isinstance(columns, dict):
            raise UnreadableError(f"not a psql-streamer event: action {action!r}")
        table = self._tables.get(name)
        if table is None:
            key = self._keys.get(name) or self._keys.get(f"{NAMESPACE}.{name}") or ()
            table = self._tables[name] = _Table(name, key)
        schema = None
        if operation is not Operation.TRUNCATE and table.learn(columns):
            schema = table.schema(timestamp, lsn)
        head = (timestamp, 0, lsn, 0, operation, NAMESPACE, name)
        if operation is Operation.TRUNCATE:
            return schema, Truncation(*head, None, None, cascade=False, restart_identity=False)
        if operation is Operation.DELETE:
            # the old key: the columns psql-streamer set (it sent the others as null)
            before = {c: v for c, v in table.row(columns).items() if columns.get(c) is not None}
            return schema, Modification(*head, before, None)
        return schema, Modification(*head, None, table.row(columns))
