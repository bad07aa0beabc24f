"""The BigQuery sink's imports: executors load staging tables, the stream's sink moves
their rows into the raw tables (docs/sinks/bigquery.md "Imports").

Positions order a raw table's rows, and only the stream's sink gives them; so, as the
DuckDB sink's executors stage Parquet files (pg2sink.sinks.duckdb.imports), each
executor loads its partition's IMPORT rows (the same conversion as the stream's rows) into
a staging table `_pg2sink_import_<id>` of its own by one load job, then records the
table's Schema record and staging layout in `_pg2sink_imports` (a DML INSERT: load jobs
have a daily quota per table). A partition is durable when that row is. The stream's sink
loads the recorded staging tables at the start of each batch, before the batch's rows
(sink.py), names them in the batch's state row and drops them afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
from google.cloud import bigquery

from pg2sink.changelog.batches import BatchDecoder, ImportTable
from pg2sink.changelog.records import Modification, Schema
from pg2sink.sinks.bigquery.config import BigQueryConfig
from pg2sink.sinks.bigquery.rows import table_rows
from pg2sink.sinks.bigquery.warehouse import IMPORTS_TABLE, Warehouse
from pg2sink.sinks.warehouse.staging import schema_json, staging_layout

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["STAGING_PREFIX", "BigQueryImportTarget"]

STAGING_PREFIX = "_pg2sink_import_"


@dataclass(frozen=True)
class BigQueryImportTarget:
    """The bigquery sink's ImportTarget (sinks/base.py): its settings."""

    config: BigQueryConfig

    def problem(self) -> str | None:
        return None

    def begin(self, schema: Schema) -> BigQueryImportTarget:
        """The dataset and `_pg2sink_imports` exist (the Schema record travels with each
        partition's row there)."""
        warehouse = Warehouse(self.config, "import")
        try:
            warehouse.prepare()
        finally:
            warehouse.close()
        return self

    def write_rows(self, table: ImportTable, batches: Iterator[pa.RecordBatch]) -> int:
        """One partition's rows in a staging table, recorded; the number of rows."""
        layout = staging_layout(table.schema)
        decoder = BatchDecoder(table)
        changes: list[tuple[int, Modification]] = []
        for batch in batches:
            for row in decoder.rows(batch):
                changes.append((len(changes), table.modification(len(changes), row)))
        if not changes:
            return 0
        name = STAGING_PREFIX + uuid.uuid4().hex
        warehouse = Warehouse(self.config, "import")
        try:
            warehouse.create_table(layout, name)
            rows = table_rows(layout, changes, [None] * len(changes))
            warehouse.load(name, rows, f"pg2sink_{name}")
            warehouse.query(
                f"INSERT INTO `{warehouse.dataset}.{IMPORTS_TABLE}` (name, lsn, schema, layout) "
                "VALUES (@name, @lsn, @schema, @layout)",
                [
                    bigquery.ScalarQueryParameter("name", "STRING", name),
                    bigquery.ScalarQueryParameter("lsn", "INT64", table.schema.lsn),
                    bigquery.ScalarQueryParameter(
                        "schema", "STRING", schema_json(table.schema).decode()
                    ),
                    bigquery.ScalarQueryParameter(
                        "layout", "STRING", orjson.dumps(layout.to_json()).decode()
                    ),
                ],
            )
        finally:
            warehouse.close()
        return len(changes)
