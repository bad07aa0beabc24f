"""Imports consistent with the live stream (docs/imports.md): real PostgreSQL, real Spark
(local mode), pg2sink run as users run it, the file sink."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import TupleRow

from tests.conftest import Database, Pg2Sink, wait_for
from tests.imports.support import (
    read_changelog,
    replay,
    replay_rows,
    select_rows,
    start_with_imports,
    wait_confirmed,
    wait_imported,
)

pytestmark = pytest.mark.slow

SCHEMA_SQL = """
CREATE TABLE public.single (id int PRIMARY KEY, name text, amount numeric(12,2), flag bool,
                            tags int[]);
CREATE TABLE public.composite (region text, n int, note text, PRIMARY KEY (region, n));
CREATE TABLE public.nokey (x int, y text);
ALTER TABLE public.nokey REPLICA IDENTITY FULL;
"""


def _fill(conn: psycopg.Connection[TupleRow], single: int, composite: int, nokey: int) -> None:
    conn.execute(SCHEMA_SQL)
    conn.execute(
        "INSERT INTO public.single SELECT g, 'name ' || g, (g * 1.25)::numeric(12,2), g %% 2 = 0,"
        " ARRAY[g, g + 1] FROM generate_series(1, %s) g",
        (single,),
    )
    conn.execute(
        "INSERT INTO public.composite SELECT r, g, 'note ' || g"
        " FROM generate_series(1, %s) g, unnest(ARRAY['eu', 'us']) r",
        (composite // 2,),
    )
    conn.execute(
        "INSERT INTO public.nokey SELECT g %% 100, 'y' || g FROM generate_series(1, %s) g",
        (nokey,),
    )


def _norm(row: dict[str, object]) -> dict[str, object]:
    """Database values in the JSON form of the file sink."""
    return {k: (Decimal(v) if isinstance(v, Decimal) else v) for k, v in row.items()}


def _check_converged(records: list[dict[str, object]], conn: psycopg.Connection[TupleRow]) -> None:
    single_cols = ("id", "name", "amount", "flag", "tags")
    got = replay(records, "public.single", ("id",))
    want = {(r["id"],): _norm(r) for r in select_rows(conn, "public.single", single_cols)}
    assert got.keys() == want.keys()
    assert got == want
    got_c = replay(records, "public.composite", ("region", "n"))
    want_c = {
        (r["region"], r["n"]): r
        for r in select_rows(conn, "public.composite", ("region", "n", "note"))
    }
    assert got_c == want_c
    got_n = replay_rows(records, "public.nokey")
    want_n = Counter(
        json.dumps(r, sort_keys=True) for r in select_rows(conn, "public.nokey", ("x", "y"))
    )
    assert got_n == want_n


def test_200k_rows_imported_with_the_databases_values(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    _fill(conn, 200_000, 2_000, 3_000)
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(pg2sink_proc, out)
    wait_imported(db, {"public.single", "public.composite", "public.nokey"}, proc)
    assert proc.stop() == 0
    records = read_changelog(out)
    imports = [r for r in records if r.get("operation") == "IMPORT"]
    assert len(imports) == 205_000
    for r in imports:
        assert r["before"] is None and r["xid"] == 0
    # every row once, with the database's values
    single = [r["after"] for r in imports if r["name"] == "single"]
    assert len({r["id"] for r in single}) == 200_000
    _check_converged(records, conn)
    # each table's Schema record precedes its first IMPORT row
    first: dict[str, int] = {}
    for i, r in enumerate(records):
        first.setdefault(f"{r['kind']}:{r['name']}", i)
    for name in ("single", "composite", "nokey"):
        assert first[f"schema:{name}"] < first[f"modification:{name}"]


class Writer(threading.Thread):
    """Random INSERT/UPDATE/DELETE on the three tables, small transactions."""

    def __init__(self, dsn: str, seed: int, pause: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.rng = random.Random(seed)
        #: seconds between two transactions
        self.pause = pause
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as c:
                while not self.stop.is_set():
                    with c.transaction():
                        for _ in range(self.rng.randint(1, 5)):
                            self._change(c)
                    self.transactions += 1
                    if self.pause:
                        self.stop.wait(self.pause)
        except BaseException as e:  # reported by the test
            self.error = e

    def _change(self, c: psycopg.Connection[TupleRow]) -> None:
        rng = self.rng
        op = rng.random()
        k = rng.randint(1, 60_000)
        if op < 0.35:
            c.execute(
                "INSERT INTO public.single VALUES (%s, 'new', 1.50, true, ARRAY[1])"
                " ON CONFLICT (id) DO UPDATE SET name = 'upserted'",
                (k,),
            )
        elif op < 0.6:
            c.execute(
                "UPDATE public.single SET name = %s, amount = amount + 1 WHERE id = %s",
                (f"u{rng.randint(0, 999)}", k),
            )
        elif op < 0.7:
            c.execute("DELETE FROM public.single WHERE id = %s", (k,))
        elif op < 0.8:
            c.execute(
                "INSERT INTO public.composite VALUES (%s, %s, 'w') ON CONFLICT DO NOTHING",
                (rng.choice(["eu", "us", "asia"]), k % 5000),
            )
        elif op < 0.88:
            c.execute(
                "UPDATE public.composite SET note = %s WHERE region = 'eu' AND n = %s",
                (f"w{k}", k % 5000),
            )
        elif op < 0.92:
            c.execute("DELETE FROM public.composite WHERE region = 'us' AND n = %s", (k % 5000,))
        elif op < 0.96:
            c.execute("INSERT INTO public.nokey VALUES (%s, 'w')", (k % 100,))
        elif op < 0.98:
            c.execute(
                "UPDATE public.nokey SET y = 'v' || y WHERE ctid = "
                "(SELECT ctid FROM public.nokey WHERE x = %s LIMIT 1)",
                (k % 100,),
            )
        else:
            c.execute(
                "DELETE FROM public.nokey WHERE ctid = "
                "(SELECT ctid FROM public.nokey WHERE x = %s LIMIT 1)",
                (k % 100,),
            )


def test_concurrent_writes_during_the_import_converge(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    _fill(conn, 60_000, 6_000, 3_000)
    out = tmp_path / "changes.jsonl"
    writer = Writer(db.dsn, seed=4)
    writer.start()  # before pg2sink: transactions are in flight when the tables join
    try:
        proc = start_with_imports(pg2sink_proc, out)
        wait_imported(db, {"public.single", "public.composite", "public.nokey"}, proc)
        time.sleep(1.0)  # and a little after the imports
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.error is None, writer.error
    assert writer.transactions > 50
    wait_confirmed(db, proc)
    assert proc.stop() == 0
    records = read_changelog(out)
    streamed = [r for r in records if r.get("operation") in ("INSERT", "UPDATE", "DELETE")]
    assert streamed, "the writer's changes were streamed"
    _check_converged(records, conn)


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    """A busy loop on one core (a process of its own) while the block runs: imports must
    converge on a machine that has other work, not only on a quiet one (issue 32)."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


