"""Every built-in PostgreSQL type round-trips exactly through pg2sink (docs/types.md).

One table holds a column per type and one per array of that type, filled with ordinary
and edge values (NaN, ±Infinity, -0, BC, infinity, 24:00:00, NULL elements, several
dimensions, lower bounds other than 1). pg2sink runs once per sink against the real
PostgreSQL; the tests then render each value pg2sink wrote back to PostgreSQL input text
(`pg_input`, the documented renderer below), cast it to the column's type and compare
`::text` with the database's own `col::text`, so "exact" means PostgreSQL cannot tell the
two apart.

The renderer: JSON null / Avro null -> SQL NULL; true/false -> 'true'/'false'; a JSON
number -> its literal as written (parsed as text, so no digit or sign of -0 is lost); a
string -> itself, except for bytea, whose base64 (JSON) becomes '\\x' hex (an array
column's string is an array kept as PostgreSQL's text: itself); Avro bytes ->
'\\x' hex; Avro floats -> repr (NaN/Infinity/-Infinity spelt as PostgreSQL does);
Decimal -> its digits; date/time/datetime -> isoformat(); a list -> an array literal with
every element quoted (nested lists -> nested braces).
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import services
from psycopg import sql

from pg2sink.changelog.typemap import nullable
from tests.conftest import (
    PG_VERSION,
    Database,
    KafkaStack,
    fresh_database,
    pg2sink_for,
    read_jsonl,
    wait_for,
)
from tests.sinks.kafka.test_kafka import Reader, kafka_args
from tests.support import FAST

# (case id, column type, values as SQL expressions). Each case gets a column c_<id> of
# the type and a column a_<id> of its array type.
CASES: list[tuple[str, str, list[str]]] = [
    ("int2", "int2", ["0", "-32768", "32767"]),
    ("int4", "int4", ["-2147483648", "2147483647"]),
    ("int8", "int8", ["-9223372036854775808", "9223372036854775807", "0"]),
    ("numeric_10_2", "numeric(10,2)", ["12.5", "-99999999.99", "0", "'NaN'"]),
    ("numeric_5_m2", "numeric(5,-2)", ["1234567", "-50"]),
    ("numeric_3_5", "numeric(3,5)", ["0.00123", "-0.00999"]),
    (
        "numeric",
        "numeric",
        [
            "0.00000001",
            "'123456789012345678901234567890.123456789012345678901234567890'",
            "'1e-300'",
            "12.50",
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
        ],
    ),
    ("money", "money", ["1.50", "-1234567.89", "0"]),
    (
        "float4",
        "float4",
        ["1.1", "'-0'", "'NaN'", "'Infinity'", "'-Infinity'", "3.4028235e38", "'1e-45'"],
    ),
    (
        "float8",
        "float8",
        [
            "0.1",
            "'-0'",
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "1.7976931348623157e308",
            "'5e-324'",
        ],
    ),
    (
        "text",
        "text",
        ["'Zoë 🐘'", "''", "'NULL'", "E'quote\" back\\\\slash {brace}, comma'", "E'a\\nb\\tc'"],
    ),
    ("varchar", "varchar(5)", ["'abc'", "'  x  '"]),
    ("bpchar", "char(5)", ["'ab'", "''"]),
    ("name", "name", ["'a name'"]),
    ("citext", "citext", ["'MiXeD Case'"]),
    ("bytea", "bytea", ["'\\x00ff7f'", "''", "'\\x5c22'"]),
    ("bool", "bool", ["true", "false"]),
    ("uuid", "uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"]),
    (
        "date",
        "date",
        [
            "'2024-02-29'",
            "'0044-03-15 BC'",
            "'infinity'",
            "'-infinity'",
            "'12345-01-01'",
            "'4713-01-01 BC'",
            "'1970-01-01'",
        ],
    ),
    ("time", "time", ["'00:00'", "'23:59:59.999999'", "'24:00:00'", "'12:34:56.5'"]),
    ("time_3", "time(3)", ["'12:34:56.789'"]),
    ("timetz", "timetz", ["'10:00:00+02'", "'23:59:59.999999-14:59'", "'00:00:00+00'"]),
    (
        "timestamp",
        "timestamp",
        [
            "'2024-05-01 10:00:00.123456'",
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 10:00:00.000001 BC'",
            "'294276-12-31 23:59:59.999999'",
            "'1969-12-31 23:59:59.999999'",
        ],
    ),
    (
        "timestamptz",
        "timestamptz",
        [
            "'2024-05-01 10:00:00.000001+00'",
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 10:00:00 BC'",
            "'12345-06-07 08:09:10.5+00'",
            "'1900-01-01 00:00:00+05:30'",
        ],
    ),
    (
        "interval",
        "interval",
        [
            "'1 year 2 mons 3 days 04:05:06.789'",
            "'-1 day'",
            "'0'",
            "'-178000000 years'",
            "'1 mon -1 day 00:00:00.000001'",
        ],
    ),
    ("interval_ds", "interval day to second(2)", ["'3 days 04:05:06.78'"]),
    ("json", "json", ['\'{"b": 1,  "a": [1, 2.50, null]}\'', "'null'", "'\"s\"'"]),
    ("jsonb", "jsonb", ['\'{"b": 1, "a": [1, 2.50, null]}\'', "'null'", "'[]'"]),
    ("xml", "xml", ["'<a b=\"1\">x &amp; y</a>'", "'text only'"]),
    ("inet", "inet", ["'192.168.0.1/24'", "'::1'", "'10.0.0.1'"]),
    ("cidr", "cidr", ["'10.0.0.0/8'", "'2001:db8::/32'"]),
    ("macaddr", "macaddr", ["'08:00:2b:01:02:03'"]),
    ("macaddr8", "macaddr8", ["'08:00:2b:01:02:03:04:05'"]),
    ("bit", "bit(3)", ["B'101'", "B'000'"]),
    ("varbit", "varbit", ["B''", "B'1101'"]),
    ("tsvector", "tsvector", ["'a fat:2 cat:1A'", "''"]),
    ("tsquery", "tsquery", ["'fat & (rat | !cat)'", "'a:*'"]),
    ("point", "point", ["'(1.5,-2)'", "'(NaN,Infinity)'"]),
    ("line", "line", ["'{1,-1,0}'"]),
    ("lseg", "lseg", ["'[(0,0),(1,1)]'"]),
    ("box", "box", ["'(2,2),(0,0)'", "'(1,1),(1,1)'"]),
    ("path", "path", ["'[(0,0),(1,1),(2,0)]'", "'((0,0),(1,1))'"]),
    ("polygon", "polygon", ["'((0,0),(1,1),(1,0))'"]),
    ("circle", "circle", ["'<(0,0),1.5>'"]),
    ("int4range", "int4range", ["'[1,5)'", "'empty'", "'(,3]'"]),
    ("int8range", "int8range", ["'[1,9223372036854775806]'"]),
    ("numrange", "numrange", ["'(1.5,2.50]'", "'(,)'"]),
    ("tsrange", "tsrange", ["'[2024-01-01 10:00,infinity)'"]),
    ("tstzrange", "tstzrange", ["'[2024-01-01 10:00+00,2024-01-02 00:00+00)'"]),
    ("daterange", "daterange", ["'[2024-01-01,2024-02-01)'", "'[-infinity,infinity)'"]),
    ("int4multirange", "int4multirange", ["'{[1,3),[5,7)}'", "'{}'"]),
    ("int8multirange", "int8multirange", ["'{[1,3)}'"]),
    ("nummultirange", "nummultirange", ["'{[1.5,2.5]}'"]),
    ("tsmultirange", "tsmultirange", ["'{[2024-01-01,2024-01-02)}'"]),
    ("tstzmultirange", "tstzmultirange", ["'{[2024-01-01 00:00+00,)}'"]),
    ("datemultirange", "datemultirange", ["'{[2024-01-01,2024-01-05),[2024-02-01,)}'"]),
    ("pg_lsn", "pg_lsn", ["'16/B374D848'", "'0/0'"]),
    ("oid", "oid", ["0", "4294967295"]),
    ("xid", "xid", ["'4294967295'"]),
    ("xid8", "xid8", ["'18446744073709551615'"]),
    ("cid", "cid", ["'7'"]),
    ("tid", "tid", ["'(0,1)'"]),
    ("regclass", "regclass", ["'pg_class'"]),
    ("pg_snapshot", "pg_snapshot", ["'10:20:10,14,15'"]),
    ("txid_snapshot", "txid_snapshot", ["'10:20:10,14,15'"]),
    ("char", '"char"', ["'x'", "''"]),
    ("int2vector", "int2vector", ["'1 -2 3'", "''"]),
    ("oidvector", "oidvector", ["'1 4294967295'"]),
    ("regtype", "regtype", ["'integer[]'", "'mood'"]),
    ("regnamespace", "regnamespace", ["'pg_catalog'"]),
    ("jsonpath", "jsonpath", ["'$.a[*] ? (@ > 1)'"]),
    ("refcursor", "refcursor", ["'my cursor'"]),
    ("mood", "mood", ["'sad'", "'with space'"]),
    ("posint", "posint", ["1", "2147483647"]),
    ("price", "price", ["12.5", "'NaN'"]),
    ("moment", "moment", ["'2024-05-01 10:00:00+00'", "'infinity'"]),
    ("pair", "pair", ["ROW(1, 'a b', '2024-01-01 00:00:00+00')", "ROW(NULL, '', 'infinity')"]),
    ("nested", "nested", ["ROW(ROW(2, 'x,\"y\"', NULL)::pair, ARRAY[1, NULL])"]),
]
# Types a server before this major cannot declare: numeric with a negative scale or a
# scale above its precision is PostgreSQL 15+. The zoo of an older session's server
# (the version matrix, docs/testing.md) leaves them out.
SINCE: dict[str, int] = {"numeric_5_m2": 15, "numeric_3_5": 15}
CASES = [case for case in CASES if SINCE.get(case[0], 0) <= PG_VERSION]

SETUP = [
    "CREATE EXTENSION citext",
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'with space')",
    "CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)",
    "CREATE DOMAIN price AS numeric(10,2) CHECK (VALUE <> 0)",
    "CREATE DOMAIN moment AS timestamptz",
    "CREATE TYPE pair AS (n int, label text, at timestamptz)",
    "CREATE TYPE nested AS (p pair, ns int[])",
    # a table whose UPDATE leaves a TOASTed value unchanged (REPLICA IDENTITY DEFAULT)
    "CREATE TABLE toasty (id int PRIMARY KEY, big text, n int)",
]
# Four array values per type: 1-D with a NULL element, 2-D, lower bound 0, empty.
ARRAY_ROWS = 4


def scalar_column(case: str) -> str:
    return f"c_{case}"


def array_column(case: str) -> str:
    return f"a_{case}"


def columns() -> list[str]:
    return [c for case, _, _ in CASES for c in (scalar_column(case), array_column(case))]


def row_count() -> int:
    return max(ARRAY_ROWS, *(len(values) for _, _, values in CASES))


def _array_value(row: int, typ: str, values: list[str]) -> sql.Composable | None:
    first, last = sql.SQL(values[0]), sql.SQL(values[-1])
    array_type = sql.SQL(typ + "[]")
    element = sql.SQL("({})::" + typ)
    if row == 0:
        items = sql.SQL(", ").join([*(element.format(sql.SQL(v)) for v in values), sql.NULL])
        return sql.SQL("ARRAY[{}]::{}").format(items, array_type)
    if row == 1:
        return sql.SQL("ARRAY[[{}, NULL], [NULL, {}]]::{}").format(
            element.format(first), element.format(last), array_type
        )
    if row == 2:  # PostgreSQL prints the bounds: '[0:1]={...}'
        return sql.SQL("('[0:1]=' || ARRAY[{}, {}]::{}::text)::{}").format(
            element.format(first), element.format(last), array_type, array_type
        )
    if row == 3:
        return sql.SQL("'{{}}'::{}").format(array_type)
    return None


def create_fidelity_table(conn: psycopg.Connection[Any]) -> None:
    """The table fidelity: a column per case and one per array of its type (and id)."""
    defs: list[sql.Composable] = [sql.SQL("id int PRIMARY KEY")]
    for case, typ, _ in CASES:
        defs.append(sql.SQL("{} " + typ).format(sql.Identifier(scalar_column(case))))
        defs.append(sql.SQL("{} " + typ + "[]").format(sql.Identifier(array_column(case))))
    conn.execute(sql.SQL("CREATE TABLE fidelity ({})").format(sql.SQL(", ").join(defs)))


def insert_fidelity_rows(conn: psycopg.Connection[Any]) -> None:
    """The rows of table fidelity (row_count() INSERTs), in the caller's transaction."""
    for row in range(row_count()):
        names: list[sql.Composable] = [sql.Identifier("id")]
        exprs: list[sql.Composable] = [sql.Literal(row)]
        for case, typ, values in CASES:
            if row < len(values):
                names.append(sql.Identifier(scalar_column(case)))
                exprs.append(sql.SQL("({})::" + typ).format(sql.SQL(values[row])))
            array = _array_value(row, typ, values)
            if array is not None:
                names.append(sql.Identifier(array_column(case)))
                exprs.append(array)
        conn.execute(
            sql.SQL("INSERT INTO fidelity ({}) VALUES ({})").format(
                sql.SQL(", ").join(names), sql.SQL(", ").join(exprs)
            )
        )


