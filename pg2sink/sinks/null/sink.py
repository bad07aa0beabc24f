"""The null sink: every record is accepted, counted and forgotten.

Nothing is kept, so nothing can be lost: a checkpoint is acknowledged as soon as it is
given, and the stream confirms it to PostgreSQL at its next status update. Every value
is still decoded and checked, as for the other sinks: an Insert's or Update's new row
through the sink's RowWriter (sinks.base.WritesRows, as the file sink's), read to Python
values without a Modification record being built for it, which the null sink would only
count.
"""

from __future__ import annotations

import logging
from datetime import datetime

from pg2sink.changelog.builder import RowWriter, TableShape
from pg2sink.changelog.records import Operation, Record

log = logging.getLogger(__name__)

__all__ = ["NullSink"]


class NullSink:
    """A Sink (sinks/base.py) that discards: see the module docstring."""

    def __init__(self) -> None:
        self.records = 0
        """Records written since open()."""
        self._checkpoint: int | None = None

    def open(self) -> None:
        self.records = 0

    def write(self, record: Record) -> None:
        self.records += 1

    def row_writer(self, table: TableShape) -> RowWriter:
        read = table.reader()

        def write(
            data: bytes, timestamp: datetime, sequence: int, lsn: int, xid: int, op: Operation
        ) -> bool:
            if read(data) is None:
                return False  # a record then: decoded on the general path, and counted
            self.records += 1
            return True

        return write

    def checkpoint(self, lsn: int) -> None:
        self._checkpoint = lsn

    def start_flush(self) -> None:
        pass

    def pending_bytes(self) -> int:
        return 0

    def flush(self) -> int | None:
        return self._checkpoint

    def acknowledged(self) -> int | None:
        return self._checkpoint

    def close(self) -> None:
        log.info("null sink closed: %d records discarded", self.records)
