"""Imports bounded by bytes, not rows (docs/imports.md, "Memory"): a table of 20,000 rows,
5% of them carrying 2 MB of incompressible text stored EXTERNAL (TOAST does not shrink
it), imported by pg2sink with a 512 MB driver heap while a writer updates it (small
columns, leaving the TOASTed value unchanged; new 200 KB values; deletes; inserts; key
changes). The sink's latest state equals the table: the file sink's changelog replayed
and the DuckDB sink's view. Spark's default fetch of 20,000 rows would hold 2 GB of such
rows in one task."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
from psycopg.rows import TupleRow

from tests.conftest import Database, Pg2Sink, wait_for
from tests.imports import test_consistency as consistency
from tests.imports.support import IMPORTS_ON, jobs_state, wait_confirmed

pytestmark = pytest.mark.slow

ROWS = 20_000
#: every BIG_EVERY-th row carries BIG_BYTES of text
BIG_EVERY = 20
BIG_BYTES = 2 << 20
HEAP = "512m"

State = dict[int, tuple[str, str]]


def random_text(n: int, rng: random.Random) -> str:
    """`n` characters of base64 of random bytes: nothing for pglz to compress."""
    return base64.b64encode(rng.randbytes(n * 3 // 4 + 3)).decode()[:n]


def digest(text: str | None) -> str:
    return "null" if text is None else hashlib.md5(text.encode()).hexdigest()


def create(conn: psycopg.Connection[TupleRow]) -> None:
    conn.execute("CREATE TABLE public.wide (id int PRIMARY KEY, small text, big text)")
    conn.execute("ALTER TABLE public.wide ALTER COLUMN big SET STORAGE EXTERNAL")
    rng = random.Random(2)
    with conn.cursor() as cur, cur.copy("COPY public.wide FROM STDIN") as copy:
        for i in range(1, ROWS + 1):
            big = random_text(BIG_BYTES, rng) if i % BIG_EVERY == 0 else f"b{i}"
            copy.write_row((i, f"s{i}", big))
    conn.execute("ANALYZE public.wide")


class Writer(consistency.Writer):
    """Small random transactions on public.wide until stopped."""

    def _change(self, c: psycopg.Connection[TupleRow]) -> None:
        rng = self.rng
        op = rng.random()
        k = rng.randint(1, ROWS)
        if op < 0.65:  # `big` unchanged: its TOASTed value is not sent
            c.execute("UPDATE public.wide SET small = %s WHERE id = %s", (f"u{rng.random()}", k))
        elif op < 0.68:
            c.execute(
                "UPDATE public.wide SET big = %s WHERE id = %s", (random_text(200_000, rng), k)
            )
        elif op < 0.75:
            c.execute("DELETE FROM public.wide WHERE id = %s", (k,))
        elif op < 0.85:
            c.execute(
                "INSERT INTO public.wide VALUES (%s, 'new', %s) ON CONFLICT (id) DO UPDATE "
                "SET small = 'upserted'",
                (ROWS + rng.randint(1, 5_000), random_text(200_000 if op < 0.78 else 20, rng)),
            )
        else:  # a key change
            new = ROWS + 10_000 + rng.randint(1, 100_000)
            c.execute(
                "UPDATE public.wide SET id = %s WHERE id = %s"
                " AND NOT EXISTS (SELECT FROM public.wide WHERE id = %s)",
                (new, k, new),
            )


def table_state(conn: psycopg.Connection[TupleRow]) -> State:
    rows = conn.execute("SELECT id, small, md5(big) FROM public.wide").fetchall()
    return {int(r[0]): (r[1], r[2] or "null") for r in rows}


def file_state(path: Path) -> State:
    """The changelog replayed a line at a time (each `big` kept as its md5): INSERT,
        UPDATE and IMPORT upsert, an UPDATE whose before holds another key removes it, DELETE
        removes, an unchanged TOASTed value keeps the key's previous one (unknown before the
    key's IMPORT row, which comes later and replaces it)."""
    state: State = {}
    with open(path, "rb") as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r.get("kind") != "modification" or r.get("name") != "wide":
                continue
            if r["operation"] == "DELETE":
                state.pop(r["before"]["id"], None)
                continue
            after = r["after"]
            old = state.get(after["id"])
            if r["before"] is not None:
                old = state.pop(r["before"]["id"], old)
            big = after["big"]
            if isinstance(big, dict) and big.get("unchanged_toast"):
                # no base yet: a change the import's snapshot sees, ahead of its IMPORT row
                value = old[1] if old is not None else "unknown"
            else:
                value = digest(big)
            state[after["id"]] = (after["small"], value)
    return state


