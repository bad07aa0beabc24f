"""Helpers of the import tests: running pg2sink with imports, replaying its changelog."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from tests.conftest import Database, Pg2Sink, descendants, wait_for

#: the environment that turns imports on (tests/conftest.py clean_env() turns them off)
IMPORTS_ON = {"PG2SINK_NO_IMPORTS": "0"}


def read_changelog(path: Path) -> list[dict[str, Any]]:
    """Complete lines, numbers exact (numeric as Decimal)."""
    out = []
    for line in path.read_bytes().split(b"\n"):
        if not line:
            continue
        try:
            out.append(json.loads(line, parse_float=Decimal))
        except json.JSONDecodeError:
            continue  # a torn last line after kill -9
    return out


def start_with_imports(
    pg2sink_proc: Callable[..., Pg2Sink], out: Path, *extra: str, env: dict[str, str] | None = None
) -> Pg2Sink:
    p = pg2sink_proc(
        "--file-path",
        str(out),
        "--publication-poll-interval",
        "500ms",
        *extra,
        env={**IMPORTS_ON, **(env or {})},
    )
    p.start()
    p.wait_streaming(60)
    return p


def jobs_state(db: Database, schema: str = "pg2sink") -> dict[str, str]:
    with psycopg.connect(db.dsn, autocommit=True) as c:
        rows = c.execute(
            sql.SQL(
                "SELECT schema_name || '.' || table_name, state FROM {} WHERE state <> 'expired'"
            ).format(sql.Identifier(schema, "import_jobs"))
        ).fetchall()
    return {r[0]: r[1] for r in rows}


def wait_imported(db: Database, tables: set[str], proc: Pg2Sink, timeout: float = 240) -> None:
    def done() -> bool:
        assert proc.proc is not None
        if proc.proc.poll() is not None:
            raise AssertionError(f"pg2sink exited {proc.proc.returncode}:\n{proc.stderr()}")
        try:
            states = jobs_state(db)
        except psycopg.errors.UndefinedTable:
            return False
        failed = {t: s for t, s in states.items() if s == "failed"}
        if failed:
            raise AssertionError(f"imports failed: {failed}\n{proc.stderr()}")
        return all(states.get(t) == "done" for t in tables)

    wait_for(done, timeout, f"imports of {sorted(tables)}")


def driver_jvm(proc: Pg2Sink) -> int | None:
    """The pid of the Spark driver JVM pg2sink started (SparkSubmit), None if none."""
    assert proc.proc is not None
    for pid in descendants(proc.proc.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"java" in cmdline and b"org.apache.spark.deploy.SparkSubmit" in cmdline:
            return pid
    return None


def wait_confirmed(db: Database, proc: Pg2Sink, timeout: float = 60) -> None:
    """Until the slot confirmed everything written so far."""
    target = db.current_lsn()

    def confirmed() -> bool:
        lsn = db.slot_confirmed_lsn()
        return lsn is not None and lsn >= target

    wait_for(confirmed, timeout, "the slot to confirm the last change")


Key = tuple[Any, ...]


def table_modifications(records: list[dict[str, Any]], table: str) -> Iterator[dict[str, Any]]:
    """The Modification records of `table` ("schema.name"), in file order."""
    schema, name = table.split(".")
    for r in records:
        if r.get("kind") == "modification" and (r["namespace"], r["name"]) == (schema, name):
            yield r


def replay(
    records: list[dict[str, Any]], table: str, key: tuple[str, ...]
) -> dict[Key, dict[str, Any]]:
    """A keyed table's state from its changelog in file order (the consumer's rule:
    INSERT/UPDATE/IMPORT upsert the after row, DELETE removes the key, an UPDATE whose
    before holds a different key removes that key, TRUNCATE empties the table)."""
    state: dict[Key, dict[str, Any]] = {}
    for r in table_modifications(records, table):
        op = r["operation"]
        if op == "TRUNCATE":
            state.clear()
        elif op == "DELETE":
            state.pop(tuple(r["before"][k] for k in key), None)
        else:
            if r["before"] is not None:
                state.pop(tuple(r["before"][k] for k in key), None)
            state[tuple(r["after"][k] for k in key)] = r["after"]
    return state


def replay_rows(records: list[dict[str, Any]], table: str) -> Counter[str]:
    """A keyless table (REPLICA IDENTITY FULL) as a multiset of rows."""
    state: Counter[str] = Counter()

    def norm(row: dict[str, Any]) -> str:
        return json.dumps(row, sort_keys=True, default=str)

    for r in table_modifications(records, table):
        op = r["operation"]
        if op == "TRUNCATE":
            state.clear()
            continue
        if r["before"] is not None and op in ("UPDATE", "DELETE"):
            state[norm(r["before"])] -= 1
            if state[norm(r["before"])] <= 0:
                del state[norm(r["before"])]
        if r["after"] is not None:
            state[norm(r["after"])] += 1
    return state


def select_rows(
    conn: psycopg.Connection[TupleRow], table: str, columns: tuple[str, ...]
) -> list[dict[str, Any]]:
    schema, name = table.split(".")
    cur = conn.execute(
        sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns), sql.Identifier(schema, name)
        )
    )
    return [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]