def create_and_fill(conn: psycopg.Connection[Any], insert: bool) -> None:
    """The schema (always), then the rows (when `insert`: after pg2sink streams)."""
    if not insert:
        for statement in SETUP:
            conn.execute(sql.SQL(statement))
        create_fidelity_table(conn)
        # FULL: the UPDATE below carries whole before images, checked like the after images
        conn.execute("ALTER TABLE fidelity REPLICA IDENTITY FULL")
        return
    with conn.transaction():
        insert_fidelity_rows(conn)
        conn.execute(
            "INSERT INTO toasty SELECT 1, string_agg(md5(i::text), ''), 1"
            " FROM generate_series(1, 3000) i"
        )
    conn.execute("UPDATE toasty SET n = 2 WHERE id = 1")
    conn.execute("UPDATE fidelity SET id = id")


def messages_expected() -> int:
    """fidelity INSERTs and UPDATEs, toasty INSERT and UPDATE."""
    return 2 * row_count() + 2


def images(
    changes: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]],
) -> list[dict[int, dict[str, Any]]]:
    """From (operation, before, after) of table fidelity: the INSERTs' after images, the
    UPDATEs' before images and their after images, each by id."""
    inserts = {int(a["id"]): a for op, _, a in changes if op == "INSERT" and a is not None}
    befores = {int(b["id"]): b for op, b, _ in changes if op == "UPDATE" and b is not None}
    afters = {int(a["id"]): a for op, _, a in changes if op == "UPDATE" and a is not None}
    return [inserts, befores, afters]