def duckdb_state(path: Path) -> State:
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.execute("SELECT id, small, md5(big) FROM public_wide").fetchall()
    return {int(r[0]): (r[1], r[2] or "null") for r in rows}


def wait_for_job(db: Database, proc: Pg2Sink, table: str, state: str, timeout: float) -> None:
    """Until the table's job is in `state` (pg2sink must keep running meanwhile)."""

    def reached() -> bool:
        assert proc.proc is not None and proc.proc.poll() is None, proc.stderr()
        try:
            return jobs_state(db).get(table) == state
        except psycopg.errors.UndefinedTable:
            return False

    wait_for(reached, timeout, f"the import of {table} to be {state}")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("sink", ["file", "duckdb"])
def test_wide_rows_import_with_a_512m_driver_heap_while_streaming(
    sink: str, db: Database, pg2sink_proc: Any, tmp_path: Path
) -> None:
    conn = db.connect()
    create(conn)
    out = tmp_path / ("changes.jsonl" if sink == "file" else "wide.duckdb")
    args = ["--file-path", str(out)] if sink == "file" else ["--sink", "duckdb"]
    if sink == "duckdb":
        args += ["--duckdb-path", str(out)]
    seed = int.from_bytes(os.urandom(2))
    print(f"writer seed {seed}")
    writer = Writer(db.dsn, seed, pause=0.05)
    writer.start()
    try:
        proc: Pg2Sink = pg2sink_proc(
            *args,
            "--publication-poll-interval",
            "500ms",
            "--spark-driver-memory",
            HEAP,
            env=IMPORTS_ON,
        )
        proc.start()
        proc.wait_streaming(60)

        wait_for_job(db, proc, "public.wide", "done", 600)
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.error is None, writer.error
    assert writer.transactions > 20
    wait_confirmed(db, proc, timeout=300)
    assert proc.stop() == 0
    err = proc.stderr()
    assert "OutOfMemoryError" not in err and "starting a new Spark session" not in err, err
    want = table_state(conn)
    got = file_state(out) if sink == "file" else duckdb_state(out)
    assert got.keys() == want.keys()
    assert got == want


def test_an_out_of_memory_error_names_the_option_to_raise(
    db: Database, pg2sink_proc: Any, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.huge (id int PRIMARY KEY, v text)")
    conn.execute("ALTER TABLE public.huge ALTER COLUMN v SET STORAGE EXTERNAL")
    # one value of 300 MB: more than a 512 MB heap holds in the copies a read makes
    conn.execute("INSERT INTO public.huge VALUES (1, repeat('x', 300000000))")
    proc: Pg2Sink = pg2sink_proc(
        "--file-path",
        str(tmp_path / "changes.jsonl"),
        "--spark-driver-memory",
        HEAP,
        "--spark-session-failures",
        "1",
        "--import-backoff-base",
        "10m",
        env=IMPORTS_ON,
    )
    proc.start()
    proc.wait_streaming(60)

    wait_for_job(db, proc, "public.huge", "failed", 240)
    assert proc.stop() == 0
    err = proc.stderr()
    said = [line for line in err.splitlines() if "import of public.huge failed" in line]
    assert len(said) == 1, err
    assert "ran out of memory (heap 512m): raise --spark-driver-memory" in said[0], err
    assert "Traceback" not in err, err
