"""Issue 13's convergence test, on both warehouse sinks (DuckDB and BigQuery): a random
workload on the type zoo of tests/test_type_fidelity.py, with an import of the same table
running meanwhile, leaves a latest-state view equal to the PostgreSQL table value for
value (docs/sinks/duckdb.md, docs/sinks/bigquery.md).

The table is the fidelity table (every type and its array) plus a TOASTed text column
`big`. It joins empty (no Spark for a join import), gets the zoo's rows and copies of
them; then one writer thread runs random transactions from a printed seed (SEED: the
same sequence every run): inserts of zoo rows under new keys, updates of a few columns to
another zoo row's values (`big` left unchanged: its TOASTed value is not sent), updates
to NULL, key changes, deletes, and at fixed transaction numbers a TRUNCATE, ADD COLUMN
with and without a DEFAULT and DROP COLUMN. After IMPORT_AT transactions
`pg2sink import --table public.fidelity` imports the table while the writer goes on; the
writer stops once the import is done and it wrote AT_LEAST transactions (so it ran
through the whole import, and the fixed points were all reached). An import that read a
column the writer dropped meanwhile fails and is retried.

The comparison is tests/sinks/duckdb/test_duckdb_zoo.py's: each view value is rendered as
PostgreSQL input, cast to the column's type and compared with the table's `::text`;
where the view reads NULL for a value the warehouse's type cannot hold, the
`_pg2sink_text` of the raw row the view took is compared instead. BigQuery has no NULL
array and no NULL element in an array (docs/sinks/bigquery.md "Types"): an array with
NULL elements reads [] and its text is in `_pg2sink_text` (compared as that text); a
NULL array reads [] too, and is compared as NULL.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import orjson
import psycopg
import pytest
from psycopg import sql

from tests.conftest import Database, Pg2Sink, run_cli, wait_for
from tests.imports.support import IMPORTS_ON, jobs_state
from tests.sinks.duckdb.test_duckdb import BIG, caught_up
from tests.sinks.duckdb.test_duckdb_types import _value
from tests.sinks.warehouse_support import PROJECT, UNSPACED
from tests.support import FAST, Proc
from tests.test_type_fidelity import (
    SETUP,
    Column,
    column_info,
    create_fidelity_table,
    insert_fidelity_rows,
    pg_input,
    row_count,
)

#: the workload's seed (printed: a failure is replayed by setting it)
SEED = 1313
#: the writer's pause between transactions: it writes until the import is done
PAUSE = 0.04
#: the import is requested after this many of the writer's transactions
IMPORT_AT = 40
KEYS = 40

#: columns added on the way: name, type, DEFAULT (None: no default), a value for updates
ADDED: list[tuple[str, str, str | None, Callable[[random.Random], Any]]] = [
    ("x_int", "int4", "7", lambda r: r.randint(-5, 5)),
    ("x_text", "text", "'dflt'", lambda r: f"t{r.randint(0, 99)}"),
    ("x_date", "date", "'2024-02-29'", lambda r: date(2020, 1, r.randint(1, 28))),
    ("x_num", "numeric(10,2)", None, lambda r: Decimal(r.randint(-9999, 9999)) / 100),
    ("x_arr", "int4[]", None, lambda r: [r.randint(0, 9), None][: r.randint(0, 2)]),
]
#: zoo columns dropped on the way
DROPPED = ["c_money", "a_interval"]
#: the writer's fixed points: operation number -> what it does
TRUNCATE_AT, ADD_AT, ADD_PLAIN_AT, DROP_AT = 60, 100, 130, 160
#: the writer stops once the import is done and it has written this many transactions
AT_LEAST = 200


class ZooWriter(threading.Thread):
    """The workload of the module docstring on one connection, in its own thread."""

    def __init__(self, db: Database, seed: int) -> None:
        super().__init__(daemon=True)
        self.conn = db.connect()
        self.rng = random.Random(seed)
        # the zoo's rows, the source of inserted and updated values (a temp table is
        # in no publication)
        self.conn.execute(
            "CREATE TEMP TABLE zoo AS SELECT * FROM fidelity WHERE id < %s", (row_count(),)
        )
        self.columns = [
            name
            for (name,) in self.conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'zoo'::regclass "
                "AND attnum > 0 AND NOT attisdropped AND attname NOT IN ('id', 'big')"
            )
        ]
        self.added: list[tuple[str, Callable[[random.Random], Any]]] = []
        self.done = 0
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                with self.conn.transaction():
                    for _ in range(self.rng.randint(1, 3)):
                        self._statement()
                    self._fixed_point(self.done)
                self.done += 1
                time.sleep(PAUSE)
        except BaseException as e:  # reported by the test
            self.error = e

    def _fixed_point(self, n: int) -> None:
        c = self.conn
        if n == TRUNCATE_AT:
            c.execute("TRUNCATE fidelity")
            for key in range(0, KEYS, 3):
                self._insert(key)
        elif n in (ADD_AT, ADD_PLAIN_AT):
            for name, typ, default, make in ADDED:
                if (default is None) == (n == ADD_PLAIN_AT):
                    clause = sql.SQL("") if default is None else sql.SQL(f" DEFAULT {default}")
                    c.execute(
                        sql.SQL("ALTER TABLE fidelity ADD COLUMN {} {}{}").format(
                            sql.Identifier(name), sql.SQL(typ), clause
                        )
                    )
                    self.added.append((name, make))
        elif n == DROP_AT:
            for name in DROPPED:
                c.execute(
                    sql.SQL("ALTER TABLE fidelity DROP COLUMN {}").format(sql.Identifier(name))
                )
                self.columns.remove(name)

    def _insert(self, key: int) -> None:
        names = sql.SQL(", ").join(sql.Identifier(n) for n in self.columns)
        self.conn.execute(
            sql.SQL(
                "INSERT INTO fidelity (id, big, {n}) SELECT %s, %s, {n} FROM zoo WHERE id = %s "
                "ON CONFLICT (id) DO NOTHING"
            ).format(n=names),
            (key, BIG + str(key) if self.rng.random() < 0.3 else None, self.rng.randrange(7)),
        )

    def _statement(self) -> None:
        rng, c = self.rng, self.conn
        key = rng.randrange(KEYS)
        choice = rng.random()
        if choice < 0.3:
            self._insert(key)
        elif choice < 0.65:  # a few columns to another zoo row's values; big unchanged
            some = rng.sample(self.columns, rng.randint(1, 6))
            names = sql.SQL(", ").join(sql.Identifier(n) for n in some)
            c.execute(
                sql.SQL(
                    "UPDATE fidelity SET ({n}) = (SELECT {n} FROM zoo WHERE id = %s) WHERE id = %s"
                ).format(n=names),
                (rng.randrange(7), key),
            )
        elif choice < 0.75:  # NULLs, and the added columns' values
            sets = [
                sql.SQL("{} = NULL").format(sql.Identifier(n)) for n in rng.sample(self.columns, 2)
            ]
            params = []
            for name, make in self.added:
                sets.append(sql.SQL("{} = %s").format(sql.Identifier(name)))
                params.append(make(rng))
            c.execute(
                sql.SQL("UPDATE fidelity SET {} WHERE id = %s").format(sql.SQL(", ").join(sets)),
                (*params, key),
            )
        elif choice < 0.87:
            new = rng.randrange(KEYS, 2 * KEYS)
            c.execute(
                "UPDATE fidelity SET id = %s WHERE id = %s "
                "AND NOT EXISTS (SELECT 1 FROM fidelity WHERE id = %s)",
                (new, key, new),
            )
        else:
            c.execute("DELETE FROM fidelity WHERE id = %s OR id = %s", (key, key + KEYS))


# --- reading the views -------------------------------------------------------------------

#: a view's rows by id, {column: value}, and per id the `_pg2sink_text` of the raw row
#: the view took
View = tuple[dict[int, dict[str, Any]], dict[int, dict[str, str]]]

LATEST_TEXT = (
    "SELECT id, {text} FROM {raw} WHERE _pg2sink_operation IN ('INSERT', 'UPDATE', 'IMPORT') "
    "QUALIFY row_number() OVER (PARTITION BY id ORDER BY _pg2sink_position DESC) = 1"
)


def duckdb_view(path: Path) -> View:
    with duckdb.connect(str(path), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        cursor = con.execute("SELECT * FROM public_fidelity")
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        query = LATEST_TEXT.format(text="_pg2sink_text", raw="public_fidelity_raw")
        texts = {k: v or {} for k, v in con.execute(query).fetchall()}
    return {row["id"]: row for row in rows}, texts


def bigquery_view(endpoint: str, dataset: str) -> View:
    from pg2sink.sinks.bigquery.config import BigQueryConfig
    from pg2sink.sinks.bigquery.warehouse import client

    config = BigQueryConfig(
        bigquery_project=PROJECT, bigquery_dataset=dataset, bigquery_endpoint=endpoint
    )
    bq = client(config)
    ds = f"{PROJECT}.{dataset}"
    try:
        rows = [dict(row.items()) for row in bq.query(f"SELECT * FROM `{ds}.public_fidelity`")]
        query = LATEST_TEXT.format(
            text="TO_JSON_STRING(_pg2sink_text)", raw=f"`{ds}.public_fidelity_raw`"
        )
        texts = {k: orjson.loads(v or "null") or {} for k, v in bq.query(query)}
    finally:
        bq.close()  # type: ignore[no-untyped-call]
    return {row["id"]: row for row in rows}, texts


def mismatches(
    conn: psycopg.Connection[Any], column: Column, view: View, bigquery: bool
) -> list[str]:
    """Rows whose view value, rendered as PostgreSQL input and cast to the column's type,
    is not the table's `::text` (the module docstring)."""
    rows, texts = view
    is_array = column.pg_type.endswith("[]")
    rendered: dict[int, str | None] = {}
    empty_arrays = set()
    for row_id, row in rows.items():
        value = row.get(column.name)
        text = texts.get(row_id, {}).get(column.name)
        if bigquery and is_array and value == [] and text is None:
            empty_arrays.add(row_id)  # [] or NULL in PostgreSQL
        kept = text if value in (None, []) else None
        got = _value(value, kept, is_array)
        # an array kept as JSON text (BigQuery: NULL elements) has bytea in base64
        b64 = column.is_bytea and kept is not None and kept.startswith("[")
        rendered[row_id] = pg_input(got, base64_bytea=b64, delim=column.delim, array=is_array)
    query = sql.SQL(
        "SELECT id, {col}::text, CAST(%s::text AS {typ})::text FROM fidelity WHERE id = %s"
    ).format(col=sql.Identifier(column.name), typ=sql.SQL(column.pg_type))
    out = []
    for row_id, text in sorted(rendered.items()):
        try:
            found = conn.execute(query, (text, row_id)).fetchone()
        except psycopg.Error as e:
            out.append(f"{column.name} row {row_id}: {text!r}: {e}")
            continue
        assert found is not None
        _, expected, back = found
        if row_id in empty_arrays and expected is None:
            continue
        if expected != back:
            got = rows[row_id].get(column.name)
            out.append(f"{column.name} row {row_id}: db {expected!r}, view {got!r}")
    return out


