"""Records → Kinesis entries: the partition key and the data of each record.

Partition keys (Kinesis hashes them to shards; one key's records stay in order):

| record                          | partition key                                        |
|---------------------------------|------------------------------------------------------|
| Modification of a keyed table   | its key columns as JSON, `{"id":1}` (Kafka's JSON key)|
| Modification of a table without | `schema.table`                                       |
| a key, TRUNCATE                 |                                                      |
| Schema                          | `schema.table`                                       |
| Message (--messages)            | its prefix (`pg2sink.messages` when empty)           |

The key columns are taken from the new row, or the old one of a DELETE (README
"Records"); a table's key columns come from its Schema record, which precedes its
changes. A key longer than Kinesis's 256 characters becomes `sha256:` and the hex
digest of its UTF-8: the same row always gets the same key.

The data is, with --format json (the default), the record's JSON line
(formats/jsonlines.py) without the newline, the file sink's and Kafka's JSON
(`json_data`). With another --format (formats/: pg-kinesis, wal-listener,
psql-streamer, debezium) a change is that format's message, Schema records are not put
(the seed tools' consumers read changes only; the stream's key columns are still
learnt from them), and messages (--messages) stay JSON lines. The keys, limits and
delivery stay as they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from pg2sink.changelog.records import Message, Modification, Operation, Record, Schema
from pg2sink.errors import SinkError
from pg2sink.formats.base import Encoder, Origin, TableEncoder, key_columns
from pg2sink.formats.jsonenc import dumps
from pg2sink.formats.jsonlines import record_line
from pg2sink.formats.registry import encoder
from pg2sink.sinks.kinesis.batching import MAX_KEY_CHARS, MAX_RECORD_BYTES, Entry
from pg2sink.sinks.kinesis.config import KinesisConfig

__all__ = ["MESSAGES_KEY", "Payload", "bounded_key", "json_data", "partition_key", "payload_for"]

#: The partition key of Message records whose prefix is empty.
MESSAGES_KEY = "pg2sink.messages"


def json_data(record: Record) -> bytes:
    """The record's JSON line without its newline (README "Records")."""
    return record_line(record)[:-1]


def bounded_key(key: str) -> str:
    """`key`, or its digest when Kinesis would refuse it as too long."""
    if len(key) <= MAX_KEY_CHARS:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def partition_key(m: Modification, key_columns: tuple[str, ...]) -> str:
    """The partition key of a change (see the module docstring)."""
    row: Mapping[str, object] | None = m.after
    if row is None and m.operation is Operation.DELETE:
        row = m.before
    if not key_columns or row is None:  # no key, or a TRUNCATE
        return f"{m.namespace}.{m.name}"
    return bounded_key(dumps({c: row.get(c) for c in key_columns}).decode())


class Payload:
    """Makes each record's Entry: its partition key and data (see the module docstring);
    `encoder`: the --format's, None for JSON lines."""

    def __init__(self, encoder: Encoder | None = None) -> None:
        self._encoder = encoder
        #: (schema, table) -> its key columns, in key order, from its Schema record
        self._keys: dict[tuple[str, str], tuple[str, ...]] = {}
        #: (schema, table) -> its encoder (with an `encoder` only)
        self._tables: dict[tuple[str, str], TableEncoder] = {}

    def learn(self, s: Schema) -> None:
        """Remember a table's key columns (its changes that follow are keyed by them)."""
        self._keys[(s.namespace, s.name)] = key_columns(s)
        if self._encoder is not None:
            self._tables[(s.namespace, s.name)] = self._encoder.table(s)

    def _data(self, m: Modification) -> bytes:
        """A change's data in the --format."""
        if self._encoder is None:
            return json_data(m)
        table = self._tables.get((m.namespace, m.name))
        if table is None:
            raise SinkError(f"change of {m.namespace}.{m.name} before its Schema record")
        return table.value(m)

    @property
    def puts_schemas(self) -> bool:
        """Whether Schema records are put (JSON lines only); else the sink only learns
        them."""
        return self._encoder is None

    def entry(self, record: Record) -> Entry:
        """The record's Entry; SinkError for one Kinesis cannot take (over 1 MiB)."""
        if isinstance(record, Modification):
            columns = self._keys.get((record.namespace, record.name), ())
            entry = Entry(partition_key(record, columns), self._data(record))
        elif isinstance(record, Schema):
            self.learn(record)
            entry = Entry(f"{record.namespace}.{record.name}", json_data(record))
        else:
            assert isinstance(record, Message)
            key = bounded_key(record.prefix) if record.prefix else MESSAGES_KEY
            entry = Entry(key, json_data(record))
        if entry.size > MAX_RECORD_BYTES:
            raise SinkError(_too_large(record, entry.size))
        return entry


def _too_large(record: Record, size: int) -> str:
    """The error of a record above MAX_RECORD_BYTES: what it is and what to do."""
    if isinstance(record, Message):
        what = f"a logical decoding message (prefix {record.prefix!r})"
    elif isinstance(record, Schema):
        what = f"the Schema record of {record.namespace}.{record.name}"
    else:
        what = f"a {record.operation} record of {record.namespace}.{record.name}"
    return (
        f"{what} is {size:,} bytes as a Kinesis record, data and partition key: Kinesis "
        f"takes at most {MAX_RECORD_BYTES:,} bytes a record; it stays unconfirmed and is "
        "sent again after a restart, so leave the table (or its large columns) out of "
        "the publication"
    )


def payload_for(cfg: KinesisConfig) -> Payload:
    """The payload of the config's --format."""
    if cfg.format == "json":
        return Payload()
    f = cfg.formatting
    origin = Origin(f.host, f.database, cfg.kinesis_stream)
    return Payload(encoder(cfg.format, origin, f.debezium_schemas))