# --- the renderer: pg2sink's values back to PostgreSQL input text --------------------


class Number(str):
    """A JSON number's literal, as written (json.loads parse_int/parse_float)."""


def load_line(line: bytes) -> Any:
    return json.loads(line, parse_int=Number, parse_float=Number)


def array_literal(items: list[Any], render: Callable[[Any], str | None], delim: str) -> str:
    parts = []
    for item in items:
        if item is None:
            parts.append("NULL")
        elif isinstance(item, list):
            parts.append(array_literal(item, render, delim))
        else:
            text = render(item)
            assert text is not None
            parts.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + delim.join(parts) + "}"


def pg_input(
    value: Any, *, base64_bytea: bool = False, delim: str = ",", array: bool = False
) -> str | None:
    """PostgreSQL input text for a value pg2sink wrote (JSON or Avro, decoded)."""
    if array and isinstance(value, str):
        return value  # an array kept as PostgreSQL's text: '[0:1]={...}'

    def render(v: Any) -> str | None:
        if v is None:
            return None
        if isinstance(v, list):
            return array_literal(v, render, delim)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, Number | int | uuid.UUID):
            return str(v)
        if isinstance(v, bytes):
            return "\\x" + v.hex()
        if isinstance(v, str):
            return "\\x" + base64.b64decode(v).hex() if base64_bytea else v
        if isinstance(v, float):
            if math.isnan(v):
                return "NaN"
            if math.isinf(v):
                return "Infinity" if v > 0 else "-Infinity"
            return repr(v)
        if isinstance(v, Decimal):
            return format(v, "f")
        if isinstance(v, datetime | date | time):
            return v.isoformat()
        raise AssertionError(f"no rendering for {v!r}")

    return render(value)


