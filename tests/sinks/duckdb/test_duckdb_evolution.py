"""The DuckDB sink's view where the changelog alone does not say what a row holds: columns
added with a DEFAULT (PostgreSQL's missing value, no change of the old rows logged), a
column added again after a DROP, and tables without a key (REPLICA IDENTITY FULL: a
multiset; NOTHING: inserts only). A real PostgreSQL and pg2sink as users run it
(docs/sinks/duckdb.md "Schema evolution", "The view").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import Database
from tests.sinks.duckdb.test_duckdb import caught_up, duck_rows, pg_rows, start
from tests.sinks.warehouse_support import duck_query
from tests.support import Proc


@pytest.fixture
def conn(db: Database) -> psycopg.Connection[Any]:
    c = db.connect()
    c.execute("SET TimeZone = 'UTC'")
    return c


@pytest.mark.slow
def test_columns_added_with_a_default_read_it_for_old_rows(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, a text)")
    path = tmp_path / "missing.duckdb"
    p = start(pg2sink_proc, path)
    conn.execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 6) g")
    conn.execute("UPDATE t SET a = 'changed' WHERE id = 2")
    conn.execute("DELETE FROM t WHERE id = 6")
    # one statement: the Schema record shows all four at once
    conn.execute(
        "ALTER TABLE t ADD COLUMN c int DEFAULT 7, ADD COLUMN s text DEFAULT 'x,''y\"',"
        " ADD COLUMN arr int[] DEFAULT '{1,NULL,3}',"
        " ADD COLUMN ts timestamptz DEFAULT '2024-01-01 10:00:00.5+02'"
    )
    conn.execute("INSERT INTO t VALUES (10, 'new', NULL, NULL, NULL, NULL)")  # real NULLs
    conn.execute("INSERT INTO t (id, a) VALUES (11, 'defaults')")
    conn.execute("UPDATE t SET a = 'after' WHERE id = 1")  # its new row carries c = 7
    conn.execute("UPDATE t SET c = 8 WHERE id = 3")
    # a column added again after a DROP is another column: old rows read NULL there
    conn.execute("ALTER TABLE t DROP COLUMN a")
    conn.execute("ALTER TABLE t ADD COLUMN a text")
    conn.execute("ALTER TABLE t ADD COLUMN later numeric(6,2) DEFAULT 1.5")
    conn.execute("INSERT INTO t (id, a) VALUES (12, 'last')")
    caught_up(db)
    assert p.stop() == 0
    rows = pg_rows(conn, "t", "id")
    assert rows[0][1:3] == (7, "x,'y\"") and rows[0][-1] == 1.5  # what the test is about
    assert duck_rows(path, "public_t", "id") == rows
    # the raw rows keep what was logged: nothing for the old rows' new columns
    assert duck_query(path, "SELECT c FROM public_t_raw WHERE id = 4") == [(None,)]


@pytest.mark.slow
def test_a_volatile_default_rewrites_the_table_unlogged(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, tmp_path: Path
) -> None:
    """The documented limit: a volatile default (random(), clock_timestamp()) makes
    PostgreSQL rewrite the table with a value per row and log none of them; a missing
    value earlier columns had is written into the rows and leaves the catalog too. The
    view reads NULL for rows from before, until they change."""
    conn.execute("CREATE TABLE v (id int PRIMARY KEY)")
    path = tmp_path / "volatile.duckdb"
    p = start(pg2sink_proc, path)
    conn.execute("INSERT INTO v SELECT generate_series(1, 3)")
    conn.execute("ALTER TABLE v ADD COLUMN c int DEFAULT 7")
    conn.execute("ALTER TABLE v ADD COLUMN r float8 DEFAULT random()")
    conn.execute("INSERT INTO v VALUES (4, 8, 0.5)")
    conn.execute("UPDATE v SET c = 9 WHERE id = 3")
    caught_up(db)
    assert p.stop() == 0
    table = pg_rows(conn, "v", "id")
    assert all(r is not None for _, _, r in table)
    view = duck_rows(path, "public_v", "id")
    assert view == [(1, None, None), (2, None, None), (3, 9, table[2][2]), (4, 8, 0.5)]
    changes = duck_query(path, "SELECT count(*) FROM public_v_raw")
    assert changes == [(5,)]  # 3 inserts, the insert and the update: no row of the rewrite


def multiset(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows, key=repr)


def pg_multiset(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Table f's rows, jsonb as PostgreSQL's text (the view's JSON is that text)."""
    columns = [c.name for c in conn.execute("SELECT * FROM f LIMIT 0").description or []]
    listed = ", ".join("j::text" if c == "j" else c for c in columns)
    return multiset(conn.execute(f"SELECT {listed} FROM f").fetchall())


@pytest.mark.slow
def test_tables_without_a_key_are_multisets(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE f (line text, n int, j jsonb)")
    conn.execute("ALTER TABLE f REPLICA IDENTITY FULL")
    conn.execute("CREATE TABLE nothing (line text)")
    conn.execute("ALTER TABLE nothing REPLICA IDENTITY NOTHING")
    path = tmp_path / "keyless.duckdb"
    p = start(pg2sink_proc, path, "--allow-no-replica-identity")
    a = "('a', 1, '{\"k\": 1}')"
    conn.execute(f"INSERT INTO f VALUES {a}, {a}, {a}, ('b', 2, NULL), (NULL, NULL, NULL)")
    conn.execute("INSERT INTO f VALUES (NULL, NULL, NULL)")
    one_a = "ctid = (SELECT ctid FROM f WHERE line = 'a' LIMIT 1)"
    conn.execute(f"DELETE FROM f WHERE {one_a}")  # one copy of three
    conn.execute(f"UPDATE f SET n = 5 WHERE {one_a}")
    conn.execute("UPDATE f SET line = 'b' WHERE line = 'b'")  # the same row again
    conn.execute("DELETE FROM f WHERE ctid = (SELECT ctid FROM f WHERE line IS NULL LIMIT 1)")
    caught_up(db)
    assert p.stop() == 0  # DuckDB lets one process open the file
    assert multiset(duck_rows(path, "public_f", "1")) == pg_multiset(conn)
    p.start().wait_streaming()
    # an added column's missing value on both sides: an old row's before-image (with the
    # value) takes away the copy its INSERT (from before the column) put
    conn.execute("ALTER TABLE f ADD COLUMN c int DEFAULT 7")
    conn.execute("UPDATE f SET c = 8 WHERE line = 'b'")
    conn.execute(f"DELETE FROM f WHERE {one_a}")
    conn.execute("INSERT INTO f VALUES ('a', 1, '{\"k\": 1}', NULL)")
    conn.execute("INSERT INTO nothing VALUES ('x'), ('x'), ('y')")
    conn.execute("TRUNCATE nothing")
    conn.execute("INSERT INTO nothing VALUES ('z'), ('z')")
    caught_up(db)
    assert p.stop() == 0
    assert multiset(duck_rows(path, "public_f", "1")) == pg_multiset(conn)
    assert duck_rows(path, "public_nothing", "1") == [("z",), ("z",)]
    # the before-images are in the raw table
    deleted = duck_query(
        path, "SELECT _pg2sink_before_line, _pg2sink_before_c FROM public_f_raw "
        "WHERE _pg2sink_operation = 'DELETE' ORDER BY _pg2sink_position"
    )  # fmt: skip
    assert deleted == [("a", None), (None, None), ("a", 7)]
