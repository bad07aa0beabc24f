"""psql-streamer's event (--format psql-streamer), as its Kafka passthrough handler wrote it.

Derived from psql-streamer's code (github.com/blind-oracle/psql-streamer, event/event.go,
source/postgres/postgres.go generateEvent, sink/kafka/passthrough.go): `json.Marshal` of
the Event struct, whose fields carry no tags, so the keys are the field names in
declaration order, and Columns is a Go map, whose keys json.Marshal sorts:

    {"Host":"db1","Database":"app","Table":"users","Action":"insert",
     "WALPosition":24023128,"Timestamp":"2024-05-01T10:00:00.123456Z",
     "UUID":"<uuid>","Columns":{"id":1,"name":"Ann"}}

- Host and Database: the source connection's (`unknown` for an empty host, as there);
  Table: the table's name without its schema; Action: insert, update, delete.
- WALPosition: the change's LSN as a number; Columns: the new row, the old one for
  DELETE: every column of the table, the key's set and the rest null (the whole row with
  REPLICA IDENTITY FULL), as the tool decoded pgoutput's old-key tuple.
- Values as pgx decoded them: numbers, booleans, strings and null as such; timestamps as
  Go's time.Time JSON (pgx reads a timestamp without time zone as UTC, and a date as
  its midnight UTC).

Where pg2sink differs, on purpose (docs/formats.md): Timestamp is the commit time (the
tool took the clock when it decoded the change) in UTC; UUID is a name-based UUID of the
change instead of a random one; columns of the types psql-streamer skipped (numeric,
uuid, json, arrays...) are present, in pg2sink's JSON form; bytea is base64 (the tool
wrote the raw bytes as a string); an unchanged TOASTed value is left out; TRUNCATE is
sent as action "truncate" with no columns (the tool ignored it); imported rows are inserts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pg2sink.changelog.codecs import Kind
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.formats.base import (
    Origin,
    TableEncoder,
    columns_of,
    json_of,
    key_columns,
    key_of,
)
from pg2sink.formats.gotime import go_time, message_uuid
from pg2sink.formats.jsonenc import dumps
from pg2sink.formats.wal_listener import data_row
from pg2sink.logical.messages import UnchangedToast

__all__ = ["PsqlStreamerEncoder"]

#: a date or timestamp pg2sink writes in ISO form (not infinity, BC, year > 9999)
_ISO = re.compile(r"^\d{4}-\d\d-\d\d(T[\d:.]+)?$")


def _as_go_time(value: object, kind: Kind | None) -> object:
    """A date or timestamp (without time zone) as pgx's time.Time in UTC writes it."""
    if not isinstance(value, str) or not _ISO.match(value):
        return value
    return value + "Z" if kind is Kind.TIMESTAMP else value + "T00:00:00Z"


class _PsqlStreamerTable:
    __slots__ = ("_columns", "_head", "_keys", "_times")

    def __init__(self, schema: Schema, origin: Origin) -> None:
        self._keys = key_columns(schema)
        #: every column: a DELETE's Columns hold each (null but the key's), as pgoutput's
        #: old-key tuple decoded by the tool did
        self._columns = tuple(c.name for c in columns_of(schema))
        self._head = (origin.host or "unknown", origin.database, schema.name)
        #: the date and timestamp columns, whose values pgx made a time.Time
        self._times = {
            c.name: c.kind for c in columns_of(schema) if c.kind in (Kind.DATE, Kind.TIMESTAMP)
        }

    def key(self, row: Mapping[str, object]) -> bytes | None:
        return key_of(self._keys, row)

    def value(self, m: Modification) -> bytes:
        row = data_row(m) or {}
        if m.operation is Operation.DELETE:
            row = {**dict.fromkeys(self._columns), **row}
        columns: dict[str, object] = {}
        for name in sorted(row):  # Go's json.Marshal sorts a map's keys
            value = row[name]
            if isinstance(value, UnchangedToast):
                continue
            if name in self._times:
                value = _as_go_time(json_of(value), self._times[name])
            columns[name] = value
        host, database, table = self._head
        return dumps(
            {
                "Host": host,
                "Database": database,
                "Table": table,
                "Action": "insert" if m.operation is Operation.IMPORT else m.operation.lower(),
                "WALPosition": m.lsn,
                "Timestamp": go_time(m.timestamp),
                "UUID": message_uuid(m),
                "Columns": columns,
            }
        )


class PsqlStreamerEncoder:
    """--format psql-streamer."""

    def __init__(self, origin: Origin) -> None:
        self._origin = origin

    def table(self, schema: Schema) -> TableEncoder:
        return _PsqlStreamerTable(schema, self._origin)