@dataclass
class Column:
    name: str
    pg_type: str
    """format_type() of the column, what the rendered text is cast to."""
    is_bytea: bool
    delim: str
    """typdelim of the array's element type (';' for box)."""


def column_info(conn: psycopg.Connection[Any]) -> dict[str, Column]:
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod),"
        " coalesce(e.typname, t.typname) = 'bytea', coalesce(e.typdelim, t.typdelim)::text"
        " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
        " LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'"
        " WHERE a.attrelid = 'fidelity'::regclass AND a.attnum > 0"
    ).fetchall()
    return {name: Column(name, typ, bool(bytea), delim) for name, typ, bytea, delim in rows}


def mismatches(
    conn: psycopg.Connection[Any],
    column: Column,
    got_by_id: dict[int, Any],
    *,
    base64_bytea: bool,
) -> list[str]:
    """Rows where pg2sink's value, rendered back, is not PostgreSQL's own text."""
    query = sql.SQL(
        "SELECT {col}::text, CAST(%s::text AS {typ})::text FROM fidelity WHERE id = %s"
    ).format(col=sql.Identifier(column.name), typ=sql.SQL(column.pg_type))
    out = []
    assert sorted(got_by_id) == list(range(row_count()))
    for row_id, got in sorted(got_by_id.items()):
        rendered = pg_input(
            got,
            base64_bytea=base64_bytea and column.is_bytea,
            delim=column.delim,
            array=column.pg_type.endswith("[]"),
        )
        try:
            found = conn.execute(query, (rendered, row_id)).fetchone()
        except psycopg.Error as e:
            out.append(f"{column.name} row {row_id}: {got!r} -> {rendered!r}: {e}")
            continue
        assert found is not None
        expected, back = found
        if expected != back:
            out.append(f"{column.name} row {row_id}: db {expected!r}, pg2sink {got!r} -> {back!r}")
    return out


