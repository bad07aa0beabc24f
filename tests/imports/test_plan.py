"""plan_import against a real PostgreSQL: partitions cover every row exactly once.

Each test checks coverage with SQL over the real table: the sum over the partitions'
predicates (as 0/1) is 1 for every row, so no row is read twice or missed.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from pg2sink.imports.plan import (
    ImportColumn,
    ImportPlan,
    NotPublishedError,
    TableNotFoundError,
    _partition_count,
    plan_import,
)
from tests.conftest import Database

Conn = psycopg.Connection[Any]


def plan_in_snapshot(conn: Conn, table: str, partitions: int) -> ImportPlan:
    """plan_import inside a REPEATABLE READ transaction, as the job runs it."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        return plan_import(conn, "public", table, target_partitions=partitions)
    finally:
        conn.execute("ROLLBACK")


def partition_sizes(conn: Conn, table: str, plan: ImportPlan) -> list[int]:
    """Rows per partition, after checking that every row is in exactly one."""
    flags = sql.SQL(" + ").join(sql.SQL("({})::int").format(sql.SQL(p)) for p in plan.predicates)
    row = conn.execute(
        sql.SQL("SELECT count(*) FILTER (WHERE {} <> 1), count(*) FROM {}").format(
            flags, sql.Identifier(table)
        )
    ).fetchone()
    assert row is not None
    assert row[0] == 0, f"{row[0]} of {row[1]} rows are not in exactly one partition"
    sizes = []
    for p in plan.predicates:
        got = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE {}").format(sql.Identifier(table), sql.SQL(p))
        ).fetchone()
        assert got is not None
        sizes.append(int(got[0]))
    assert sum(sizes) == row[1]
    return sizes


def assert_balanced(sizes: list[int]) -> None:
    share = sum(sizes) / len(sizes)
    assert all(0.5 * share <= s <= 1.6 * share for s in sizes), sizes


def test_integer_key_value_ranges(pg_conn: Conn) -> None:
    pg_conn.execute("CREATE TABLE t (id int8 PRIMARY KEY, v text)")
    pg_conn.execute("INSERT INTO t SELECT i, 'v' || i FROM generate_series(1, 120000) i")
    pg_conn.execute("ANALYZE t")
    plan = plan_in_snapshot(pg_conn, "t", 4)
    assert plan.primary_key == ("id",)
    assert plan.columns == (ImportColumn("id", 20, -1), ImportColumn("v", 25, -1))
    assert len(plan.predicates) == 4
    assert plan.predicates[0].startswith('"id" < ')
    assert 100_000 <= plan.rows_estimated <= 140_000
    assert_balanced(partition_sizes(pg_conn, "t", plan))
    # planned again over the same data: the same boundaries (sample is REPEATABLE)
    assert plan_in_snapshot(pg_conn, "t", 4).predicates == plan.predicates


def test_composite_key_row_comparison(pg_conn: Conn) -> None:
    pg_conn.execute("CREATE TABLE t (region text, n int4, v int4, PRIMARY KEY (region, n))")
    pg_conn.execute("INSERT INTO t SELECT 'r' || (i % 7), i, i FROM generate_series(1, 70000) i")
    plan = plan_in_snapshot(pg_conn, "t", 5)
    assert plan.primary_key == ("region", "n")
    assert len(plan.predicates) == 5
    assert '("region", "n") >= (' in plan.predicates[1]
    assert_balanced(partition_sizes(pg_conn, "t", plan))


def test_text_key_uses_the_columns_collation(pg_conn: Conn) -> None:
    # mixed case, digits, accents and spaces: any mismatch between the sample's ORDER BY
    # and the predicates' comparison would drop or double rows
    pg_conn.execute('CREATE TABLE t (k text COLLATE "C" PRIMARY KEY, v int)')
    pg_conn.execute(
        "INSERT INTO t SELECT (ARRAY['a','B','é','Z ','0'])[1 + i % 5] || md5(i::text), i"
        " FROM generate_series(1, 40000) i"
    )
    pg_conn.execute("CREATE TABLE u (k varchar(40) PRIMARY KEY, v int)")
    pg_conn.execute("INSERT INTO u SELECT k, v FROM t")
    for table in ("t", "u"):
        plan = plan_in_snapshot(pg_conn, table, 3)
        assert len(plan.predicates) == 3
        assert_balanced(partition_sizes(pg_conn, table, plan))


def test_table_without_key_uses_ctid_ranges(pg_conn: Conn) -> None:
    pg_conn.execute("CREATE TABLE t (a int, b text) WITH (autovacuum_enabled = false)")
    pg_conn.execute("INSERT INTO t SELECT i, repeat('x', 50) FROM generate_series(1, 60000) i")
    # dead versions and rows moved to new pages must not change coverage
    pg_conn.execute("UPDATE t SET b = 'y' WHERE a % 10 = 0")
    plan = plan_in_snapshot(pg_conn, "t", 4)
    assert plan.primary_key == ()
    assert len(plan.predicates) == 4
    assert all("ctid" in p for p in plan.predicates)
    assert_balanced(partition_sizes(pg_conn, "t", plan))


