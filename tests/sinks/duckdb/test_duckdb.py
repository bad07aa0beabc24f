"""The DuckDB sink (--sink=duckdb) end to end: a real PostgreSQL, pg2sink run as users run
it, and the real embedded DuckDB file read afterwards (docs/sinks/duckdb.md).

The latest-state view must equal `SELECT * FROM table` after inserts, updates (key
changes and unchanged TOASTed values among them), deletes and TRUNCATE, across schema
changes, and after pg2sink is killed with SIGKILL under a concurrent writer (no row
twice in the raw table: exactly once).
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from tests.conftest import Database, Pg2Sink, run_cli, wait_for
from tests.imports.support import wait_imported
from tests.sinks.warehouse_support import duck_query, normal
from tests.support import FAST, Proc, RandomWriter


def start(proc: Proc, path: Path, *extra: str, env: dict[str, str] | None = None) -> Pg2Sink:
    """pg2sink with the DuckDB sink writing `path`, once it streams."""
    p = proc("--sink", "duckdb", "--duckdb-path", str(path), *FAST, *extra, env=env).start()
    p.wait_streaming()
    return p


def caught_up(db: Database, timeout: float = 60.0) -> None:
    """Wait until the slot confirms everything written so far (DuckDB committed it)."""
    target = db.current_lsn()
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= target, timeout, "pg2sink to catch up")


def pg_rows(conn: psycopg.Connection[Any], table: str, order: str) -> list[tuple[Any, ...]]:
    rows = conn.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
    return [tuple(normal(v) for v in row) for row in rows]


def duck_rows(path: Path, view: str, order: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(path), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        rows = con.execute(f"SELECT * FROM {view} ORDER BY {order}").fetchall()
    return [tuple(normal(v) for v in row) for row in rows]


@pytest.fixture
def conn(db: Database) -> psycopg.Connection[Any]:
    c = db.connect()
    c.execute("SET TimeZone = 'UTC'")
    return c


# --- configuration -----------------------------------------------------------------------


def test_a_path_in_no_directory_is_a_one_line_error(tmp_path: Path) -> None:
    done = run_cli("stream", "--sink", "duckdb", "--duckdb-path", str(tmp_path / "no" / "x.db"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "--duckdb-path" in done.stderr and "no directory" in done.stderr


def test_duckdb_needs_a_path() -> None:
    done = run_cli("stream", "--sink", "duckdb")
    assert done.returncode == 2 and "needs --duckdb-path FILE" in done.stderr


def test_a_file_that_is_not_a_database_is_a_one_line_error(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100)
    p = pg2sink_proc("--sink", "duckdb", "--duckdb-path", str(path)).start()
    assert p.proc is not None and p.proc.wait(60) == 2
    last = p.stderr().strip().splitlines()
    assert len(last) == 1 and last[0].startswith("pg2sink: error: cannot open --duckdb-path"), last


# --- the view equals the table ------------------------------------------------------------

BIG = "".join(f"{i:05d}" for i in range(3000))  # 15 kB, stored out of line (EXTERNAL)


def create_workload_tables(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text, big text, price numeric(10,2),"
        " tags text[], at timestamptz, raw bytea, flag bool)"
    )
    conn.execute("ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL")
    conn.execute("CREATE TABLE docs (lang text, id int, body text, PRIMARY KEY (lang, id))")
    # no key (published with REPLICA IDENTITY FULL): its view is its rows since TRUNCATE
    conn.execute("CREATE TABLE log (line text)")
    conn.execute("ALTER TABLE log REPLICA IDENTITY FULL")


def run_workload(conn: psycopg.Connection[Any]) -> None:
    """Inserts, updates (TOAST left unchanged, key changes), deletes and TRUNCATEs."""
    for i in range(1, 21):
        conn.execute(
            "INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (i, f"n{i}", BIG + str(i), Decimal(i) / 4, ["a", None, f"t{i}"],
             "2024-05-01 10:00:00+00", bytes([i, 0, 255]), i % 2 == 0),
        )  # fmt: skip
    with conn.transaction():
        conn.execute("UPDATE items SET name = name || '!' WHERE id <= 5")  # big unchanged
        conn.execute("UPDATE items SET id = id + 100 WHERE id IN (6, 7)")  # key change, TOAST
        conn.execute("UPDATE items SET id = 200, big = 'small now' WHERE id = 8")
        conn.execute("DELETE FROM items WHERE id IN (9, 10)")
    conn.execute("UPDATE items SET price = NULL, tags = '{}' WHERE id = 106")
    conn.execute("UPDATE items SET id = 9 WHERE id = 107")  # back to a deleted key
    conn.execute("INSERT INTO items (id, name) VALUES (10, 'again')")
    conn.execute("UPDATE items SET flag = NOT flag WHERE id > 15")
    for lang in ("en", "de"):
        for i in range(5):
            conn.execute("INSERT INTO docs VALUES (%s, %s, %s)", (lang, i, f"{lang}{i}"))
    conn.execute("UPDATE docs SET lang = 'fr' WHERE lang = 'de' AND id < 2")
    conn.execute("TRUNCATE docs")
    conn.execute("INSERT INTO docs VALUES ('en', 1, 'after truncate'), ('fr', 1, 'x')")
    conn.execute("DELETE FROM docs WHERE lang = 'fr'")
    conn.execute("INSERT INTO log SELECT 'l' || g FROM generate_series(1, 5) g")
    conn.execute("TRUNCATE log")
    conn.execute("INSERT INTO log VALUES ('kept')")
    with conn.transaction():
        conn.execute("INSERT INTO items (id, name) VALUES (300, 'in and out')")
        conn.execute("DELETE FROM items WHERE id = 300")
        conn.execute("UPDATE items SET name = 'twice' WHERE id = 1")
        conn.execute("UPDATE items SET name = 'three times' WHERE id = 1")


@pytest.mark.slow
def test_the_view_equals_the_table_after_a_workload(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, tmp_path: Path
) -> None:
    create_workload_tables(conn)
    path = tmp_path / "shop.duckdb"
    p = start(pg2sink_proc, path)
    run_workload(conn)
    caught_up(db)
    assert p.stop() == 0
    assert duck_rows(path, "public_items", "id") == pg_rows(conn, "items", "id")
    assert duck_rows(path, "public_docs", "lang, id") == pg_rows(conn, "docs", "lang, id")
    assert duck_rows(path, "public_log", "line") == [("kept",)]
    # the unchanged TOASTed values were filled from the key's previous row (the old key's
    # for a key change), and the raw rows say which
    filled = duck_query(
        path,
        "SELECT id, _pg2sink_unchanged_toast FROM public_items_raw "
        "WHERE _pg2sink_unchanged_toast IS NOT NULL AND id IN (1, 106)",
    )
    assert {(i, tuple(c)) for i, c in filled} >= {(1, ("big",)), (106, ("big",))}
    # the raw table keeps every change; a DELETE's key is in the before-image column
    (deleted,) = duck_query(
        path,
        "SELECT list(_pg2sink_before_id ORDER BY _pg2sink_before_id) FROM public_items_raw "
        "WHERE _pg2sink_operation = 'DELETE'",
    )
    assert deleted[0] == [9, 10, 300]


@pytest.mark.slow
def test_a_restart_continues_without_duplicates(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, tmp_path: Path
) -> None:
    create_workload_tables(conn)
    path = tmp_path / "shop.duckdb"
    p = start(pg2sink_proc, path)
    conn.execute("INSERT INTO docs VALUES ('en', 1, 'one')")
    caught_up(db)
    assert p.stop() == 0
    p.start().wait_streaming()
    conn.execute("INSERT INTO docs VALUES ('en', 2, 'two')")
    caught_up(db)
    assert p.stop() == 0
    assert duck_rows(path, "public_docs", "id") == [("en", 1, "one"), ("en", 2, "two")]
    assert duck_query(path, "SELECT count(*) FROM public_docs_raw") == [(2,)]
    ((slot, lsn),) = duck_query(path, "SELECT slot, lsn FROM pg2sink_state")
    assert slot == db.slot and lsn <= (db.slot_confirmed_lsn() or 0)


# --- schema evolution -------------------------------------------------------------------


@pytest.mark.slow
def test_schema_changes_follow_the_table(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int, b text)")
    path = tmp_path / "evolve.duckdb"
    p = start(pg2sink_proc, path)
    conn.execute("INSERT INTO t VALUES (1, 10, 'one'), (2, 20, 'two')")
    conn.execute("ALTER TABLE t ADD COLUMN c numeric(6,2)")
    conn.execute("INSERT INTO t VALUES (3, 30, 'three', 3.5)")
    conn.execute("ALTER TABLE t DROP COLUMN b")
    conn.execute("UPDATE t SET a = 11 WHERE id = 1")
    conn.execute("ALTER TABLE t ALTER COLUMN a TYPE bigint, ALTER COLUMN c TYPE numeric(12,4)")
    conn.execute("INSERT INTO t VALUES (4, 9000000000, 4.1234)")
    caught_up(db)
    assert p.stop() == 0
    assert duck_rows(path, "public_t", "id") == pg_rows(conn, "t", "id")
    columns = duck_query(
        path,
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'public_t_raw' AND column_name IN ('a', 'b', 'c')",
    )
    # b is kept in the raw table; a and c were widened in place
    assert sorted(columns) == [("a", "BIGINT"), ("b", "VARCHAR"), ("c", "DECIMAL(12,4)")]
    assert duck_query(path, "SELECT b FROM public_t_raw WHERE id = 2") == [("two",)]


@pytest.mark.slow
def test_a_type_change_duckdb_cannot_apply_stops_the_stream(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int)")
    path = tmp_path / "narrow.duckdb"
    p = start(pg2sink_proc, path)
    conn.execute("INSERT INTO t VALUES (1, 10)")
    caught_up(db)
    before = db.slot_confirmed_lsn()
    conn.execute("ALTER TABLE t ALTER COLUMN a TYPE text")
    conn.execute("INSERT INTO t VALUES (2, 'two')")
    after_commit = db.current_lsn()
    assert p.proc is not None and p.proc.wait(60) == 2
    last = p.stderr().strip().splitlines()[-1]
    assert last.startswith("pg2sink: error: column 'a' of public.t changed from DuckDB INTEGER")
    confirmed = db.slot_confirmed_lsn()
    assert confirmed is not None and before is not None and confirmed < after_commit
    assert duck_query(path, "SELECT id, a FROM public_t") == [(1, 10)]
    ((stored,),) = duck_query(path, "SELECT lsn FROM pg2sink_state")
    assert stored < after_commit


# --- kill -9: exactly once ---------------------------------------------------------------


class Writer(RandomWriter):
    """Random transactions on table `w` (keys 1 to `keys`, and as many more for key
    changes) until stopped: inserts, updates (key changes too), deletes; a TRUNCATE now
    and then when `truncate`."""

    def __init__(self, db: Database, seed: int, keys: int = 60, truncate: bool = True) -> None:
        super().__init__(db, seed)
        self.keys = keys
        self.truncate = truncate

    def _statement(self) -> None:
        rng, c = self.rng, self.conn
        key = rng.randint(1, self.keys)
        choice = rng.random()
        if choice < 0.45:
            c.execute(
                "INSERT INTO w VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET n = w.n + 1",
                (key, rng.randint(0, 1000), f"v{rng.random()}"),
            )
        elif choice < 0.7:
            c.execute("UPDATE w SET n = n + 1, s = %s WHERE id = %s", (f"u{rng.random()}", key))
        elif choice < 0.8:
            new = rng.randint(self.keys + 1, 2 * self.keys)
            c.execute(
                "UPDATE w SET id = %s WHERE id = %s AND NOT EXISTS (SELECT 1 FROM w WHERE id = %s)",
                (new, key, new),
            )
        elif choice < 0.995 or not self.truncate:
            c.execute("DELETE FROM w WHERE id = %s OR id = %s", (key, key + self.keys))
        else:
            c.execute("TRUNCATE w")


def converged(
    db: Database, conn: psycopg.Connection[Any], p: Pg2Sink, path: Path, writer: Writer
) -> None:
    """Once `writer` is done and pg2sink caught up and stopped: table w's view equals the
    table, and no streamed change is in the raw table twice (exactly once)."""
    writer.stopped.set()
    writer.join(30)
    assert writer.error is None and writer.transactions > 50
    caught_up(db)
    assert p.stop() == 0
    assert duck_rows(path, "public_w", "id") == pg_rows(conn, "w", "id")
    twice = duck_query(
        path,
        "SELECT _pg2sink_xid, _pg2sink_lsn, _pg2sink_sequence, count(*) FROM public_w_raw "
        "WHERE _pg2sink_operation <> 'IMPORT' GROUP BY ALL HAVING count(*) > 1",
    )
    assert twice == []


@pytest.fixture
def writer(db: Database) -> Iterator[Writer]:
    conn = db.connect()
    conn.execute("CREATE TABLE w (id int PRIMARY KEY, n int, s text)")
    w = Writer(db, seed=12)
    yield w
    w.stopped.set()
    if w.is_alive():
        w.join(10)


@pytest.mark.slow
def test_kill_9_under_a_concurrent_writer_is_exactly_once(
    db: Database,
    conn: psycopg.Connection[Any],
    pg2sink_proc: Proc,
    tmp_path: Path,
    writer: Writer,
) -> None:
    path = tmp_path / "kill.duckdb"
    # --retry-initial: the killed process's walsender may hold the slot for a moment
    p = start(pg2sink_proc, path, "--retry-initial")
    writer.start()
    rng = random.Random(7)
    for _ in range(4):
        time.sleep(rng.uniform(0.5, 1.5))
        p.stop(signal.SIGKILL)
        p.start().wait_streaming()
    time.sleep(1)
    converged(db, conn, p, path, writer)
    # some restart found transactions in the file that the slot had not confirmed yet
    logs = [f.read_text() for f in tmp_path.glob("stderr.*.log")]
    assert len(logs) == 5 and any("already: skipped" in log for log in logs)
    ((rows,),) = duck_query(path, "SELECT count(*) FROM public_w_raw")
    assert rows > writer.transactions  # the comparison above had work to do


# --- imports -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tables_existing_rows_are_imported(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE old (id int PRIMARY KEY, s text, big text, at timestamptz)")
    conn.execute("ALTER TABLE old ALTER COLUMN big SET STORAGE EXTERNAL")
    conn.execute(
        "INSERT INTO old SELECT g, 's' || g, CASE WHEN g = 7 THEN %s END, "
        "'2024-01-01 00:00+00'::timestamptz + g * interval '1 hour' "
        "FROM generate_series(1, 3000) g",
        (BIG,),
    )
    path = tmp_path / "imports.duckdb"
    p = start(pg2sink_proc, path, env={"PG2SINK_NO_IMPORTS": "0"})
    wait_imported(db, {"public.old"}, p)
    conn.execute("UPDATE old SET s = 'streamed' WHERE id IN (7, 8)")  # 7: TOAST unchanged
    conn.execute("DELETE FROM old WHERE id = 9")
    caught_up(db)
    assert p.stop() == 0
    assert duck_rows(path, "public_old", "id") == pg_rows(conn, "old", "id")
    assert duck_query(
        path, "SELECT count(*) FROM public_old_raw WHERE _pg2sink_operation = 'IMPORT'"
    ) == [(3000,)]
    assert not list(Path(str(path) + ".imports").glob("*.parquet"))  # loaded, removed


@pytest.mark.slow
def test_an_import_under_writes_and_a_kill_9_converges(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE w (id int PRIMARY KEY, n int, s text)")
    conn.execute(
        "INSERT INTO w SELECT g, g, repeat('x', 200) || g FROM generate_series(1, 200000) g"
    )
    writer = Writer(db, seed=5, keys=200_000, truncate=False)
    writer.start()  # transactions are in flight when the table joins
    try:
        path = tmp_path / "import-kill.duckdb"
        env = {"PG2SINK_NO_IMPORTS": "0"}
        p = start(pg2sink_proc, path, "--retry-initial", env=env)

        def some_done() -> bool:
            assert p.proc is not None and p.proc.poll() is None, p.stderr()
            try:
                done = conn.execute(
                    "SELECT count(*) FILTER (WHERE done), count(*) FROM pg2sink.import_partitions"
                ).fetchone()
            except psycopg.errors.UndefinedTable:
                return False
            # at least one: on a busy machine the whole import may be done before a poll
            # sees it half-way (the kill then comes after it)
            return done is not None and done[0] >= 1

        wait_for(some_done, 240, "some partitions of public.w to be done")
        p.stop(signal.SIGKILL)
        p.start().wait_streaming(60)
        wait_imported(db, {"public.w"}, p)
        time.sleep(1.0)
    finally:
        writer.stopped.set()
    converged(db, conn, p, path, writer)
    # a key is imported once per snapshot: a partition staged twice is not loaded twice
    repeated = duck_query(
        path,
        "SELECT id, _pg2sink_lsn FROM public_w_raw WHERE _pg2sink_operation = 'IMPORT' "
        "GROUP BY ALL HAVING count(*) > 1",
    )
    assert repeated == []


class ZooWriter(RandomWriter):
    """Random transactions on table z until stopped: inserts, updates that leave the
    TOASTed column alone, key changes, deletes."""

    def __init__(self, db: Database, seed: int) -> None:
        super().__init__(db, seed, most=4, pause=0.005)

    def _statement(self) -> None:
        rng, c = self.rng, self.conn
        key = rng.randint(1, 20_000)
        choice = rng.random()
        if choice < 0.3:
            c.execute(
                "INSERT INTO z (id, n, tags) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
                (rng.randint(20_001, 40_000), Decimal(rng.randint(0, 10**6)) / 100, ["new"]),
            )
        elif choice < 0.7:
            c.execute(
                "UPDATE z SET n = n + 1, tags = array_append(tags, %s::text) WHERE id = %s",
                (str(rng.randint(0, 9)), key),
            )
        elif choice < 0.8:
            new = rng.randint(40_001, 60_000)
            c.execute(
                "UPDATE z SET id = %s WHERE id = %s AND NOT EXISTS (SELECT 1 FROM z WHERE id = %s)",
                (new, key, new),
            )
        else:
            c.execute("DELETE FROM z WHERE id = %s", (key,))


@pytest.mark.slow
def test_a_random_workload_with_an_import_and_ddl_converges(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn.execute(
        "CREATE TABLE z (id int PRIMARY KEY, n numeric(10,2), d date, t timestamptz, "
        "tags text[], j jsonb, b bytea, u uuid, big text)"
    )
    conn.execute("ALTER TABLE z ALTER COLUMN big SET STORAGE EXTERNAL")
    conn.execute(
        "INSERT INTO z SELECT g, g / 100.0, date '2024-01-01' + g, "
        "timestamptz '2024-01-01 00:00+00' + g * interval '1 minute', ARRAY['a' || g, NULL], "
        "jsonb_build_object('g', g, 'l', jsonb_build_array(g, 'x')), int4send(g), "
        "md5(g::text)::uuid, CASE WHEN g % 1000 = 0 THEN repeat(md5(g::text), 500) END "
        "FROM generate_series(1, 20000) g"
    )
    conn.execute("CREATE TABLE y (id int PRIMARY KEY, v text)")
    conn.execute("INSERT INTO y SELECT g, 'y' || g FROM generate_series(1, 100) g")
    writer = ZooWriter(db, seed=3)
    writer.start()
    try:
        path = tmp_path / "zoo.duckdb"
        p = start(pg2sink_proc, path, env={"PG2SINK_NO_IMPORTS": "0"})
        conn.execute("ALTER TABLE z ADD COLUMN extra int")
        conn.execute("UPDATE z SET extra = id WHERE id % 700 = 0")  # big: TOAST unchanged
        wait_imported(db, {"public.z", "public.y"}, p)
        conn.execute("TRUNCATE y")
        conn.execute("INSERT INTO y VALUES (1, 'after'), (2, 'truncate')")
        conn.execute("ALTER TABLE z DROP COLUMN d")
        conn.execute("UPDATE z SET extra = -id WHERE id % 1000 = 0")
        time.sleep(1.0)
    finally:
        writer.stopped.set()
        writer.join(30)
    assert writer.error is None and writer.transactions > 20
    caught_up(db)
    assert p.stop() == 0
    assert duck_rows(path, "public_y", "id") == pg_rows(conn, "y", "id")
    got = duck_rows(path, "public_z", "id")
    expected = pg_rows(conn, "z", "id")
    j = 4  # jsonb: a dict from psycopg, JSON text from DuckDB
    parsed = [(*r[:j], None if r[j] is None else json.loads(r[j]), *r[j + 1 :]) for r in got]
    assert parsed == expected
    assert len(expected) > 19_000
