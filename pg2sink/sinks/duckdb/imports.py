"""The DuckDB sink's ImportTarget: imports do not write to DuckDB yet.

DuckDB is single-writer: the stream's process holds the file, so Spark's executors
cannot load rows into it themselves. The design that fits (docs/sinks/duckdb.md "What is
left") is executors writing Parquet into a staging directory next to the database and
the stream loading each partition's file into the raw table in one transaction. Until
then `problem()` says so, and import jobs stay pending with that warning.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pg2sink.changelog.batches import ImportTable
from pg2sink.changelog.records import Schema
from pg2sink.errors import SinkError

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["DuckDBImportTarget"]


@dataclass(frozen=True)
class DuckDBImportTarget:
    """The duckdb sink's ImportTarget (sinks/base.py): refuses, saying why."""

    path: str
    json_values = False

    def problem(self) -> str | None:
        return (
            "imports cannot write to --sink duckdb yet (DuckDB has one writer, the stream): "
            "the tables' existing rows are not copied; run with --no-imports, or import "
            "with --sink file/kafka"
        )

    def begin(self, schema: Schema) -> DuckDBImportTarget:
        raise SinkError(self.problem() or "")

    def write_rows(self, table: ImportTable, batches: Iterator[pa.RecordBatch]) -> int:
        raise SinkError(self.problem() or "")