# --- the test ---------------------------------------------------------------------------


def create(conn: psycopg.Connection[Any]) -> None:
    """The fidelity table (every zoo type and its array) with a TOASTed column `big`."""
    for statement in SETUP:
        conn.execute(statement)
    create_fidelity_table(conn)
    conn.execute("ALTER TABLE fidelity ADD COLUMN big text")
    conn.execute("ALTER TABLE fidelity ALTER COLUMN big SET STORAGE EXTERNAL")


def fill(conn: psycopg.Connection[Any]) -> None:
    """The zoo's rows (ids 0-6), copies of them up to KEYS, some with a TOASTed `big`."""
    with conn.transaction():
        insert_fidelity_rows(conn)
    names = [
        name
        for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'fidelity'::regclass "
            "AND attnum > 0 AND NOT attisdropped AND attname <> 'id'"
        )
    ]
    columns = sql.SQL(", ").join(sql.Identifier(n) for n in names)
    conn.execute(
        sql.SQL(
            "INSERT INTO fidelity (id, {c}) SELECT g, {c} FROM fidelity "
            "JOIN generate_series(%s::int, %s::int) g ON fidelity.id = g %% %s::int"
        ).format(c=columns),
        (row_count(), KEYS - 1, row_count()),
    )
    conn.execute("UPDATE fidelity SET big = %s || id WHERE id %% 3 = 0", (BIG,))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["duckdb", "bigquery"])
