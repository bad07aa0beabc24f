"""The DuckDB sink's imports: executors stage Parquet files, the stream's sink loads them.

DuckDB has one writer, the stream's process, so Spark's executors cannot insert into the
file. Each executor writes its partition's IMPORT rows as one Parquet file in the staging
directory next to the database (`<path>.imports/`), in the raw table's columns (the
same conversion as the stream's rows, values.py), with the table's Schema record and the
staging layout in the file's metadata; the file is written under a temporary name,
fsynced, then renamed, so a staged file is always whole and durable before the partition
is marked done. The stream's sink loads every staged file at the start of each commit,
before the batch's rows (`load_staged`), records its name in `pg2sink_loaded` in the same
transaction, and deletes it once committed (docs/sinks/duckdb.md "Imports").
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from pg2sink.changelog.batches import BatchDecoder, ImportTable
from pg2sink.changelog.records import Schema
from pg2sink.errors import SinkError
from pg2sink.sinks.warehouse.layout import Layout
from pg2sink.sinks.warehouse.staging import (
    LAYOUT_KEY,
    SCHEMA_KEY,
    schema_json,
    schema_of,
    staging_layout,
)

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

__all__ = [
    "DuckDBImportTarget",
    "staged_files",
    "staging_dir",
    "unfinished_files",
]

#: Rows per row group of a staged file (DuckDB's own row group size): fewer, larger
#: groups cost less to write and let DuckDB load them in parallel.
ROW_GROUP_ROWS = 122_880
#: The columns written with a dictionary: the same value in every row of an import.
DICTIONARY = ("_pg2sink_timestamp", "_pg2sink_lsn", "_pg2sink_xid", "_pg2sink_operation")


def staging_dir(path: str) -> str:
    """Where imports stage their Parquet files for the database at `path`."""
    return path + ".imports"


def staged_files(path: str) -> list[str]:
    """The staged files ready to load (whole: renamed after their fsync), by snapshot
    (an older attempt's first) and then by age."""
    import pyarrow.parquet as pq

    files = _files(path, ".parquet")

    def order(file: str) -> tuple[int, int, str]:
        schema, _ = schema_of(pq.read_schema(file).metadata)
        return schema.lsn, os.stat(file).st_mtime_ns, file

    return sorted(files, key=order)


def unfinished_files(path: str) -> list[str]:
    """Staged files whose executor did not finish them (their temporary names)."""
    return _files(path, ".parquet.tmp")


def _files(path: str, suffix: str) -> list[str]:
    """The staging directory's files whose names end with `suffix`."""
    directory = staging_dir(path)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [os.path.join(directory, n) for n in names if n.endswith(suffix)]


@dataclass(frozen=True)
class DuckDBImportTarget:
    """The duckdb sink's ImportTarget (sinks/base.py): the database's path."""

    path: str

    def problem(self) -> str | None:
        return None

    def begin(self, schema: Schema) -> DuckDBImportTarget:
        """The staging directory exists (the Schema record travels in each file)."""
        try:
            os.makedirs(staging_dir(self.path), exist_ok=True)
        except OSError as e:
            raise SinkError(f"cannot create {staging_dir(self.path)!r}: {e.strerror}") from None
        return self

    def write_rows(self, table: ImportTable, batches: Iterator[pa.RecordBatch]) -> int:
        return _stage(self.path, table, batches)


def _stage(
    path: str, table: ImportTable, batches: Iterator[pa.RecordBatch], *, vectorised: bool = True
) -> int:
    """One partition's rows as a staged Parquet file; the number of rows (durable on
    return). `vectorised`: the raw columns built by Arrow kernels (import_columns.py);
    False: every batch through the reference path (the stream's decoders, values.py)."""

    layout = staging_layout(table.schema)
    convert = _converter(layout, table, vectorised)
    metadata = {SCHEMA_KEY: schema_json(table.schema), LAYOUT_KEY: orjson.dumps(layout.to_json())}
    final = os.path.join(staging_dir(path), f"{uuid.uuid4().hex}.parquet")
    temporary = final + ".tmp"
    writer: pq.ParquetWriter | None = None
    pending: list[pa.Table] = []
    rows = written = 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            pending.append(convert(batch, rows))
            rows += batch.num_rows
            if rows - written >= ROW_GROUP_ROWS:
                writer = _write(writer, temporary, metadata, pending)
                written = rows
        if pending:
            writer = _write(writer, temporary, metadata, pending)
        if writer is None:
            return 0
        writer.close()
        writer = None
        _durable_rename(temporary, final)
    except OSError as e:
        raise SinkError(f"cannot stage an import in {staging_dir(path)!r}: {e.strerror}") from None
    finally:
        if writer is not None:
            writer.close()
    return rows


def _write(
    writer: pq.ParquetWriter | None,
    path: str,
    metadata: dict[bytes, bytes],
    tables: list[pa.Table],
) -> pq.ParquetWriter:
    """`tables` as one row group of the file at `path` (the writer, opened with the
    first); `tables` is emptied."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    tables.clear()
    if writer is None:
        # no dictionaries but for the columns that hold one value per import: dictionary
        # pages cost more to write than the values, and the file is larger
        writer = pq.ParquetWriter(
            path, data.schema.with_metadata(metadata), use_dictionary=list(DICTIONARY)
        )
    writer.write_table(data, row_group_size=len(data))
    return writer


def _converter(
    layout: Layout, table: ImportTable, vectorised: bool
) -> Callable[[pa.RecordBatch, int], pa.Table]:
    """(batch, number of its first row) -> its raw rows as an Arrow table."""
    if vectorised:
        from pg2sink.sinks.duckdb.import_columns import StagedColumns

        return StagedColumns(layout, table).table_of
    from pg2sink.sinks.warehouse.values import arrow_batch

    decoder = BatchDecoder(table)

    def reference(batch: pa.RecordBatch, start: int) -> pa.Table:
        changes = [
            (start + i, table.modification(start + i, row))
            for i, row in enumerate(decoder.rows(batch))
        ]
        return arrow_batch(layout, changes, [None] * len(changes))

    return reference


def _durable_rename(temporary: str, final: str) -> None:
    """fsync the file, rename it to its final name, fsync the directory."""
    fd = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, final)
    fd = os.open(os.path.dirname(final), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
