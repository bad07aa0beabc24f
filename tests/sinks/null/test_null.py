"""The null sink (--sink=null): everything accepted, acknowledged and discarded."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from pg2sink.catalog.types import PgType
from pg2sink.changelog.batches import ImportTable
from pg2sink.changelog.builder import TableShape
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for
from pg2sink.errors import DecodeError
from pg2sink.imports import jobs
from pg2sink.imports.spark import ImportTask, SparkRunner
from pg2sink.logical import encode
from pg2sink.sinks.base import ImportTarget, Sink, WritesRows
from pg2sink.sinks.null import NullImportTarget, NullSink
from tests.conftest import Database, wait_for
from tests.imports.test_spark import INTERNAL, fill_table, prepare_job
from tests.support import FAST, Proc, scalar

T = datetime(2024, 1, 1, tzinfo=UTC)
INT8 = PgType(oid=20, name="int8", namespace="pg_catalog", kind="b", category="N")
TEXT = PgType(oid=25, name="text", namespace="pg_catalog", kind="b", category="S")


def test_every_checkpoint_is_acknowledged_at_once() -> None:
    sink: Sink = NullSink()
    sink.open()
    assert sink.acknowledged() is None and sink.flush() is None
    sink.write(Modification(T, 0, 10, 7, Operation.INSERT, "public", "t", None, {"id": 1}))
    sink.checkpoint(20)
    sink.start_flush()
    assert sink.acknowledged() == 20 and sink.pending_bytes() == 0
    sink.checkpoint(30)
    assert sink.flush() == 30
    assert isinstance(sink, NullSink) and sink.records == 1
    # the changelog's new-row shortcut (no Modification built) is counted the same
    assert isinstance(sink, WritesRows)
    write_row = sink.row_writer(TableShape("public", "t", ("id",), (codec_for(INT8, -1),)))
    assert write_row(b"U" + encode.insert(7, [b"1"])[1:], T, 1, 40, 8, Operation.UPDATE)
    assert sink.records == 2
    sink.close()


def import_table() -> ImportTable:
    columns = [
        RowColumn("id", codec_for(INT8, -1), True),
        RowColumn("v", codec_for(TEXT, -1), False),
    ]
    schema = Schema(
        T, 5, "public", "t", avro_row_schema("public", "t", columns), primary_key=("id",)
    )
    return ImportTable(schema, (INT8, TEXT), (-1, -1))


def test_imports_decode_count_and_discard() -> None:
    table = import_table()
    target: ImportTarget = NullImportTarget()
    assert target.problem() is None and target.begin(table.schema) is target
    batches = [
        pa.RecordBatch.from_arrays(
            [pa.array([str(i) for i in range(k, k + 3)]), pa.array(["a", None, "c"])],
            names=["c0", "c1"],
        )
        for k in (0, 3)
    ]
    assert target.write_rows(table, iter(batches)) == 6
    # the rows are decoded as the stream decodes them: bad text fails the partition
    bad = pa.RecordBatch.from_arrays([pa.array(["x"]), pa.array(["a"])], names=["c0", "c1"])
    with pytest.raises(DecodeError):
        target.write_rows(table, iter([bad]))


@pytest.mark.slow
def test_stream_through_the_cli_confirms_everything(db: Database, pg2sink_proc: Proc) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key, v text)")
    p = pg2sink_proc("--sink", "null", *FAST).start()
    p.wait_streaming()
    before = db.slot_confirmed_lsn()
    assert before is not None
    conn.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 1000) g")
    conn.execute("UPDATE t SET v = 'y' WHERE id <= 10")
    conn.execute("DELETE FROM t WHERE id > 500")
    written = db.current_lsn()
    assert written > before
    # the slot's position passes the last change: nothing was kept, nothing waits
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= written, 30, "the slot to pass the changes")
    assert p.stop() == 0
    # t's Schema record, 1000 inserts, 10 updates and 500 deletes reached it
    assert "null sink closed: 1511 records discarded" in p.stderr()
    assert scalar(conn, "SELECT count(*) FROM t") == 500


@pytest.mark.slow
def test_an_import_through_spark_reads_every_row(db: Database) -> None:
    conn = db.connect()
    rows = 20_000
    fill_table(conn, rows)
    job = prepare_job(db, "mix", 4)
    partitions = tuple(range(len(job.plan.predicates)))
    task = ImportTask(
        job.id, job.plan, partitions, job.snapshot.name, db.dsn, INTERNAL, NullImportTarget()
    )
    runner = SparkRunner("local[2]")
    try:
        assert runner.run(task) == rows  # every row read and decoded, then discarded
    finally:
        runner.close()
        job.snapshot.close()
    assert all(p.done for p in jobs.load_partitions(conn, INTERNAL, job.id))
