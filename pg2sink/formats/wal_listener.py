"""wal-listener's event (--format wal-listener), as its NATS publisher wrote it.

Derived from wal-listener's code at the version the seed's README describes
(github.com/ihippik/wal-listener, 261cd6e, January 2021: NATS Streaming, the publication
`wal-listener`; the event is unchanged since af9ed41 but for NULL, below):
listener/nats_publisher.go's Event struct with its easyjson tags, in this order:

    {"id":"<uuid>","schema":"public","table":"users","action":"INSERT",
     "data":{"id":1,"name":"Ann"},"commitTime":"2024-05-01T10:00:00.123456Z"}

- action: INSERT, UPDATE, DELETE (ActionKind); data: the new row, the old one (key, or
  the whole row with REPLICA IDENTITY FULL) for DELETE.
- data values (listener/wal_transaction.go, Column.AssertValue): bool a JSON boolean,
  int4 a JSON number, NULL null, every other type a string, the value's text
  (base.pg_text: PostgreSQL's own for numbers, text, dates, timestamps, bytea;
  base.pg_array_text: array_out's for arrays, `{a,NULL}`; ISO 8601 for intervals).
- commitTime: the transaction's commit time as Go writes a time.Time (gotime.go_time).
- subject (Event.GetSubjectName): `<topicPrefix><schema>_<table>`, the prefix and the
  schema with nothing between them (`subject`).

Where pg2sink differs, on purpose (docs/formats.md): id is a name-based UUID of the
change (the same after a replay) instead of a random one; an unchanged TOASTed value is
left out of data (wal-listener wrote null, as for a NULL); TRUNCATE is sent, with empty
data (wal-listener logged an unknown message type and sent nothing); imported rows are
INSERTs.
"""

from __future__ import annotations

from collections.abc import Mapping

from pg2sink.changelog.codecs import Kind
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.formats.base import (
    TableEncoder,
    columns_of,
    item_kind,
    key_columns,
    key_of,
    pg_array_text,
    pg_text,
)
from pg2sink.formats.gotime import go_time, message_uuid
from pg2sink.formats.jsonenc import dumps
from pg2sink.logical.messages import UnchangedToast

__all__ = ["WalListenerEncoder", "action", "subject"]


def action(m: Modification) -> str:
    """wal-listener's ActionKind of a change (an imported row is an INSERT)."""
    return "INSERT" if m.operation is Operation.IMPORT else str(m.operation)


def subject(prefix: str, schema: str, table: str) -> str:
    """wal-listener's subject of a table's events: its topicPrefix, the schema, `_`, the
    table (`pre`, `public`, `users`: `prepublic_users`)."""
    return f"{prefix}{schema}_{table}"


def data_row(m: Modification) -> Mapping[str, object] | None:
    """The row a change's data is: the new one, the old one of a DELETE."""
    return m.before if m.operation is Operation.DELETE else m.after


class _WalListenerTable:
    __slots__ = ("_arrays", "_keys", "_texts")

    def __init__(self, schema: Schema) -> None:
        self._keys = key_columns(schema)
        columns = columns_of(schema)
        #: the array columns -> their elements' kind: PostgreSQL's array text
        self._arrays = {c.name: item_kind(c) for c in columns if c.avro.get("type") == "array"}
        #: column -> its kind, for the other columns whose values are PostgreSQL's text
        #: (all but bool and int4, which AssertValue parsed)
        self._texts = {
            c.name: c.kind
            for c in columns
            if c.kind is not Kind.BOOLEAN and c.pg_type != "int4" and c.name not in self._arrays
        }

    def key(self, row: Mapping[str, object]) -> bytes | None:
        return key_of(self._keys, row)

    def value(self, m: Modification) -> bytes:
        data: dict[str, object] = {}
        texts, arrays = self._texts, self._arrays
        for name, value in (data_row(m) or {}).items():
            if isinstance(value, UnchangedToast):
                continue  # not sent by PostgreSQL: no value to write
            if name in texts:
                value = pg_text(value, texts[name])
            elif name in arrays:
                value = pg_array_text(value, arrays[name])
            data[name] = value
        return dumps(
            {
                "id": message_uuid(m),
                "schema": m.namespace,
                "table": m.name,
                "action": action(m),
                "data": data,
                "commitTime": go_time(m.timestamp),
            }
        )


class WalListenerEncoder:
    """--format wal-listener."""

    def table(self, schema: Schema) -> TableEncoder:
        return _WalListenerTable(schema)