# --- the file sink: JSON -------------------------------------------------------------


@dataclass
class FileRun:
    db: Database
    conn: psycopg.Connection[Any]
    columns: dict[str, Column]
    schema: dict[str, Any]
    """The row record of the Schema line of table fidelity."""
    images: list[dict[int, dict[str, Any]]]
    """INSERT after, UPDATE before and UPDATE after images by id (`images`), parsed with
    exact numbers."""

    @property
    def rows(self) -> dict[int, dict[str, Any]]:
        """The INSERTs' after images."""
        return self.images[0]

    toasty: list[dict[str, Any]]


@pytest.fixture(scope="module")
def file_run(
    pg_server: services.Postgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FileRun]:
    """One pg2sink run (file sink) over the whole table, shared by the tests per type."""
    workdir = tmp_path_factory.mktemp("fidelity")
    out = workdir / "out.jsonl"
    with fresh_database(pg_server) as db:
        conn = db.connect()
        create_and_fill(conn, insert=False)
        p = pg2sink_for(db, workdir, "--file-path", str(out), *FAST).start()
        try:
            p.wait_streaming()
            create_and_fill(conn, insert=True)
            expected = messages_expected()
            wait_for(
                lambda: (
                    len([r for r in read_jsonl(out) if r.get("kind") == "modification"]) >= expected
                ),
                60,
                "pg2sink to write every row",
            )
        finally:
            p.stop()
        lines = [load_line(line) for line in out.read_bytes().splitlines() if line]
        schema = next(
            r["schema"] for r in lines if r["kind"] == "schema" and r["name"] == "fidelity"
        )
        changes = [r for r in lines if r["kind"] == "modification"]
        fidelity = [
            (r["operation"], r["before"], r["after"]) for r in changes if r["name"] == "fidelity"
        ]
        toasty = [r for r in changes if r["name"] == "toasty"]
        yield FileRun(db, conn, column_info(conn), schema, images(fidelity), toasty)


@pytest.mark.parametrize("case", [case for case, _, _ in CASES])
def test_json_round_trips_exactly(file_run: FileRun, case: str) -> None:
    for name in (scalar_column(case), array_column(case)):
        column = file_run.columns[name]
        for rows in file_run.images:
            got = {row_id: row[name] for row_id, row in rows.items()}
            assert mismatches(file_run.conn, column, got, base64_bytea=True) == []
        field = next(f for f in file_run.schema["fields"] if f["pg.column"] == name)
        assert field["type"] == nullable(field["type"][1]) and "pg.type" in field["type"][1]


