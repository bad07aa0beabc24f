"""The Kinesis sink's import writer: an import's rows put by Spark's executors.

The driver puts the table's Schema record with a KinesisSink of its own and waits until
Kinesis stored it. Each task puts its partition's rows as IMPORT Modifications with a
KinesisSink of its own (the stream's payload: JSON, keyed by primary key; the same
batching and retries) and returns only when every one is stored: the partition is
marked done after that.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pg2sink.changelog.batches import ImportTable, write_modifications
from pg2sink.changelog.records import Schema
from pg2sink.errors import SinkError
from pg2sink.sinks.kinesis.config import KinesisConfig

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from pg2sink.sinks.kinesis.sink import KinesisSink

__all__ = ["KinesisImportTarget"]

#: Longest wait for a task's records to be stored, in seconds (the sender retries
#: throttled ones inside it).
DELIVERY_WAIT = 300.0


@dataclass(frozen=True)
class KinesisImportTarget:
    """The Kinesis sink's ImportTarget (sinks/base.py): the stream's settings."""

    cfg: KinesisConfig = dataclasses.field(repr=False)

    def problem(self) -> str | None:
        return None

    def begin(self, schema: Schema) -> KinesisImportTarget:
        """Put the table's Schema record and wait until it is stored."""
        sink = self._open()
        try:
            sink.write(schema)
            _wait_stored(sink, f"the Schema record of {schema.namespace}.{schema.name}")
        finally:
            sink.close()
        return self

    def write_rows(self, table: ImportTable, batches: Iterator[pa.RecordBatch]) -> int:
        """Put every row and wait until all are stored; the number of rows."""
        sink = self._open()
        try:
            sink.learn_table(table.schema)  # the driver put the Schema record once
            seq = write_modifications(table, batches, sink.write, sink.start_flush)
            s = table.schema
            _wait_stored(sink, f"the import's records of {s.namespace}.{s.name}")
        finally:
            sink.close()
        return seq

    def _open(self) -> KinesisSink:
        from pg2sink.sinks.kinesis.sink import KinesisSink

        sink = KinesisSink(self.cfg)
        sink.open()
        return sink


def _wait_stored(sink: KinesisSink, what: str) -> None:
    """Checkpoint everything `sink` was given and flush until Kinesis stored it all;
    SinkError naming `what` after DELIVERY_WAIT seconds."""
    sink.checkpoint(1)
    deadline = time.monotonic() + DELIVERY_WAIT
    while sink.flush() != 1:
        if time.monotonic() > deadline:
            raise SinkError(f"Kinesis did not store {what} within {DELIVERY_WAIT:.0f}s")
