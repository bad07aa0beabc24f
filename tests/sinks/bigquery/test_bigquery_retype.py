"""Type changes on the BigQuery sink (issue 13: "a type change the engine can widen is
applied, any other is an error that stops the stream with nothing confirmed").

The rule (schema.widens, schema.retyped, schema.alter_sql) is tested as plain functions;
end to end, local-bigquery refuses the widening ALTER (it stores every NUMERIC as DuckDB's
DECIMAL(38,9), and DuckLake takes a narrower DECIMAL as a narrowing), so the test shows
what a refusal does: the stream stops with one line naming it, exit 2, nothing after the
change confirmed, and the statement sent is the expected one, read back from
local-bigquery's job list (docs/sinks/bigquery.md, "Type changes").
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pg2sink.sinks.bigquery.schema import Field, alter_sql, retyped, widens
from pg2sink.sinks.bigquery.warehouse import client
from tests.conftest import Database
from tests.sinks.bigquery.test_bigquery import start
from tests.sinks.duckdb.test_duckdb import caught_up
from tests.sinks.warehouse_support import PROJECT, bq_rows, config
from tests.support import Proc


def numeric(p: int, s: int, kind: str = "NUMERIC", repeated: bool = False) -> Field:
    return Field("c", kind, repeated, p, s)


@pytest.mark.parametrize(
    ("old", "new", "wider"),
    [
        (numeric(6, 2), numeric(12, 4), True),  # more digits on both sides
        (numeric(6, 2), numeric(8, 2), True),
        (numeric(6, 2), numeric(7, 3), True),
        (numeric(6, 2), numeric(6, 3), False),  # a digit moved past the point
        (numeric(6, 2), numeric(5, 2), False),
        (numeric(12, 4), numeric(6, 2), False),
        (numeric(20, 9), numeric(40, 10, "BIGNUMERIC"), True),  # beyond NUMERIC
        (numeric(10, 2), numeric(20, 12, "BIGNUMERIC"), True),
        (numeric(10, 2), numeric(12, 10, "BIGNUMERIC"), False),
        (numeric(40, 10, "BIGNUMERIC"), numeric(20, 9), False),  # never back
        (numeric(40, 10, "BIGNUMERIC"), numeric(45, 12, "BIGNUMERIC"), True),
        (numeric(6, 2, repeated=True), numeric(12, 4, repeated=True), True),
        (numeric(6, 2), numeric(12, 4, repeated=True), False),
        (numeric(6, 2), Field("c", "STRING"), False),  # a numeric over 38 digits is text
        (Field("c", "INT64"), Field("c", "STRING"), False),
    ],
)
def test_which_type_changes_bigquery_widens(old: Field, new: Field, wider: bool) -> None:
    assert widens(old, new) is wider


def test_only_decimal_columns_whose_digits_change_are_retyped() -> None:
    table = [
        Field("id", "INTEGER"),  # BigQuery's name of INT64: not a change
        Field("price", "NUMERIC", False, 6, 2),
        Field("qty", "NUMERIC", False, 10, 0),
        Field("big", "NUMERIC", False, 30, 9),
        Field("text", "STRING"),
    ]
    wanted = [
        Field("id", "INT64"),
        Field("price", "NUMERIC", False, 12, 4),
        Field("qty", "NUMERIC", False, 10, 0),
        Field("big", "STRING"),
        Field("text", "STRING"),
        Field("new", "NUMERIC", False, 5, 1),  # added, not retyped
    ]
    assert retyped(table, wanted) == [(table[1], wanted[1]), (table[3], wanted[3])]


def test_the_ddl_of_a_widening() -> None:
    assert alter_sql("p.d", "public_t_raw", Field("price", "NUMERIC", False, 12, 4)) == (
        "ALTER TABLE `p.d.public_t_raw` ALTER COLUMN `price` SET DATA TYPE NUMERIC(12, 4)"
    )
    assert alter_sql("p.d", "r", Field("a", "BIGNUMERIC", True, 40, 20)) == (
        "ALTER TABLE `p.d.r` ALTER COLUMN `a` SET DATA TYPE ARRAY<BIGNUMERIC(40, 20)>"
    )


# --- end to end: local-bigquery refuses the widening ---------------------------------------


@pytest.mark.slow
def test_a_widening_the_server_refuses_stops_the_stream_with_nothing_confirmed(
    db: Database, pg2sink_proc: Proc, bigquery_endpoint: str, topic_prefix: str
) -> None:
    dataset = f"d_{topic_prefix}"
    since = datetime.now(UTC) - timedelta(seconds=5)
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, price numeric(6,2))")
    p = start(pg2sink_proc, bigquery_endpoint, dataset)
    conn.execute("INSERT INTO t VALUES (1, 1234.56)")
    caught_up(db, timeout=60)
    conn.execute("ALTER TABLE t ALTER COLUMN price TYPE numeric(12,4)")
    conn.execute("INSERT INTO t VALUES (2, 12345678.1234)")
    after_change = db.current_lsn()
    assert p.proc is not None and p.proc.wait(60) == 2
    last = p.stderr().strip().splitlines()[-1]
    # one line naming the refusal: the column, both types and the server's reason
    assert last.startswith(
        "pg2sink: error: bigquery refused to change column 'price' of public_t_raw "
        "(public.t) from NUMERIC(6, 2) to NUMERIC(12, 4) (ALTER COLUMN SET DATA TYPE): "
    ), last
    assert "only widening type promotions are allowed" in last
    confirmed = db.slot_confirmed_lsn()
    assert confirmed is not None and confirmed < after_change
    ds = f"{PROJECT}.{dataset}"
    assert bq_rows(bigquery_endpoint, f"SELECT id FROM `{ds}.public_t_raw`") == [(1,)]
    # the statement the sink sent, as the server's job list holds it (failed jobs kept)
    bq = client(config(bigquery_endpoint, dataset))
    try:
        jobs = [
            j
            for j in bq.list_jobs(min_creation_time=since, state_filter="done")
            if j.job_type == "query" and "SET DATA TYPE" in j.query and ds in j.query
        ]
    finally:
        bq.close()  # type: ignore[no-untyped-call]
    assert [j.query for j in jobs] == [
        alter_sql(ds, "public_t_raw", Field("price", "NUMERIC", False, 12, 4))
    ]
    assert "only widening type promotions" in jobs[0].error_result["message"]
