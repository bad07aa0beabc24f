"""The DuckDB import's staged rows built by Arrow kernels against the reference path.

The values are PostgreSQL's own text of every type family (the table and the reads of
tests/sinks/file/test_file_arrow_lines.py: the Spark runner's query in a session with the
stream's settings): a partition is staged once by `StagedColumns` (import_columns.py)
and once through the stream's decoders and `arrow_batch`; the Parquet files must hold
the same table, column for column, metadata included.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from pg2sink.catalog.types import PgType
from pg2sink.changelog.batches import ImportTable
from pg2sink.errors import DecodeError
from pg2sink.sinks.duckdb.import_columns import StagedColumns
from pg2sink.sinks.duckdb.imports import _stage, staged_files, staging_dir
from pg2sink.sinks.warehouse.staging import staging_layout
from tests.conftest import Database
from tests.sinks.file.test_file_arrow_lines import (
    PLAIN_ROWS,
    batches_of,
    create_table,
    job_for,
    read_as_text,
)


def stage(
    job: ImportTable, batches: list[pa.RecordBatch], path: Path, vectorised: bool
) -> pa.Table:
    """The partition staged next to the database at `path`: the file's table."""
    Path(staging_dir(str(path))).mkdir()
    assert _stage(str(path), job, iter(batches), vectorised=vectorised) == sum(
        b.num_rows for b in batches
    )
    (file,) = staged_files(str(path))
    table: pa.Table = pq.read_table(file)
    return table


def same(a: pa.ChunkedArray, b: pa.ChunkedArray) -> bool:
    """Equal columns; floats bit for bit (NaN equals NaN, -0 differs from 0)."""
    if not pa.types.is_floating(a.type):
        return bool(a.equals(b))
    bits = np.uint32 if a.type == pa.float32() else np.uint64
    return (
        a.type == b.type
        and a.is_null().equals(b.is_null())
        and np.array_equal(
            np.asarray(a.fill_null(0)).view(bits), np.asarray(b.fill_null(0)).view(bits)
        )
    )


def test_staged_rows_equal_the_reference_for_every_type(db: Database, tmp_path: Path) -> None:
    create_table(db.connect())
    job, rows = read_as_text(db)
    # ordinary values first (ids below PLAIN_ROWS; the read orders ids as text), then
    # batches of one row, a few rows and the rest
    rows.sort(key=lambda r: int(str(r[0])) >= PLAIN_ROWS)
    batches = batches_of(rows, [PLAIN_ROWS, 1, 7, 3])
    fast = stage(job, batches, tmp_path / "fast.duckdb", vectorised=True)
    reference = stage(job, batches, tmp_path / "reference.duckdb", vectorised=False)
    assert fast.schema.equals(reference.schema, check_metadata=True)
    for name in fast.column_names:
        assert same(fast.column(name), reference.column(name)), name
    assert fast.num_rows == len(rows)
    # the special values really are there: kept as PostgreSQL's text
    texts = [t for t in fast.column("_pg2sink_text").to_pylist() if t]
    assert ("d", "-infinity") in {item for t in texts for item in t}
    # in the plain batch only the columns without a kernel take the reference path
    staged = StagedColumns(staging_layout(job.schema), job)
    taken: list[str] = []
    reference_path = staged._reference

    def spy(batch: pa.RecordBatch, start: int, columns: Sequence[int]) -> pa.Table:
        taken.extend(job.names[i] for i in columns)
        return reference_path(batch, start, columns)

    staged._reference = spy  # type: ignore[method-assign]
    plain = staged.table_of(batches[0], 0)
    assert taken == ["by", "ia", "ta"]
    assert plain.equals(reference.slice(0, PLAIN_ROWS).replace_schema_metadata(None))


@pytest.mark.parametrize(
    ("type_", "bad"),
    [("bool", "x"), ("int8", "12a"), ("int8", "0x1F"), ("date", "soon"), ("float8", "1,5")],
)
def test_a_rejected_value_raises_the_reference_decode_error(
    type_: str, bad: str, tmp_path: Path
) -> None:
    names = {"bool": 16, "int8": 20, "date": 1082, "float8": 701}
    category = {"bool": "B", "date": "D"}.get(type_, "N")
    pg = PgType(oid=names[type_], name=type_, namespace="pg_catalog", kind="b", category=category)
    int8 = PgType(oid=20, name="int8", namespace="pg_catalog", kind="b", category="N")
    job = job_for(["id", "v"], (int8, pg), (-1, -1))
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["1", "2"]), pa.array([None, bad])], names=["c0", "c1"]
    )
    Path(staging_dir(str(tmp_path / "x.duckdb"))).mkdir()
    with pytest.raises(DecodeError) as fast:
        _stage(str(tmp_path / "x.duckdb"), job, iter([batch]), vectorised=True)
    with pytest.raises(DecodeError) as reference:
        _stage(str(tmp_path / "x.duckdb"), job, iter([batch]), vectorised=False)
    assert str(fast.value) == str(reference.value)
