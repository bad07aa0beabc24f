"""Helpers of the convergence-under-load tests (tests/sinks/test_convergence_under_load.py):
a busy loop on one core, the random workload with large TOAST values, key changes and
deletes, and each sink's latest state read back in one form to compare with the table.

The table `t` (id int PRIMARY KEY, n numeric(12,2), tags int[], doc jsonb, note text,
big text STORAGE EXTERNAL) starts with ROWS rows, one in BIG_EVERY of them with a `big`
of BIG_CHARS incompressible characters (base64 of random bytes: neither pglz nor the
sinks' compression shrinks it). The writer's transactions (seeded) insert, upsert,
update the small columns (`big` left unchanged: pgoutput sends "unchanged TOAST"), give
`big` a new large value, change keys and delete.
"""

from __future__ import annotations

import base64
import contextlib
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.conftest import Database
from tests.sinks.warehouse_support import duck_query
from tests.support import RandomWriter

#: rows of `t` at the start, and how many keys the writer works on (twice as many are
#: used by key changes)
ROWS = 2000
#: one row in BIG_EVERY holds a large `big` at the start
BIG_EVERY = 25
#: a large `big` value's length, in characters (and bytes: base64 is ASCII)
BIG_CHARS = 200_000

CREATE = (
    "CREATE TABLE t (id int PRIMARY KEY, n numeric(12,2), tags int[], doc jsonb, note text, "
    "big text)",
    "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL",
)
#: the columns in the order every reader returns them
COLUMNS = ("id", "n", "tags", "doc", "note", "big")
#: COLUMNS as a SELECT list of DuckDB and BigQuery (jsonb: its text, parsed by _doc)
SELECT_LIST = ", ".join(COLUMNS)

#: a row as compared: (id, n, tags, doc parsed, note, big)
Row = tuple[Any, ...]


