"""What a NATS message carries: the encoding of each record kind, in one place.

`JsonPayload` (the only format so far) writes the file sink's JSON line of the record,
without its newline (changelog/jsonlines.py, README "Records"). Issue 14's other message
shapes (wal-listener's, pg_kinesis's...) become other classes with the same three
methods, chosen where the sink is made.
"""

from __future__ import annotations

from typing import Protocol

from pg2sink.changelog.jsonenc import dumps
from pg2sink.changelog.jsonlines import message_object, modification_object, schema_line
from pg2sink.changelog.records import Message, Modification, Schema

__all__ = ["JsonPayload", "Payload"]


class Payload(Protocol):
    """The bytes of each record kind's message."""

    #: whether row values should reach the sink in their JSON form (Sink.json_values)
    json_values: bool

    def change(self, m: Modification) -> bytes: ...

    def schema(self, s: Schema) -> bytes: ...

    def message(self, m: Message) -> bytes: ...


class JsonPayload:
    """The record's JSON line without the newline."""

    json_values = True

    def change(self, m: Modification) -> bytes:
        return dumps(modification_object(m))

    def schema(self, s: Schema) -> bytes:
        return schema_line(s)[:-1]

    def message(self, m: Message) -> bytes:
        return dumps(message_object(m))