def test_empty_and_small_tables_are_one_partition(pg_conn: Conn) -> None:
    pg_conn.execute("CREATE TABLE empty (id int PRIMARY KEY)")
    pg_conn.execute("CREATE TABLE small (id int PRIMARY KEY)")
    pg_conn.execute("INSERT INTO small SELECT generate_series(1, 500)")
    empty = plan_in_snapshot(pg_conn, "empty", 8)
    assert empty.predicates == ("TRUE",)
    assert empty.rows_estimated == 0
    assert partition_sizes(pg_conn, "empty", empty) == [0]
    small = plan_in_snapshot(pg_conn, "small", 8)
    assert small.predicates == ("TRUE",)
    assert partition_sizes(pg_conn, "small", small) == [500]


def test_partition_count_between_the_row_bounds() -> None:
    assert _partition_count(0, 8) == 1
    assert _partition_count(35_000, 8) == 3  # at least 10,000 rows per partition
    assert _partition_count(5_000_000, 4) == 4
    # at most 5,000,000 rows per partition, whatever the target (a restart re-reads less)
    assert _partition_count(100_000_000, 4) == 20
    assert _partition_count(100_000_001, 4) == 21


def test_skewed_keys_still_give_even_partitions(pg_conn: Conn) -> None:
    # 99.9% of the keys are dense and small, a few are huge: value ranges evenly spread
    # between min and max would put nearly every row in the first partition
    pg_conn.execute("CREATE TABLE t (id int8 PRIMARY KEY)")
    pg_conn.execute("INSERT INTO t SELECT generate_series(1, 80000)")
    pg_conn.execute("INSERT INTO t SELECT 1000000000000 * i FROM generate_series(1, 80) i")
    pg_conn.execute("ANALYZE t")
    plan = plan_in_snapshot(pg_conn, "t", 4)
    assert len(plan.predicates) == 4
    assert_balanced(partition_sizes(pg_conn, "t", plan))


def test_quoted_identifiers_and_dropped_columns(pg_conn: Conn) -> None:
    pg_conn.execute('CREATE TABLE "Odd Table" ("Key ""x""" int PRIMARY KEY, gone int, v text)')
    pg_conn.execute('ALTER TABLE "Odd Table" DROP COLUMN gone')
    pg_conn.execute('INSERT INTO "Odd Table" SELECT i, i::text FROM generate_series(1, 30000) i')
    plan = plan_in_snapshot(pg_conn, "Odd Table", 3)
    assert [c.name for c in plan.columns] == ['Key "x"', "v"]
    assert len(plan.predicates) == 3
    assert_balanced(partition_sizes(pg_conn, "Odd Table", plan))


def test_missing_table(db: Database) -> None:
    conn = db.connect()
    with pytest.raises(TableNotFoundError, match=r"public\.nope"):
        plan_in_snapshot(conn, "nope", 2)


def _plan_published(conn: Conn, db: Database, table: str) -> ImportPlan:
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        return plan_import(conn, "public", table, target_partitions=1, publication=db.publication)
    finally:
        conn.execute("ROLLBACK")


@pytest.mark.pg_since(15)  # column lists and row filters
def test_only_what_the_publication_publishes(db: Database) -> None:
    conn = db.connect()
    pub = sql.Identifier(db.publication)
    conn.execute(
        "CREATE TABLE g (id int PRIMARY KEY, v int, twice int GENERATED ALWAYS AS (v * 2) STORED)"
    )
    conn.execute("CREATE TABLE r (id int PRIMARY KEY, v text, pw text) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE r1 PARTITION OF r FOR VALUES FROM (0) TO (10)")
    conn.execute("CREATE TABLE r2 PARTITION OF r FOR VALUES FROM (10) TO (20)")
    conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE g, r").format(pub))
    # pgoutput of PostgreSQL 15 never sends a generated column
    assert [c.name for c in _plan_published(conn, db, "g").columns] == ["id", "v"]
    # a root published without publish_via_partition_root: its leaves, whole
    plan = _plan_published(conn, db, "r")
    assert ([c.name for c in plan.columns], plan.row_filter) == (["id", "v", "pw"], None)
    # ... unless a leaf is published with a column list of its own
    conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE r2 (id, v)").format(pub))
    with pytest.raises(NotPublishedError, match="their own column lists or row filters"):
        _plan_published(conn, db, "r")
    conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
    with pytest.raises(NotPublishedError, match="not in publication"):
        _plan_published(conn, db, "other")
