"""SparkRunner end to end: real PostgreSQL, real Spark in local mode, the file sink.

A 200k-row table with bench-stream's column mix (plus types whose text form needs care)
is imported through an exported snapshot; the JSON lines must hold exactly the
table's rows with the values the stream would write, the partitions must be marked
done, and a resumed job must write only the partitions still to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pg2sink.config import SecretDsn
from pg2sink.errors import ConfigError, ImportFailed
from pg2sink.formats.jsonenc import loads
from pg2sink.imports import jobs
from pg2sink.imports.driver import (
    CLUSTER_PARTITIONS,
    DRIVER_JIT,
    THP_SETTING,
    memory_bytes,
    target_partitions,
)
from pg2sink.imports.migrate import apply_migrations
from pg2sink.imports.plan import ImportPlan, plan_import
from pg2sink.imports.snapshot import ExportedSnapshot, use_snapshot
from pg2sink.imports.spark import ImportTask, SparkRunner
from pg2sink.sinks.file.imports import FileImportTarget
from tests.conftest import Database

pytestmark = pytest.mark.slow

Conn = psycopg.Connection[Any]
INTERNAL = "pg2sink"
ROWS = 200_000

#: bench/stream.py's columns (names with non-ASCII text now and then), plus char(n)
#: (padding), inet (no netmask) and a NULL-able bool: their text casts differ from the
#: output functions pgoutput uses
TABLE_DDL = (
    "CREATE TABLE mix (id int8 PRIMARY KEY, name text, amount numeric(12,2),"
    " at timestamptz, flag bool, doc jsonb, code char(6), addr inet)"
)
ROW_EXPRESSIONS = (
    # non-ASCII text now and then: it reaches the executors as its UTF-8 bytes
    "i, 'customer-' || substr(md5(i::text), 1, 11 + (i % 20)::int)"
    " || CASE WHEN i % 7 = 0 THEN ' é€\U0001f600\"\\' ELSE '' END,"
    " ((i * 7919) % 100000000 / 100.0)::numeric(12,2),"
    " timestamptz '2024-01-01 00:00:00+00' + i * interval '37 seconds',"
    " CASE WHEN i % 11 = 0 THEN NULL ELSE i % 3 = 0 END,"
    " jsonb_build_object('source', 'bench', 'seq', i, 'tier', i % 5,"
    " 'tags', jsonb_build_array('a', 'b'), 'active', i % 2 = 0),"
    " 'c' || (i % 100)::text, ('10.0.' || (i % 200) || '.' || (i % 250))::inet"
)


def fill_table(conn: Conn, rows: int) -> None:
    conn.execute(TABLE_DDL)
    conn.execute(
        sql.SQL("INSERT INTO mix SELECT {} FROM generate_series(1, {}) AS g(i)").format(
            sql.SQL(ROW_EXPRESSIONS), sql.Literal(rows)
        )
    )
    conn.execute("ANALYZE mix")


@dataclass
class PreparedJob:
    """A job with its snapshot exported and its partitions planned and saved."""

    id: int
    plan: ImportPlan
    snapshot: ExportedSnapshot


def prepare_job(db: Database, table: str, partitions: int) -> PreparedJob:
    """What the engine does before the runner: job, snapshot, plan, partitions."""
    dsn = SecretDsn(db.dsn)
    apply_migrations(dsn, INTERNAL)
    conn = db.connect()
    job_id = jobs.request_import(conn, INTERNAL, db.publication, "public", table)
    snap = ExportedSnapshot.open(dsn)
    db.conns.append(snap.conn)  # closed by the fixture whatever happens
    jobs.record_snapshot(conn, INTERNAL, job_id, snap)
    reader = db.connect()
    use_snapshot(reader, snap.name)
    plan = plan_import(reader, "public", table, target_partitions=partitions)
    reader.execute("ROLLBACK")
    jobs.save_partitions(conn, INTERNAL, job_id, plan.predicates, plan.rows_estimated)
    return PreparedJob(job_id, plan, snap)


def expected_rows(conn: Conn, where: str = "TRUE") -> dict[int, dict[str, object]]:
    """The table's rows as the JSON the stream writes, parsed back (see jsonenc)."""
    cur = conn.execute(
        sql.SQL(
            "SELECT id, name, amount, at, flag, doc::text, code, addr FROM mix WHERE {}"
        ).format(sql.SQL(where))
    )
    out = {}
    for id_, name, amount, at, flag, doc, code, addr in cur:
        out[id_] = {
            "id": id_,
            "name": name,
            "amount": amount,
            "at": at,
            "flag": flag,
            "doc": doc,
            "code": code,
            "addr": str(addr),
        }
    return out