def test_json_special_values_are_postgresql_text(file_run: FileRun) -> None:
    rows = file_run.rows
    assert rows[1]["c_date"] == "0044-03-15 BC" and rows[2]["c_date"] == "infinity"
    assert rows[4]["c_numeric"] == "NaN" and rows[2]["c_float8"] == "NaN"
    assert rows[1]["c_float8"] == "-0.0"  # '-0' would read back as the integer 0
    assert rows[2]["c_time"] == "24:00:00"
    assert rows[1]["a_int4"] == [["-2147483648", None], [None, "2147483647"]]
    assert rows[2]["a_int4"] == "[0:1]={-2147483648,2147483647}"
    assert rows[3]["a_int4"] == []


def test_the_comparison_notices_a_wrong_value(file_run: FileRun) -> None:
    column = file_run.columns["c_float8"]
    got = {i: file_run.rows[i]["c_float8"] for i in file_run.rows}
    got[1] = Number("0")  # -0 without its sign
    assert len(mismatches(file_run.conn, column, got, base64_bytea=True)) == 1
    column = file_run.columns["a_int4"]
    got = {i: file_run.rows[i]["a_int4"] for i in file_run.rows}
    got[2] = [Number("-2147483648"), Number("2147483647")]  # the lower bound lost
    assert len(mismatches(file_run.conn, column, got, base64_bytea=True)) == 1


def test_json_unchanged_toast_marker(file_run: FileRun) -> None:
    insert, update = file_run.toasty
    assert len(insert["after"]["big"]) == 3000 * 32
    assert update["operation"] == "UPDATE" and update["after"]["n"] == "2"
    assert update["after"]["big"] == {"unchanged_toast": True}


# --- the Kafka sink: Avro ------------------------------------------------------------


@pytest.mark.slow
def test_avro_round_trips_every_type_and_marks_unchanged_toast(
    db: Database, tmp_path: Path, kafka_stack: KafkaStack
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    conn = db.connect()
    create_and_fill(conn, insert=False)
    p = pg2sink_for(db, tmp_path, *kafka_args(kafka_stack, prefix)).start()
    reader = Reader(
        kafka_stack.bootstrap_servers,
        [f"{prefix}.public.fidelity", f"{prefix}.public.toasty"],
        kafka_stack.registry_url,
    )
    try:
        p.wait_streaming()
        create_and_fill(conn, insert=True)
        messages = reader.read(messages_expected(), timeout=120)
    finally:
        reader.close()
        p.stop()
    changes = [
        (m.value["operation"], m.value["before"], m.value["after"])
        for m in messages
        if "fidelity" in m.topic
    ]
    all_images = images(changes)
    rows = all_images[0]
    info = column_info(conn)
    problems: list[str] = []
    for name in columns():
        for image in all_images:
            got = {row_id: row[name] for row_id, row in image.items()}
            problems += mismatches(conn, info[name], got, base64_bytea=False)
    assert problems == []
    # values outside the Avro type are PostgreSQL's text in the "string" branch
    assert rows[2]["c_date"] == "infinity" and rows[1]["c_date"] == "0044-03-15 BC"
    assert rows[0]["c_date"] == date(2024, 2, 29)
    assert rows[3]["c_numeric_10_2"] == "NaN" and rows[0]["c_numeric_10_2"] == Decimal("12.50")
    assert rows[1]["a_int4"] == "{{-2147483648,NULL},{NULL,2147483647}}"
    assert rows[0]["a_date"][2] == "infinity"
    assert math.copysign(1.0, rows[1]["c_float8"]) == -1.0
    # unchanged TOAST: null in `after`, named in unchanged_toast
    toasty = [m.value for m in messages if "toasty" in m.topic]
    assert [v["operation"] for v in toasty] == ["INSERT", "UPDATE"]
    assert len(toasty[0]["after"]["big"]) == 3000 * 32 and toasty[0]["unchanged_toast"] == []
    assert toasty[1]["after"] == {"id": 1, "big": None, "n": 2}
    assert toasty[1]["unchanged_toast"] == ["big"]
