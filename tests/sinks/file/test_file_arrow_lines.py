"""LineBuilder (Arrow kernels) against the import writer's reference path and the stream.

The values are PostgreSQL's own text: a table with a column of every type family is
read with the Spark runner's query (`reads.text_query`, in a session with the stream's
settings) into Arrow batches, and FileImportWriter writes them once through LineBuilder
and once through the reference path (the stream's record_line per row): the files must
be equal byte for byte, and equal to the stream's FileSink lines for the same rows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from psycopg import sql

from pg2sink.catalog.catalog import unknown_type
from pg2sink.catalog.server import REPLICATION_SESSION_SETTINGS
from pg2sink.catalog.types import PgType, TypeCache
from pg2sink.changelog.batches import ImportTable
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.changelog.rows import RowDecoder
from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for
from pg2sink.errors import DecodeError
from pg2sink.formats.jsonlines import record_line
from pg2sink.imports.plan import plan_import
from pg2sink.imports.reads import text_query
from pg2sink.sinks.file.imports import FileImportWriter
from tests.conftest import Database

Conn = psycopg.Connection[Any]

#: Text that JSON escaping must get right: quotes, backslashes, every control character
#: (PostgreSQL text cannot hold NUL), non-ASCII, U+2028/U+2029 (orjson leaves them), an
#: astral character, and values that end in '",' (the cut sequence of a text column).
TRICKY_TEXT = [
    "plain",
    "",
    " ",
    '"',
    "\\",
    '\\"',
    'a"b',
    '",',
    'x",',
    '","',
    '"\\",',
    "é",
    "ü" * 5,
    "\u2028\u2029",
    "\U0001f600",
    "\x7f",
    "".join(chr(c) for c in range(1, 32)),
    "tab\there",
    "new\nline\r\n",
    "null",
    '{"id":1}',
    "a\\\\b",
]

#: column -> (type, input texts); the first text of each is an ordinary value
COLUMNS: dict[str, tuple[str, list[str]]] = {
    "i2": ("int2", ["7", "-32768", "32767", "0"]),
    "i4": ("int4", ["-1", "2147483647"]),
    "i8": ("int8", ["42", "-9223372036854775808", "9223372036854775807"]),
    "o": ("oid", ["4294967295", "0"]),
    "f4": ("float4", ["0.1", "NaN", "Infinity", "-Infinity", "-0", "3.4028235e+38", "1e-40"]),
    "f8": ("float8", ["0.30000000000000004", "NaN", "-Infinity", "-0", "1e+300", "5e-324"]),
    "n": ("numeric", ["-12.50", "NaN", "Infinity", "-Infinity", "0.00000001", "1e30", "0"]),
    "n2": ("numeric(12,2)", ["123.45", "-0.01", "9999999999.99", "0"]),
    "t": ("text", TRICKY_TEXT),
    "vc": ("varchar(12)", [v[:12] for v in TRICKY_TEXT]),
    "bc": ("char(6)", ["ab", "", "é", '"', "\\"]),
    "nm": ("name", ["name", 'quo"te', "ü"]),
    "u": ("uuid", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    "j": ("json", ['{"a": "x\\ny"}', "[1, 2]", '"str"', '{\n\t"a": 1\r\n}', "null"]),
    "jb": ("jsonb", ['{"a": "x\\ny"}', '{"q": "\\"\\\\", "u": "\\u0001é"}', "[]", "1.50"]),
    "by": ("bytea", ["\\x00ff", "", "\\x22"]),
    "d": ("date", ["2024-02-29", "infinity", "-infinity", "0044-03-15 BC", "12345-01-01"]),
    "tm": ("time", ["10:00:00", "24:00:00", "10:00:00.5", "23:59:59.999999", "00:00:00.000001"]),
    "tmz": ("timetz", ["10:00:00+02"]),
    "ts": (
        "timestamp",
        [
            "2024-01-01 10:00:00",
            "2024-01-01 10:00:00.1",
            "2024-01-01 00:00:00.123456",
            "infinity",
            "-infinity",
            "0044-03-15 10:00 BC",
            "12345-01-01 00:00",
            "0001-01-01 00:00:00.00001",
        ],
    ),
    "tz": (
        "timestamptz",
        [
            "2024-01-01 10:00:00+00",
            "2024-01-01 10:00:00.12+05",
            "2024-06-30 23:59:59.999999-07",
            "infinity",
            "-infinity",
            "0044-03-15 10:00+00 BC",
            "12345-01-01 00:00+00",
        ],
    ),
    "iv": ("interval", ["1 day 02:00:00", "-1 mon"]),
    "m": ("money", ["1234.56", "-0.5"]),
    "ip": ("inet", ["10.0.0.1/32", "::1", "10.0.0.0/8"]),
    "b": ("bool", ["t", "f"]),
    "ia": ("int4[]", ["{1,NULL,3}", "[0:1]={1,2}", "{{1,2},{3,4}}", "{}"]),
    "ta": ("text[]", ['{"a\\"b","c,d",NULL,"é"}', "{}"]),
    "e": ("mood", ["ok", 'quo"te', "sad\\"]),
    "dm": ("posint", ["5", "2147483647"]),
    "dtz": ("moment", ["2024-01-01 10:00:00.5+00", "infinity"]),
    "rg": ("int4range", ["[1,5)", "empty"]),
    "cp": ("pair", ['(1,"a b")', '(,"\\"")']),
    "x8": ("xid8", ["18446744073709551615"]),
    "bt": ("bit(3)", ["101"]),
}
#: rows of ordinary values only, without NULLs (each column's first text)
PLAIN_ROWS = 40


def create_table(conn: Conn) -> None:
    conn.execute("CREATE TYPE mood AS ENUM ('ok', 'quo\"te', 'sad\\')")
    conn.execute("CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)")
    conn.execute("CREATE DOMAIN moment AS timestamptz")
    conn.execute("CREATE TYPE pair AS (a int4, b text)")
    conn.execute(
        sql.SQL("CREATE TABLE every_type (id int4 PRIMARY KEY, {})").format(
            sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(type_))
                for name, (type_, _) in COLUMNS.items()
            )
        )
    )
    rows: list[list[str | None]] = []
    for i in range(PLAIN_ROWS):
        rows.append([str(i), *(texts[0] for _, texts in COLUMNS.values())])
    longest = max(len(texts) for _, texts in COLUMNS.values())
    for k in range(longest * 3):
        row: list[str | None] = [str(PLAIN_ROWS + k)]
        for c, (_, texts) in enumerate(COLUMNS.values()):
            # every text of every column, and a NULL now and then
            row.append(None if (k + c) % 5 == 4 else texts[(k + c) % len(texts)])
        rows.append(row)
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO every_type VALUES ({})").format(
                sql.SQL(", ").join(sql.Placeholder() * (len(COLUMNS) + 1))
            ),
            rows,
        )


def read_as_text(db: Database) -> tuple[ImportTable, list[list[str | None]]]:
    """The table's rows as the Spark runner's JDBC scan reads them, and its table."""
    conn = db.connect()
    for name, value in REPLICATION_SESSION_SETTINGS.items():
        conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
    plan = plan_import(conn, "public", "every_type", target_partitions=1)
    query = text_query(conn, plan, "TRUE") + " ORDER BY 1"
    rows = [list(r) for r in conn.execute(query.encode())]
    cache = TypeCache(conn)
    types = tuple(cache.get(c.type_oid) or unknown_type(c.type_oid) for c in plan.columns)
    typmods = tuple(c.typmod for c in plan.columns)
    return job_for([c.name for c in plan.columns], types, typmods), rows


def job_for(names: list[str], types: tuple[PgType, ...], typmods: tuple[int, ...]) -> ImportTable:
    columns = [
        RowColumn(n, codec_for(t, m), n == "id")
        for n, t, m in zip(names, types, typmods, strict=True)
    ]
    when = datetime(2026, 11, 21, 5, 0, 0, 123000, tzinfo=UTC)
    schema = Schema(when, 77, "public", "every_type", avro_row_schema("public", "t", columns))
    return ImportTable(schema, types, typmods)


def batches_of(rows: list[list[str | None]], sizes: list[int]) -> list[pa.RecordBatch]:
    """Arrow batches of string columns (what mapInArrow hands over) of `sizes` rows."""
    out, start = [], 0
    for size in [*sizes, len(rows)]:
        chunk = rows[start : start + size]
        start += len(chunk)
        if chunk:
            out.append(
                pa.RecordBatch.from_arrays(
                    [pa.array([r[c] for r in chunk], pa.string()) for c in range(len(rows[0]))],
                    names=[f"c{c}" for c in range(len(rows[0]))],
                )
            )
    return out


def write(job: ImportTable, batches: list[pa.RecordBatch], path: Path, vectorised: bool) -> bytes:
    writer = FileImportWriter(str(path), job, vectorised=vectorised)
    assert writer.write(iter(batches)) == sum(b.num_rows for b in batches)
    return path.read_bytes()


def stream_lines(job: ImportTable, rows: list[list[str | None]]) -> bytes:
    """The lines the stream's FileSink writes for the rows decoded one by one."""
    names = tuple(f["pg.column"] for f in job.schema.schema["fields"])
    decoder = RowDecoder(names, job.converters(to_json=True))
    s = job.schema
    return b"".join(
        record_line(
            Modification(
                s.timestamp, seq, s.lsn, 0, Operation.IMPORT, s.namespace, s.name, None,
                decoder.decode([None if v is None else v.encode() for v in row]),
            )
        )
        for seq, row in enumerate(rows)
    )  # fmt: skip


