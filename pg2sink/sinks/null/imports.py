"""The null sink's import target: an import's rows are decoded, counted and discarded.

The rows go through the stream's converters (changelog/batches.py BatchDecoder), so an
import with the null sink measures reading and decoding, and a value PostgreSQL's text
cannot be decoded from still fails the partition as it would with any other sink.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pg2sink.changelog.batches import BatchDecoder, ImportTable
from pg2sink.changelog.records import Schema

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["NullImportTarget"]


@dataclass(frozen=True)
class NullImportTarget:
    """The null sink's ImportTarget (sinks/base.py): no settings, nothing written."""

    def problem(self) -> str | None:
        return None

    def begin(self, schema: Schema) -> NullImportTarget:
        return self

    def write_rows(self, table: ImportTable, batches: Iterator[pa.RecordBatch]) -> int:
        """Decode every row of the batches; their number."""
        rows = BatchDecoder(table).rows
        return sum(1 for batch in batches for _ in rows(batch))