def big_text(rng: random.Random) -> str:
    """BIG_CHARS incompressible characters."""
    return base64.b64encode(rng.randbytes(BIG_CHARS * 3 // 4)).decode()


@contextlib.contextmanager
def cpu_load() -> Iterator[subprocess.Popen[bytes]]:
    """A busy loop in a process of its own for as long as the block runs (one core of
    the machine busy), always stopped and reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def create_table(db: Database, seed: int) -> None:
    """`t` with ROWS rows, every BIG_EVERY-th with a large `big`."""
    rng = random.Random(seed)
    with db.connect() as conn:
        for statement in CREATE:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO t SELECT g, g / 4.0, ARRAY[g, g %% 7], jsonb_build_object('g', g, "
            "'s', 'x' || g), 'note ' || g, NULL FROM generate_series(1, %s) g",
            (ROWS,),
        )
        with conn.cursor() as cur:
            cur.executemany(
                "UPDATE t SET big = %s WHERE id = %s",
                [(big_text(rng), i) for i in range(BIG_EVERY, ROWS + 1, BIG_EVERY)],
            )


class LoadWriter(RandomWriter):
    """The module docstring's random transactions on `t` until stopped."""

    def __init__(self, db: Database, seed: int) -> None:
        super().__init__(db, seed, most=3, pause=0.08)
        self.bigs = 0

    def stop(self) -> None:
        """Stop after the transaction in progress; its error, if any, fails the test."""
        self.stopped.set()
        self.join(60)
        self.conn.close()
        assert self.error is None, self.error

    def _big(self) -> str | None:
        if self.rng.random() < 0.1:
            self.bigs += 1
            return big_text(self.rng)
        return None

    def _statement(self) -> None:
        rng, c = self.rng, self.conn
        key = rng.randint(1, ROWS)
        choice = rng.random()
        if choice < 0.25:  # an upsert: a new row, or the small columns of one (big kept)
            c.execute(
                "INSERT INTO t VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
                "SET n = excluded.n, note = excluded.note",
                (
                    rng.randint(1, 2 * ROWS),
                    Decimal(rng.randint(-(10**6), 10**6)) / 100,
                    [rng.randint(0, 9) for _ in range(rng.randint(0, 3))],
                    json.dumps({"w": rng.randint(0, 99), "l": [1, "two"]}),
                    f"ins {rng.random()}",
                    self._big(),
                ),
            )
        elif choice < 0.55:  # small columns only: big is unchanged TOAST
            c.execute(
                "UPDATE t SET n = n + 1, tags = array_append(tags, %s), doc = doc || %s, "
                "note = %s WHERE id = %s",
                (rng.randint(0, 9), json.dumps({"u": rng.randint(0, 99)}), f"u{key}", key),
            )
        elif choice < 0.58:  # a new large value
            self.bigs += 1
            c.execute("UPDATE t SET big = %s WHERE id = %s", (big_text(rng), key))
        elif choice < 0.68:  # NULLs
            c.execute("UPDATE t SET tags = NULL, note = NULL WHERE id = %s", (key,))
        elif choice < 0.82:  # a key change (a large big goes along, unchanged)
            new = rng.randint(ROWS + 1, 2 * ROWS)
            c.execute(
                "UPDATE t SET id = %s WHERE id = %s AND NOT EXISTS (SELECT 1 FROM t WHERE id = %s)",
                (new, key, new),
            )
        else:
            c.execute("DELETE FROM t WHERE id = %s OR id = %s", (key, key + ROWS))


# --- rows to compare -----------------------------------------------------------------------


def _doc(value: Any) -> Any:
    """jsonb as a Python value, from text (file, Kafka, DuckDB) or parsed (psycopg)."""
    return json.loads(value) if isinstance(value, str) else value


def table_rows(conn: psycopg.Connection[Any], empty_arrays: bool = False) -> list[Row]:
    """`t` in id order; with `empty_arrays`, a NULL array as [] (BigQuery has no NULL
    array, docs/sinks/bigquery.md "Types")."""
    rows = conn.execute(
        sql.SQL("SELECT {} FROM t ORDER BY id").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in COLUMNS)
        )
    ).fetchall()
    out = []
    for id_, n, tags, doc, note, big in rows:
        out.append((id_, n, [] if empty_arrays and tags is None else tags, doc, note, big))
    return out


def duckdb_rows(path: Path) -> list[Row]:
    """The DuckDB sink's latest-state view of `t`, in id order."""
    return parse_doc(duck_query(path, f"SELECT {SELECT_LIST} FROM public_t ORDER BY id"))


def replay(records: list[dict[str, Any]]) -> list[Row]:
    """`t`'s state from its changelog records (file sink lines, Kafka JSON values) in
    order: INSERT/UPDATE/IMPORT put the `after` row, an UPDATE whose `before` holds
    another key removes that one, DELETE removes the key, TRUNCATE empties; an
    unchanged TOASTed value ({"unchanged_toast": true}) keeps the row's value (the
    old key's, for a key change). A change streamed before the table's import may find
    no row yet: its marker stays until the IMPORT row replaces the row (and shows in
    the comparison if none does)."""
    state: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.get("kind", "modification") != "modification" or r.get("name") != "t":
            continue
        op = r["operation"]
        if op == "TRUNCATE":
            state.clear()
        elif op == "DELETE":
            state.pop(r["before"]["id"], None)
        else:
            after = dict(r["after"])
            old_key = r["before"]["id"] if r["before"] is not None else after["id"]
            old = state.pop(old_key, None)
            for name, value in after.items():
                if value == {"unchanged_toast": True} and old is not None:
                    after[name] = old[name]
            state[after["id"]] = after
    return [
        tuple(_doc(row[c]) if c == "doc" else row[c] for c in COLUMNS)
        for _, row in sorted(state.items())
    ]


def parse_doc(rows: list[Row]) -> list[Row]:
    """Rows whose doc is JSON text, with it parsed."""
    return [(*r[:3], _doc(r[3]), *r[4:]) for r in rows]