def test_lines_equal_the_reference_for_every_type(db: Database, tmp_path: Path) -> None:
    create_table(db.connect())
    job, rows = read_as_text(db)
    # the first batch holds ordinary values only (fragments joined with the envelope's
    # constants), then batches of one row, a few rows and the rest
    batches = batches_of(rows, [PLAIN_ROWS, 1, 7, 3])
    assert len(batches) == 5
    fast = write(job, batches, tmp_path / "fast.jsonl", vectorised=True)
    reference = write(job, batches, tmp_path / "reference.jsonl", vectorised=False)
    assert fast == reference
    assert fast == stream_lines(job, rows)
    # the text really is PostgreSQL's tricky text
    assert fast.count(b"\n") == len(rows)
    assert b'"-infinity"' in fast and b"\\u001f" in fast and "\u2028".encode() in fast
    writer = FileImportWriter(str(tmp_path / "x.jsonl"), job)
    assert all(writer._vectorised_lines(b, 0) is not None for b in batches)


def test_every_code_point_is_escaped_as_orjson_does(tmp_path: Path) -> None:
    """A text column holding every code point (but surrogates), one per value and runs of
    them; some batches also hold values ending in '",' (the text column's cut)."""
    text = PgType(oid=25, name="text", namespace="pg_catalog", kind="b", category="S")
    int8 = PgType(oid=20, name="int8", namespace="pg_catalog", kind="b", category="N")
    job = job_for(["id", "t"], (int8, text), (-1, -1))
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    values: list[str | None] = [*points, *("".join(points[k : k + 97]) for k in range(0, 5000, 97))]
    values[::50_000] = ['x",'] * len(values[::50_000])
    rows: list[list[str | None]] = [[str(i), v] for i, v in enumerate(values)]
    batches = batches_of(rows, [10_000] * (len(rows) // 10_000))
    fast = write(job, batches, tmp_path / "fast.jsonl", vectorised=True)
    assert fast == write(job, batches, tmp_path / "reference.jsonl", vectorised=False)


def test_fixed_width_columns_equal_the_reference(tmp_path: Path) -> None:
    """NULL-free date and time columns whose values all have one width take
    column_bytes.fixed_datetimes; a value it cannot vouch for (an offset other than +00,
    which PostgreSQL never prints with TimeZone=UTC but the converter reads) is redone."""
    oids = {"timestamptz": 1184, "timestamp": 1114, "date": 1082, "text": 25, "int8": 20}
    types = tuple(
        PgType(oid=oids[t], name=t, namespace="pg_catalog", kind="b", category="X")
        for t in ("int8", "timestamptz", "timestamp", "date", "text")
    )
    job = job_for(["id", "tz", "ts", "d", "t"], types, (-1,) * 5)
    rows: list[list[str | None]] = [
        ["1", "2024-01-01 10:00:00+00", "2024-01-01 10:00:00", "2024-02-29", "plain é"],
        ["2", "0001-12-31 23:59:59+00", "1999-12-31 23:59:59", "0001-01-01", ""],
        ["3", "2024-06-30 23:59:59+05", "2000-02-29 00:00:00", "9999-12-31", "\u2028"],
    ]
    batches = batches_of(rows, [2, 1])
    fast = write(job, batches, tmp_path / "fast.jsonl", vectorised=True)
    assert fast == write(job, batches, tmp_path / "reference.jsonl", vectorised=False)
    assert fast == stream_lines(job, rows)
    # the offset converted to Z; U+2028 needs no escape and is written as it is
    assert b'"tz":"2024-06-30T18:59:59Z"' in fast and '"t":"\u2028"'.encode() in fast


@pytest.mark.parametrize(
    ("type_", "bad"),
    [
        ("bool", "x"),
        ("int8", "12a"),
        ("timestamptz", "2024-13-45 25:00:00+00"),
        ("date", "soon"),
        ("date", "2024-13-45"),
    ],
)
@pytest.mark.parametrize("with_null", [True, False])
def test_a_rejected_value_raises_the_reference_decode_error(
    tmp_path: Path, type_: str, bad: str, with_null: bool
) -> None:
    oids = {"bool": 16, "int8": 20, "timestamptz": 1184, "date": 1082}
    t = PgType(oid=oids[type_], name=type_, namespace="pg_catalog", kind="b", category="X")
    int8 = PgType(oid=20, name="int8", namespace="pg_catalog", kind="b", category="N")
    job = job_for(["id", "v"], (int8, t), (-1, -1))
    good = COLUMNS[{"bool": "b", "int8": "i8", "timestamptz": "tz", "date": "d"}[type_]][1][0]
    # without a NULL, a column of one width goes through column_bytes.fixed_datetimes
    rows: list[list[str | None]] = [["1", good], *([["2", None]] if with_null else []), ["3", bad]]
    batches = batches_of(rows, [])
    errors = []
    for vectorised in (True, False):
        with pytest.raises(DecodeError) as failed:
            write(job, batches, tmp_path / f"{vectorised}.jsonl", vectorised=vectorised)
        errors.append(str(failed.value))
    assert errors[0] == errors[1]
    assert "'v'" in errors[0] or "v" in errors[0]