def parse_after(after: dict[str, Any]) -> dict[str, object]:
    """An imported row's JSON values as comparable Python values."""
    row = dict(after)
    row["at"] = datetime.fromisoformat(after["at"].replace("Z", "+00:00"))
    return row


def read_import(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(schema records, modification records) of a JSON-lines file; every line whole."""
    schemas: list[dict[str, Any]] = []
    mods: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        for line in f:
            assert line.endswith(b"\n")
            record = loads(line, exact_numbers=True)
            (schemas if record["kind"] == "schema" else mods).append(record)
    return schemas, mods


def check_rows(mods: list[dict[str, Any]], expected: dict[int, dict[str, object]]) -> None:
    ids = [m["after"]["id"] for m in mods]
    assert len(ids) == len(set(ids)), "a row was written twice"
    assert set(ids) == set(expected)
    for m in mods:
        assert m["operation"] == "IMPORT"
        assert m["before"] is None
        assert m["xid"] == 0
        assert m["namespace"] == "public" and m["name"] == "mix"
        got = parse_after(m["after"])
        want = expected[got["id"]]  # type: ignore[index]
        assert got == want, f"row {got['id']}: {got} != {want}"


@pytest.fixture(scope="module")
def runner() -> Iterator[SparkRunner]:
    r = SparkRunner("local[2]")
    yield r
    r.close()


def test_import_to_file_sink(db: Database, runner: SparkRunner, tmp_path: Path) -> None:
    conn = db.connect()
    fill_table(conn, ROWS)
    job = prepare_job(db, "mix", 4)
    assert len(job.plan.predicates) == 4
    out = tmp_path / "changes.jsonl"
    task = ImportTask(
        job_id=job.id,
        plan=job.plan,
        partitions=tuple(range(len(job.plan.predicates))),
        snapshot=job.snapshot.name,
        source_dsn=db.dsn,
        internal_schema=INTERNAL,
        target=FileImportTarget(str(out)),
    )
    expected = expected_rows(conn)
    # written after the snapshot: must not be imported
    conn.execute("UPDATE mix SET name = 'changed' WHERE id <= 10")
    conn.execute("INSERT INTO mix (id) VALUES (-1)")
    progress: list[int] = []
    assert runner.run(task, progress.append) == ROWS
    job.snapshot.close()

    schemas, mods = read_import(out)
    assert len(schemas) == 1
    schema = schemas[0]
    assert (schema["namespace"], schema["name"]) == ("public", "mix")
    assert schema["schema"]["pg.primary_key"] == ["id"]
    assert [f["pg.column"] for f in schema["schema"]["fields"]] == [
        "id", "name", "amount", "at", "flag", "doc", "code", "addr",
    ]  # fmt: skip
    check_rows(mods, expected)
    # bpchar keeps its padding, inet has no netmask, bool is true/false/null
    sample = next(m["after"] for m in mods if m["after"]["id"] == 22)
    assert sample["code"] == "c22   " and sample["addr"] == "10.0.22.22"
    assert sample["flag"] is None
    assert isinstance(sample["amount"], Decimal)

    parts = jobs.load_partitions(conn, INTERNAL, job.id)
    assert [p.done for p in parts] == [True] * 4
    assert sum(p.rows or 0 for p in parts) == ROWS
    assert sum(progress) == ROWS
    # the sequence restarts per partition: numbers 0..n-1 within each
    assert sorted(m["sequence"] for m in mods).count(0) == 4


def test_resume_writes_only_the_partitions_left(
    db: Database, runner: SparkRunner, tmp_path: Path
) -> None:
    conn = db.connect()
    fill_table(conn, ROWS)
    job = prepare_job(db, "mix", 4)
    # partitions 0 and 2 were written by an earlier attempt
    for number in (0, 2):
        jobs.mark_partition_done(conn, INTERNAL, job.id, number, 1)
    left = tuple(p.number for p in jobs.load_partitions(conn, INTERNAL, job.id) if not p.done)
    assert left == (1, 3)
    out = tmp_path / "resumed.jsonl"
    task = ImportTask(
        job.id,
        job.plan,
        left,
        job.snapshot.name,
        db.dsn,
        INTERNAL,
        FileImportTarget(str(out)),
    )
    written = runner.run(task)
    job.snapshot.close()
    where = " OR ".join(f"({job.plan.predicates[n]})" for n in left)
    expected = expected_rows(conn, where)
    assert written == len(expected)
    assert 0.3 * ROWS < written < 0.7 * ROWS
    _, mods = read_import(out)
    check_rows(mods, expected)
    assert all(p.done for p in jobs.load_partitions(conn, INTERNAL, job.id))


def test_table_dropped_fails_with_one_line(
    db: Database, runner: SparkRunner, tmp_path: Path
) -> None:
    conn = db.connect()
    fill_table(conn, 30_000)
    job = prepare_job(db, "mix", 2)
    job.snapshot.close()  # the snapshot is gone: readers cannot import it
    task = ImportTask(
        job.id,
        job.plan,
        (0, 1),
        job.snapshot.name,
        db.dsn,
        INTERNAL,
        FileImportTarget(str(tmp_path / "x.jsonl")),
    )
    with pytest.raises(ImportFailed) as failed:
        runner.run(task)
    message = str(failed.value)
    assert "\n" not in message
    assert "snapshot" in message, message
    assert not any(p.done for p in jobs.load_partitions(conn, INTERNAL, job.id))


def test_stdout_sink_is_refused(runner: SparkRunner) -> None:
    plan = ImportPlan("public", "t", (), (), ("TRUE",), 0)
    task = ImportTask(1, plan, (0,), "x", "", INTERNAL, FileImportTarget("-"))
    with pytest.raises(ImportFailed, match="--file-path FILE or another sink"):
        runner.run(task)


def test_missing_jdbc_driver_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"--jdbc-driver '/nonexistent/pg.jar': no such file"):
        SparkRunner(jdbc_driver="/nonexistent/pg.jar").session()
    # no --jdbc-driver and nothing where `make setup` puts it
    monkeypatch.setenv("PG2SINK_SERVICES_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="run `make setup`") as missing:
        SparkRunner().session()
    assert "\n" not in str(missing.value)


def test_stream_and_executor_lines_interleave_whole(tmp_path: Path) -> None:
    """The stream's FileSink and an executor's FileImportWriter append to one file at once:
    every line stays whole (both use O_APPEND and whole-line writes)."""
    import threading

    import pyarrow as pa  # type: ignore[import-untyped]

    from pg2sink.catalog.types import PgType
    from pg2sink.changelog.batches import ImportTable
    from pg2sink.changelog.records import Modification, Operation, Schema
    from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for
    from pg2sink.sinks.file import FileSink
    from pg2sink.sinks.file.imports import FileImportWriter

    path = tmp_path / "shared.jsonl"
    types = (
        PgType(oid=20, name="int8", namespace="pg_catalog", kind="b", category="N"),
        PgType(oid=25, name="text", namespace="pg_catalog", kind="b", category="S"),
    )
    columns = [
        RowColumn(n, codec_for(t, -1), n == "id") for n, t in zip(("id", "v"), types, strict=True)
    ]
    now = datetime.now().astimezone()
    schema = Schema(
        now, 0, "public", "t", avro_row_schema("public", "t", columns), primary_key=("id",)
    )
    table = ImportTable(schema, types, (-1, -1))
    n = 100_000
    batches = [
        pa.RecordBatch.from_arrays(
            [
                pa.array([str(i) for i in range(k, k + 10_000)]),
                pa.array(["x" * (i % 300) for i in range(k, k + 10_000)]),
            ],
            names=["c0", "c1"],
        )
        for k in range(0, n, 10_000)
    ]
    sink = FileSink(str(path))
    sink.open()

    def stream() -> None:
        for i in range(n):
            sink.write(
                Modification(
                    now,
                    i,
                    1,
                    7,
                    Operation.INSERT,
                    "public",
                    "s",
                    None,
                    {"k": i, "w": "y" * (i % 500)},
                )
            )
            if i % 5_000 == 0:
                sink.flush()
        sink.flush()

    writer = threading.Thread(target=stream)
    writer.start()
    assert FileImportWriter(str(path), table).write(iter(batches)) == n
    writer.join()
    sink.close()
    _, mods = read_import(path)
    assert sorted(m["after"]["id"] for m in mods if m["name"] == "t") == list(range(n))
    assert sorted(m["after"]["k"] for m in mods if m["name"] == "s") == list(range(n))


@pytest.mark.parametrize("with_columns", [True, False])
def test_file_writer_lines_equal_the_stream_lines(tmp_path: Path, with_columns: bool) -> None:
    """The file import writer's batch path (column-wise converters, compiled row builder,
    Arrow-built lines) writes byte for byte the lines the stream's FileSink
    writes for the same rows decoded one by one with RowDecoder."""
    import pyarrow as pa

    from pg2sink.catalog.types import PgType
    from pg2sink.changelog.batches import ImportTable
    from pg2sink.changelog.records import Modification, Operation, Schema
    from pg2sink.changelog.rows import RowDecoder
    from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for
    from pg2sink.formats.jsonlines import record_line
    from pg2sink.sinks.file.imports import FileImportWriter

    def pg(oid: int, name: str, category: str) -> PgType:
        return PgType(oid=oid, name=name, namespace="pg_catalog", kind="b", category=category)

    # odd names: quotes, a backslash, non-ASCII, and the first column's key again in text
    names: tuple[str, ...] = ("id", 'na"me', "amount", "at", "flag", "doc", "wert\\ü", "f8")
    types: tuple[PgType, ...] = (
        pg(20, "int8", "N"),
        pg(25, "text", "S"),
        pg(1700, "numeric", "N"),
        pg(1184, "timestamptz", "D"),
        pg(16, "bool", "B"),
        pg(3802, "jsonb", "U"),
        pg(1043, "varchar", "S"),
        pg(701, "float8", "N"),
    )
    typmods: tuple[int, ...] = (-1, -1, ((12 << 16) | 2) + 4, -1, -1, -1, -1, -1)
    if not with_columns:
        names, types, typmods = (), (), ()
    columns = [
        RowColumn(n, codec_for(t, m), n == "id")
        for n, t, m in zip(names, types, typmods, strict=True)
    ]
    when = datetime(2026, 11, 21, 5, 0, 0, 123000).astimezone()
    schema = Schema(
        when, 77, "public", "t", avro_row_schema("public", "t", columns), primary_key=names[:1]
    )
    path = tmp_path / "import.jsonl"
    table = ImportTable(schema, types, typmods)

    def text_row(i: int) -> list[str | None]:
        return [
            str(i),
            None if i % 7 == 0 else f'"x"}},{{"id":{i}' + "\\" * (i % 3) + "é" * (i % 4),
            f"-{i % 1000}.{i % 100:02d}",
            None if i % 5 == 0 else f"2024-02-{1 + i % 28:02d} 0{i % 10}:00:0{i % 6}.{i:06d}+00",
            None if i % 11 == 0 else "tf"[i % 2],
            f'{{"seq": {i}, "s": "a\\"b"}}',
            "" if i % 2 else "ü" * (i % 9),
            ["-0", "1e+20", "NaN", "-Infinity", "3.5"][i % 5],
        ][: len(names)]

    rows = [text_row(i) for i in range(2_500)]
    chunks = [rows[k : k + 1_000] for k in range(0, len(rows), 1_000)]
    batches = [
        pa.RecordBatch.from_arrays(
            [pa.array([r[c] for r in chunk], pa.string()) for c in range(len(names))],
            names=[f"c{c}" for c in range(len(names))],
        )
        if names
        # a batch without columns still carries its row count
        else pa.RecordBatch.from_struct_array(pa.array([{}] * len(chunk), pa.struct([])))
        for chunk in chunks
    ]
    assert FileImportWriter(str(path), table).write(iter(batches)) == len(rows)

    decoder = RowDecoder(names, [c.codec.to_json for c in columns])
    expected = b"".join(
        record_line(
            Modification(
                schema.timestamp, seq, 77, 0, Operation.IMPORT, "public", "t", None,
                decoder.decode([None if v is None else v.encode() for v in row]),
            )
        )
        for seq, row in enumerate(rows)
    )  # fmt: skip
    assert path.read_bytes() == expected


def test_the_driver_jvm_options_reach_the_jvm(runner: SparkRunner) -> None:
    # DRIVER_GC reaches the JVM that spark-submit starts (in local mode it runs the tasks)
    jvm = runner.session().sparkContext._jvm
    beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = {bean.getName() for bean in beans}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names
    # and its heap on huge pages where the kernel gives them on request
    hotspot = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    huge_pages = hotspot.getVMOption("UseTransparentHugePages").getValue()
    assert huge_pages == ("true" if "[never]" not in THP_SETTING.read_text() else "false")
    # and C2 takes methods at DRIVER_JIT's thresholds
    for option in DRIVER_JIT.split():
        name, value = option.removeprefix("-XX:").split("=")
        assert hotspot.getVMOption(name).getValue() == value, name
    # an OutOfMemoryError ends it (DRIVER_OOM); its heap is the runner's driver_memory
    assert hotspot.getVMOption("ExitOnOutOfMemoryError").getValue() == "true"
    heap = jvm.java.lang.Runtime.getRuntime().maxMemory()
    assert 0.8 <= heap / memory_bytes(runner.driver_memory) <= 1.0, (heap, runner.driver_memory)


def test_partitions_follow_the_cores_of_a_local_master(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert target_partitions("local[*]") == 12
    assert target_partitions("local[3]") == 6
    assert target_partitions("local[2,4]") == 4  # local[N, maxFailures]
    assert target_partitions("local") == 2
    # a cluster's size is unknown before its session starts
    assert target_partitions("spark://master:7077") == CLUSTER_PARTITIONS


def test_text_that_is_not_utf8_fails_the_partition() -> None:
    """Spark hands the text over as bytes (reads.binary_schema); bytes that are not UTF-8
    (a SQL_ASCII database can hold them) stop the import with one line, as pgjdbc's
    decoding did."""
    import pyarrow as pa

    from pg2sink.catalog.types import PgType
    from pg2sink.changelog.batches import ImportTable
    from pg2sink.errors import SourceError
    from pg2sink.imports.writers import _as_text
    from tests.sinks.file.test_file_arrow_lines import job_for

    text = PgType(oid=25, name="text", namespace="pg_catalog", kind="b", category="S")
    table: ImportTable = job_for(["id", "name"], (text, text), (-1, -1))
    good = pa.RecordBatch.from_arrays(
        [pa.array([b"1", b"2"]), pa.array(["é€".encode(), None])], names=["c0", "c1"]
    )
    assert _as_text(table, good).to_pydict() == {"c0": ["1", "2"], "c1": ["é€", None]}
    bad = pa.RecordBatch.from_arrays(
        [pa.array([b"1", b"2"]), pa.array([b"ok", b"caf\xe9"])], names=["c0", "c1"]
    )
    with pytest.raises(SourceError, match="column name holds text that is not valid UTF-8"):
        _as_text(table, bad)
