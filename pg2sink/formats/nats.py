"""What a NATS message carries and where it goes: each record kind's encoding and a
table's subject, per --format, in one place.

`JsonPayload` (--format json, the default) writes the file sink's JSON line of the
record, without its newline (formats/jsonlines.py, README "Records"), to
`PREFIX.<schema>.<table>`. `FormatPayload` writes each change in another --format
(formats/: pg-kinesis, psql-streamer, debezium), table by table from their Schema
records, which it learns whether or not they are published; Schema records (on their
`.schema` subjects) and messages (--messages) stay pg2sink's JSON, no seed tool having
had them. `WalListenerPayload` (--format wal-listener) writes wal-listener's events to
the subjects wal-listener used, `PREFIX<schema>_<table>`, and publishes no Schema
record: a wal-listener consumer meets its tool's events only (formats/wal_listener.py).
"""

from __future__ import annotations

from typing import Protocol

from pg2sink.changelog.records import Message, Modification, Schema
from pg2sink.errors import SinkError
from pg2sink.formats.base import Encoder, TableEncoder
from pg2sink.formats.jsonenc import dumps
from pg2sink.formats.jsonlines import message_object, modification_object, schema_line
from pg2sink.formats.wal_listener import subject as wal_listener_subject

__all__ = ["FormatPayload", "JsonPayload", "Payload", "WalListenerPayload", "format_payload"]


class Payload(Protocol):
    """The bytes of each record kind's message, and the subject of a table's."""

    @property
    def schema_records(self) -> bool:
        """Whether Schema records are published (on `<table subject>.schema`)."""
        ...

    def subject(self, prefix: str, schema: str, table: str) -> str:
        """The subject of a table's changes from the prefix and the schema and table
        names, each already escaped into one subject token (sinks/nats/subjects.py)."""
        ...

    def learn(self, s: Schema) -> None:
        """Take a table's shape (its changes that follow are encoded by it)."""
        ...

    def change(self, m: Modification) -> bytes: ...

    def schema(self, s: Schema) -> bytes: ...

    def message(self, m: Message) -> bytes: ...


class JsonPayload:
    """The record's JSON line without the newline."""

    schema_records = True

    def subject(self, prefix: str, schema: str, table: str) -> str:
        return f"{prefix}.{schema}.{table}"

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


class WalListenerPayload(FormatPayload):
    """wal-listener's events on wal-listener's subjects; Schema records not published
    (wal-listener had none, and its subjects must carry its events only)."""

    schema_records = False

    def subject(self, prefix: str, schema: str, table: str) -> str:
        return wal_listener_subject(prefix, schema, table)


def format_payload(name: str, encoder: Encoder) -> Payload:
    """The payload of --format `name` (not json), whose encoder is `encoder`."""
    if name == "wal-listener":
        return WalListenerPayload(encoder)
    return FormatPayload(encoder)