def test_concurrent_writes_converge_with_a_core_kept_busy(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    with busy_core():
        test_concurrent_writes_during_the_import_converge(db, pg2sink_proc, tmp_path)


def test_a_transaction_in_flight_when_its_table_joins_is_not_lost(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.first (id int PRIMARY KEY)")
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(pg2sink_proc, out)
    conn.execute("CREATE TABLE public.late (id int PRIMARY KEY, v text)")
    tx = psycopg.connect(db.dsn)  # not autocommit: one open transaction
    try:
        # written before the table joins: logical replication will never send it
        tx.execute("INSERT INTO public.late VALUES (1, 'before the join')")
        wait_for(
            lambda: conn.execute(
                "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND tablename = 'late'",
                (db.publication,),
            ).fetchone(),
            30,
            "public.late to join the publication",
        )
        time.sleep(1.5)  # the import engine is waiting for this transaction now
        tx.execute("INSERT INTO public.late VALUES (2, 'after the join')")
        tx.commit()
    finally:
        tx.close()
    wait_imported(db, {"public.late"}, proc)
    wait_confirmed(db, proc)
    assert proc.stop() == 0
    state = replay(read_changelog(out), "public.late", ("id",))
    assert state == {
        (1,): {"id": 1, "v": "before the join"},
        (2,): {"id": 2, "v": "after the join"},
    }


def test_a_table_created_while_streaming_is_imported(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.early (id int PRIMARY KEY)")
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(pg2sink_proc, out)
    # rows committed before the table joins: only the import can carry them
    with conn.transaction():
        conn.execute("CREATE TABLE public.created (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO public.created SELECT g, 'v' || g FROM generate_series(1, 500) g")
    wait_imported(db, {"public.early", "public.created"}, proc)
    conn.execute("UPDATE public.created SET v = 'changed' WHERE id = 7")
    wait_confirmed(db, proc)
    assert proc.stop() == 0
    records = read_changelog(out)
    imported = [r for r in records if r.get("operation") == "IMPORT" and r["name"] == "created"]
    assert len(imported) == 500
    state = replay(records, "public.created", ("id",))
    assert len(state) == 500
    assert state[(7,)] == {"id": 7, "v": "changed"}


def test_kill_9_during_an_import_resumes_from_the_done_partitions(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.big (id int PRIMARY KEY, pad text)")
    conn.execute(
        "INSERT INTO public.big SELECT g, repeat('x', 200) || g FROM generate_series(1, 200000) g"
    )
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(pg2sink_proc, out)

    def partitions() -> list[tuple[int, bool, int | None, str]]:
        return [
            (int(r[0]), bool(r[1]), r[2], r[3])
            for r in conn.execute(
                "SELECT partition, done, attempt, predicate FROM pg2sink.import_partitions"
                " ORDER BY partition"
            ).fetchall()
        ]

    def some_done() -> bool:
        assert proc.proc is not None and proc.proc.poll() is None, proc.stderr()
        try:
            parts = partitions()
        except psycopg.errors.UndefinedTable:
            return False
        done = sum(1 for p in parts if p[1])
        return bool(parts) and 1 <= done < len(parts)

    wait_for(some_done, 240, "some partitions of public.big to be done")
    proc.kill()
    time.sleep(1)  # the server notices the engine's connection is gone
    first = {p[0] for p in partitions() if p[1]}
    assert 0 < len(first) < len(partitions())
    proc.start()
    proc.wait_streaming(60)
    wait_imported(db, {"public.big"}, proc)
    wait_confirmed(db, proc)
    assert proc.stop() == 0

    parts = partitions()
    assert {p[0] for p in parts if p[2] == 1} == first  # not written again
    assert all(p[1] and p[2] == 2 for p in parts if p[0] not in first)
    owner = {}
    for number, _, _, predicate in parts:
        for (key,) in conn.execute(f"SELECT id FROM public.big WHERE {predicate}").fetchall():
            owner[key] = number
    assert len(owner) == 200_000
    seen = Counter(
        r["after"]["id"]
        for r in read_changelog(out)
        if r.get("operation") == "IMPORT" and r["name"] == "big"
    )
    assert set(seen) == set(owner)
    repeated = {owner[k] for k, n in seen.items() if n > 1}
    # only partitions that were being written at the kill were read twice
    assert not repeated & first
    assert len(repeated) <= (os.cpu_count() or 1)
    state = replay(read_changelog(out), "public.big", ("id",))
    assert len(state) == 200_000
