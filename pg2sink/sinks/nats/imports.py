"""The NATS sink's import target: an import's rows published by Spark's executors.

The driver publishes the table's Schema record with a NatsSink of its own and waits for
JetStream's acknowledgement. Each executor task publishes its partition's rows with a
NatsSink of its own (the stream's subjects and payloads, Schema records not published
again) and returns only when JetStream acknowledged every message: the partition is
marked done after that. Rows of a table with a primary key carry a Nats-Msg-Id of the
snapshot's position and the key (subjects.py), so a retried partition's rows are stored
once within the stream's duplicate window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pg2sink.changelog.batches import ImportTable, write_modifications
from pg2sink.changelog.records import Schema
from pg2sink.sinks.nats.config import NatsConfig

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["NatsImportTarget"]


@dataclass(frozen=True)
class NatsImportTarget:
    """The NATS sink's ImportTarget (sinks/base.py)."""

    cfg: NatsConfig = dataclasses.field(repr=False)
    """The stream's NATS settings (holds secrets: never logged)."""

    def problem(self) -> str | None:
        return None

    def begin(self, schema: Schema) -> NatsImportTarget:
        """Publish the Schema record and wait for its acknowledgement."""
        from pg2sink.sinks.nats.sink import NatsSink

        sink = NatsSink(self.cfg)
        sink.open()
        try:
            sink.write(schema)
            sink.publish_all(f"the Schema record of {schema.namespace}.{schema.name}")
        finally:
            sink.close()
        return self

    def write_rows(self, table: ImportTable, batches: Iterator[pa.RecordBatch]) -> int:
        """Publish every row and wait for every acknowledgement; the number of rows."""
        from pg2sink.sinks.nats.sink import NatsSink

        sink = NatsSink(self.cfg, schemas=False)
        sink.open()
        try:
            sink.write(table.schema)
            seq = write_modifications(table, batches, sink.write)
            s = table.schema
            sink.publish_all(f"the import's messages of {s.namespace}.{s.name}")
        finally:
            sink.close()
        return seq
