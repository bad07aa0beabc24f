"""--format debezium's primary key changes: an UPDATE that changed the row's key is sent
as Debezium's PostgreSQL connector sends it, a DELETE of the old key (followed by its
tombstone with --tombstones) and then a CREATE (`op: c`) of the new row under the new
key. A consumer that applies changes by the record key (Kafka Connect's JDBC sink
connector, log compaction) then drops the old key instead of keeping it beside the new
one, which an `op: u` under the new key would leave behind.

The key changed when the old image PostgreSQL sent (the old key with the default
REPLICA IDENTITY, sent only when the key changed; the whole old row with FULL) differs
from the new row in a key column. Both messages keep the change's LSN, transaction and
position: a checkpoint never falls between them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from pg2sink.changelog.records import Modification, Operation, Record, Schema
from pg2sink.formats.base import key_columns
from pg2sink.formats.kafka import Format
from pg2sink.logical.messages import UnchangedToast
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.sink import KafkaSink

__all__ = ["DebeziumKeyChanges", "with_key_changes"]


class DebeziumKeyChanges(KafkaSink):
    """A Kafka sink whose key-changing UPDATEs are a DELETE then a CREATE (see above)."""

    def __init__(self, cfg: KafkaConfig, fmt: Format | None = None) -> None:
        super().__init__(cfg, fmt)
        #: each table's key columns, from its latest Schema record
        self._key_columns: dict[tuple[str, str], tuple[str, ...]] = {}

    def write(self, record: Record) -> None:
        if isinstance(record, Schema):
            self._key_columns[(record.namespace, record.name)] = key_columns(record)
        elif (
            record.__class__ is Modification
            and isinstance(record, Modification)
            and record.operation is Operation.UPDATE
            and record.before is not None
            and self._key_changed(record)
        ):
            super().write(replace(record, operation=Operation.DELETE, after=None))
            super().write(replace(record, operation=Operation.INSERT, before=None))
            return
        super().write(record)

    def _key_changed(self, m: Modification) -> bool:
        before, after = m.before or {}, m.after or {}
        for column in self._key_columns.get((m.namespace, m.name), ()):
            new = after.get(column)
            if not isinstance(new, UnchangedToast) and before.get(column) != new:
                return True
        return False


_CLASSES: dict[type[KafkaSink], type[KafkaSink]] = {}


def with_key_changes(cls: type[KafkaSink]) -> type[KafkaSink]:
    """`cls` sending key changes as Debezium does (one class per base class)."""
    if cls not in _CLASSES:
        made = type(f"Debezium{cls.__name__}", (DebeziumKeyChanges, cls), {})
        _CLASSES[cls] = cast(type[KafkaSink], made)
    return _CLASSES[cls]