def test_a_random_zoo_workload_with_an_import_converges(
    backend: str,
    db: Database,
    pg2sink_proc: Proc,
    tmp_path: Path,
    topic_prefix: str,
    request: pytest.FixtureRequest,
) -> None:
    print(f"workload seed {SEED}")
    conn = db.connect()
    create(conn)
    path = tmp_path / "zoo.duckdb"
    dataset = f"d_{topic_prefix}"
    if backend == "duckdb":
        sink = ["--sink", "duckdb", "--duckdb-path", str(path)]
    else:
        endpoint = request.getfixturevalue("bigquery_endpoint")
        sink = [
            "--sink", "bigquery", "--bigquery-project", PROJECT, "--bigquery-dataset", dataset,
            "--bigquery-endpoint", endpoint, *UNSPACED,
        ]  # fmt: skip
    p: Pg2Sink = pg2sink_proc(*sink, *FAST, "--import-backoff-base", "0.5s", env=IMPORTS_ON).start()
    p.wait_streaming(60)
    fill(conn)  # streamed: the table joined empty, so its join import did not start Spark
    writer = ZooWriter(db, SEED)
    writer.start()
    try:
        wait_for(lambda: writer.done >= IMPORT_AT or not writer.is_alive(), 60, "the writer")
        again = run_cli(
            "import", "--table", "public.fidelity",
            env={"PG2SINK_SOURCE": db.dsn, "PG2SINK_PUBLICATION": db.publication},
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        # an import that reads a column the writer drops meanwhile fails and is retried
        # (--import-backoff-base): wait for the job's end, not its first attempt's
        wait_for(lambda: jobs_state(db).get("public.fidelity") == "done", 120, "the import")
        wait_for(lambda: writer.done >= AT_LEAST or not writer.is_alive(), 60, "the writer")
    finally:
        writer.stopped.set()
        writer.join(30)
    print(f"{writer.done} transactions written")
    assert writer.error is None, writer.error
    caught_up(db, timeout=120)
    assert p.stop() == 0
    view = duckdb_view(path) if backend == "duckdb" else bigquery_view(endpoint, dataset)
    table_ids = [i for (i,) in conn.execute("SELECT id FROM fidelity ORDER BY id")]
    assert sorted(view[0]) == table_ids
    assert len(table_ids) >= 10  # the comparison below has rows to compare
    columns = column_info(conn)
    assert {name for name, *_ in ADDED} <= set(columns) and not set(DROPPED) & set(columns)
    found = []
    for column in columns.values():
        found += mismatches(conn, column, view, backend == "bigquery")
    assert found == [], "\n".join(found)
