"""Every type of tests/test_type_fidelity.py round-trips through the BigQuery sink.

One pg2sink run (--sink bigquery, against the `bigquery_endpoint` server) over the
fidelity table: each value read back from the raw table with google-cloud-bigquery (its
typed column, or PostgreSQL's text in `_pg2sink_text` where the BigQuery type cannot hold
it) is rendered to PostgreSQL input text with the fidelity test's renderer and compared
with the database's own `::text`, as tests/sinks/duckdb/test_duckdb_types.py does for DuckDB.
BigQuery has no NULL array: such an array reads as [] (docs/sinks/bigquery.md), and is
compared as PostgreSQL's empty array.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
import pytest
import services
from psycopg import sql

from pg2sink.sinks.bigquery.config import BigQueryConfig
from pg2sink.sinks.bigquery.warehouse import client
from tests.conftest import fresh_database, pg2sink_for
from tests.sinks.duckdb.test_duckdb import caught_up
from tests.sinks.duckdb.test_duckdb_types import _value
from tests.sinks.warehouse_support import UNSPACED
from tests.support import FAST
from tests.test_type_fidelity import (
    CASES,
    SETUP,
    Column,
    array_column,
    column_info,
    create_fidelity_table,
    insert_fidelity_rows,
    mismatches,
    scalar_column,
)

PROJECT = "pg2sink-tests"


@dataclass
class BigQueryRun:
    conn: psycopg.Connection[Any]
    columns: dict[str, Column]
    rows: dict[str, dict[int, dict[str, Any]]]
    """Per operation, per id, each column typed or its kept text."""
    types: dict[str, tuple[str, str, int | None, int | None]]
    """The raw table's columns: BigQuery type, mode, precision, scale."""


def _read(endpoint: str, dataset: str) -> tuple[Any, Any]:
    bq = client(
        BigQueryConfig(
            bigquery_project=PROJECT, bigquery_dataset=dataset, bigquery_endpoint=endpoint
        )
    )
    try:
        table = bq.get_table(f"{PROJECT}.{dataset}.public_fidelity_raw")
        json_columns = {f.name for f in table.schema if f.field_type == "JSON"}
        # JSON as its text, as PostgreSQL's json is (the client would parse it)
        select = ", ".join(
            f"TO_JSON_STRING({f.name}) AS {f.name}" if f.name in json_columns else f.name
            for f in table.schema
        )
        rows: dict[str, dict[int, dict[str, Any]]] = {"INSERT": {}, "UPDATE": {}}
        query = f"SELECT {select} FROM `{PROJECT}.{dataset}.public_fidelity_raw`"
        for row in bq.query(query).result():
            values = dict(row.items())
            texts = orjson.loads(values["_pg2sink_text"] or "null") or {}
            rows[values["_pg2sink_operation"]][values["id"]] = {
                n: _typed(v, texts.get(n), n)
                for n, v in values.items()
                if n.startswith(("c_", "a_"))
            }
        types = {f.name: (f.field_type, f.mode, f.precision, f.scale) for f in table.schema}
        return rows, types
    finally:
        bq.close()  # type: ignore[no-untyped-call]


def _typed(value: Any, text: str | None, name: str) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    return _value(value, text, name.startswith("a_"))


@pytest.fixture(scope="module")
def bq_run(
    pg_server: services.Postgres,
    tmp_path_factory: pytest.TempPathFactory,
    bigquery_endpoint: str,
) -> Iterator[BigQueryRun]:
    workdir = tmp_path_factory.mktemp("bigquery-types")
    dataset = f"types_{uuid.uuid4().hex[:10]}"
    with fresh_database(pg_server) as db:
        conn = db.connect()
        for statement in SETUP:
            conn.execute(statement)
        create_fidelity_table(conn)
        conn.execute("ALTER TABLE fidelity REPLICA IDENTITY FULL")
        p = pg2sink_for(
            db, workdir, "--sink", "bigquery", "--bigquery-project", PROJECT,
            "--bigquery-dataset", dataset, "--bigquery-endpoint", bigquery_endpoint, *FAST,
            *UNSPACED,
        )  # fmt: skip
        p.start()
        try:
            p.wait_streaming(60)
            with conn.transaction():
                insert_fidelity_rows(conn)
            conn.execute("UPDATE fidelity SET id = id")
            caught_up(db, timeout=120)
        finally:
            assert p.stop() == 0, p.stderr()
        rows, types = _read(bigquery_endpoint, dataset)
        yield BigQueryRun(conn, column_info(conn), rows, types)


def null_ids(conn: psycopg.Connection[Any], column: str) -> list[int]:
    query = sql.SQL("SELECT id FROM fidelity WHERE {} IS NULL").format(sql.Identifier(column))
    return [row_id for (row_id,) in conn.execute(query)]


@pytest.mark.parametrize("case", [case for case, _, _ in CASES])
def test_values_round_trip_exactly(bq_run: BigQueryRun, case: str) -> None:
    for name in (scalar_column(case), array_column(case)):
        column = bq_run.columns[name]
        for operation in ("INSERT", "UPDATE"):
            got = {row_id: row[name] for row_id, row in bq_run.rows[operation].items()}
            if name.startswith("a_"):
                # BigQuery has no NULL array: NULL reads as [] (docs/sinks/bigquery.md)
                for row_id in null_ids(bq_run.conn, name):
                    assert got[row_id] == []
                    got[row_id] = None
            # an array with a NULL element is kept as JSON text, bytea in base64
            assert mismatches(bq_run.conn, column, got, base64_bytea=name == "a_bytea") == []


EXPECTED_TYPES = {
    "c_int2": ("INTEGER", "NULLABLE", None, None),
    "c_numeric_10_2": ("NUMERIC", "NULLABLE", 10, 2),
    "c_numeric": ("STRING", "NULLABLE", None, None),
    "c_float8": ("FLOAT", "NULLABLE", None, None),
    "c_bool": ("BOOLEAN", "NULLABLE", None, None),
    "c_bytea": ("BYTES", "NULLABLE", None, None),
    "c_uuid": ("STRING", "NULLABLE", None, None),
    "c_timestamp": ("DATETIME", "NULLABLE", None, None),
    "c_timestamptz": ("TIMESTAMP", "NULLABLE", None, None),
    "c_jsonb": ("STRING", "NULLABLE", None, None),
    "_pg2sink_text": ("JSON", "NULLABLE", None, None),
    "a_int4": ("INTEGER", "REPEATED", None, None),
    "a_date": ("DATE", "REPEATED", None, None),
}


def test_bigquery_types(bq_run: BigQueryRun) -> None:
    assert {n: bq_run.types.get(n) for n in EXPECTED_TYPES} == EXPECTED_TYPES
