"""What a NATS message carries: the encoding of each record kind, in one place.

`JsonPayload` (--format json, the default) writes the file sink's JSON line of the
record, without its newline (formats/jsonlines.py, README "Records"). `FormatPayload`
writes each change in another --format (formats/: pg-kinesis, wal-listener,
psql-streamer, debezium), table by table from their Schema records, which it learns
whether or not they are published; Schema records (on their `.schema` subjects) and
messages (--messages) stay pg2sink's JSON, no seed tool having had them.
"""

from __future__ import annotations

from typing import Protocol

from pg2sink.changelog.records import Message, Modification, Schema
from pg2sink.errors import SinkError
from pg2sink.formats.base import Encoder, TableEncoder
from pg2sink.formats.jsonenc import dumps
from pg2sink.formats.jsonlines import message_object, modification_object, schema_line

__all__ = ["FormatPayload", "JsonPayload", "Payload"]


class Payload(Protocol):
    """The bytes of each record kind's message."""

    def learn(self, s: Schema) -> None:
        """Take a table's shape (its changes that follow are encoded by it)."""
        ...

    def change(self, m: Modification) -> bytes: ...

    def schema(self, s: Schema) -> bytes: ...

    def message(self, m: Message) -> bytes: ...


class JsonPayload:
    """The record's JSON line without the newline."""

    def learn(self, s: Schema) -> None:
        pass  # the JSON line needs no table shape

    def change(self, m: Modification) -> bytes:
        return dumps(modification_object(m))

    def schema(self, s: Schema) -> bytes:
        return schema_line(s)[:-1]

    def message(self, m: Message) -> bytes:
        return dumps(message_object(m))


class FormatPayload(JsonPayload):
    """Changes in a formats/ encoder's shape; Schema records and messages as JsonPayload."""

    def __init__(self, encoder: Encoder) -> None:
        self._encoder = encoder
        self._tables: dict[tuple[str, str], TableEncoder] = {}

    def learn(self, s: Schema) -> None:
        self._tables[(s.namespace, s.name)] = self._encoder.table(s)

    def change(self, m: Modification) -> bytes:
        table = self._tables.get((m.namespace, m.name))
        if table is None:
            raise SinkError(f"change of {m.namespace}.{m.name} before its Schema record")
        return table.value(m)
