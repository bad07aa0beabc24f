"""Every type of tests/test_type_fidelity.py round-trips through the DuckDB sink.

One pg2sink run (--sink duckdb) over the fidelity table: each value read back from the
raw table (its typed column, or PostgreSQL's text in `_pg2sink_text` where the DuckDB type
cannot hold it; an array holding such elements: its JSON form) is rendered to PostgreSQL
input text with the fidelity test's renderer and compared with the database's own
`::text`. The DuckDB column types are checked against docs/sinks/duckdb.md's table.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
import services

from tests.conftest import Database, fresh_database, pg2sink_for
from tests.sinks.duckdb.test_duckdb import caught_up
from tests.support import FAST
from tests.test_type_fidelity import (
    CASES,
    SETUP,
    Column,
    array_column,
    column_info,
    create_fidelity_table,
    insert_fidelity_rows,
    load_line,
    mismatches,
    row_count,
    scalar_column,
)


@dataclass
class DuckRun:
    db: Database
    conn: psycopg.Connection[Any]
    columns: dict[str, Column]
    inserted: dict[int, dict[str, Any]]
    """Per id, the INSERT's values: typed, or the kept text."""
    updated: dict[int, dict[str, Any]]
    """Per id, the REPLICA IDENTITY FULL UPDATE's after values."""
    view: dict[int, dict[str, Any]]
    """Per id, the latest-state view's row."""
    types: dict[str, str]
    """The raw table's DuckDB column types."""
    texts: dict[int, dict[str, str]]
    """Per id, the INSERT's `_pg2sink_text`."""


def _value(value: Any, text: str | None, is_array: bool) -> Any:
    """What the sink holds for one column: the typed value, else the kept text (an array
    with special elements: its JSON form, parsed with exact numbers)."""
    if text is None:
        return value
    if is_array and text.startswith("["):
        try:
            return load_line(text.encode())
        except ValueError:
            return text  # '[0:1]={...}': PostgreSQL's text
    return text


def _rows(con: duckdb.DuckDBPyConnection, operation: str) -> dict[int, dict[str, Any]]:
    """The raw rows of one operation by id, each column typed or its kept text."""
    cursor = con.execute(
        "SELECT * FROM public_fidelity_raw WHERE _pg2sink_operation = ?", [operation]
    )
    names = [d[0] for d in cursor.description]
    out = {}
    for row in cursor.fetchall():
        values = dict(zip(names, row, strict=True))
        texts = values["_pg2sink_text"] or {}
        out[values["id"]] = {
            n: _value(v, texts.get(n), n.startswith("a_"))
            for n, v in values.items()
            if n.startswith(("c_", "a_"))
        }
    return out


#: rows by id, {column: value}
Rows = dict[int, dict[str, Any]]


def _read(path: Path) -> tuple[Rows, Rows, Rows, dict[str, str], dict[int, dict[str, str]]]:
    """The INSERT and UPDATE raw rows, the view's rows, the raw column types and the
    INSERTs' kept texts."""
    with duckdb.connect(str(path), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        inserted, updated = _rows(con, "INSERT"), _rows(con, "UPDATE")
        cursor = con.execute("SELECT * FROM public_fidelity")
        names = [d[0] for d in cursor.description]
        view = {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}
        types = dict(
            con.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'public_fidelity_raw'"
            ).fetchall()
        )
        texts = dict(
            con.execute(
                "SELECT id, _pg2sink_text FROM public_fidelity_raw "
                "WHERE _pg2sink_operation = 'INSERT'"
            ).fetchall()
        )
    return inserted, updated, view, types, {k: v or {} for k, v in texts.items()}


@pytest.fixture(scope="module")
def duck_run(
    pg_server: services.Postgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DuckRun]:
    workdir = tmp_path_factory.mktemp("duckdb-types")
    path = workdir / "types.duckdb"
    with fresh_database(pg_server) as db:
        conn = db.connect()
        for statement in SETUP:
            conn.execute(statement)
        create_fidelity_table(conn)
        conn.execute("ALTER TABLE fidelity REPLICA IDENTITY FULL")
        p = pg2sink_for(db, workdir, "--sink", "duckdb", "--duckdb-path", str(path), *FAST)
        p.start()
        try:
            p.wait_streaming()
            with conn.transaction():
                insert_fidelity_rows(conn)
            conn.execute("UPDATE fidelity SET id = id")
            caught_up(db)
        finally:
            assert p.stop() == 0
        inserted, updated, view, types, texts = _read(path)
        yield DuckRun(db, conn, column_info(conn), inserted, updated, view, types, texts)


@pytest.mark.parametrize("case", [case for case, _, _ in CASES])
def test_values_round_trip_exactly(duck_run: DuckRun, case: str) -> None:
    for name in (scalar_column(case), array_column(case)):
        column = duck_run.columns[name]
        for rows in (duck_run.inserted, duck_run.updated):
            got = {row_id: row[name] for row_id, row in rows.items()}
            assert mismatches(duck_run.conn, column, got, base64_bytea=False) == []


def test_the_view_holds_the_latest_rows(duck_run: DuckRun) -> None:
    assert sorted(duck_run.view) == list(range(row_count()))
    for row_id, row in duck_run.view.items():
        updated = duck_run.updated[row_id]
        for name, value in row.items():
            if name != "id" and value is not None:
                # repr: NaN is not equal to itself
                assert repr(value) == repr(updated[name]), (row_id, name)


EXPECTED_TYPES = {
    "c_int2": "SMALLINT",
    "c_int4": "INTEGER",
    "c_int8": "BIGINT",
    "c_numeric_10_2": "DECIMAL(10,2)",
    "c_numeric_5_m2": "DECIMAL(7,0)",
    "c_numeric_3_5": "DECIMAL(5,5)",
    "c_numeric": "VARCHAR",
    "c_float4": "FLOAT",
    "c_float8": "DOUBLE",
    "c_bool": "BOOLEAN",
    "c_bytea": "BLOB",
    "c_uuid": "UUID",
    "c_date": "DATE",
    "c_time": "TIME",
    "c_timestamp": "TIMESTAMP",
    "c_timestamptz": "TIMESTAMP WITH TIME ZONE",
    "c_json": "JSON",
    "c_jsonb": "JSON",
    "c_interval": "VARCHAR",
    "c_price": "DECIMAL(10,2)",
    "c_moment": "TIMESTAMP WITH TIME ZONE",
    "a_int4": "INTEGER[]",
    "a_date": "DATE[]",
    "_pg2sink_before_id": "INTEGER",
}


def test_duckdb_types(duck_run: DuckRun) -> None:
    assert {n: duck_run.types.get(n) for n in EXPECTED_TYPES} == EXPECTED_TYPES


def test_special_values_keep_postgresql_text(duck_run: DuckRun) -> None:
    rows, texts = duck_run.inserted, duck_run.texts
    assert texts[1]["c_date"] == "0044-03-15 BC" and texts[2]["c_date"] == "infinity"
    assert rows[2]["c_date"] == "infinity"  # the typed column is NULL, the text kept
    assert texts[2]["c_time"] == "24:00:00"
    assert texts[1]["a_int4"] == "{{-2147483648,NULL},{NULL,2147483647}}"
    assert texts[2]["a_int4"] == "[0:1]={-2147483648,2147483647}"
    assert "c_float8" not in texts[2]  # NaN is a DuckDB double
    assert rows[3]["a_int4"] == []
