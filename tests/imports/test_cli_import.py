"""`pg2sink import`, `pg2sink status` with jobs, and the import flags in --help."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg.rows import TupleRow

from pg2sink.imports import jobs
from tests.conftest import Database, Pg2Sink, run_cli
from tests.imports.support import read_changelog, start_with_imports, wait_confirmed, wait_imported


def _env(db: Database) -> dict[str, str]:
    return {"PG2SINK_SOURCE": db.dsn, "PG2SINK_PUBLICATION": db.publication}


def test_help_lists_the_import_flags_with_their_environment_variables() -> None:
    out = run_cli("stream", "--help").stdout
    for flag in (
        "--no-imports",
        "--import-backoff-base",
        "--import-backoff-factor",
        "--import-backoff-max",
        "--internal-schema",
    ):
        assert flag in out
    assert "PG2SINK_NO_IMPORTS" in out and "PG2SINK_IMPORT_BACKOFF_MAX" in out
    top = run_cli("--help").stdout
    assert "migrate" in top and "import" in top
    assert "--list" in run_cli("import", "--help").stdout


def test_bad_import_arguments_are_one_line_errors(db: Database) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
    for args, message in (
        (("import",), "pg2sink import needs --table SCHEMA.TABLE or --list"),
        (("import", "--table", "nodot"), "invalid --table 'nodot': expected SCHEMA.TABLE"),
        (("import", "--table", "public.t"), "table public.t is not in publication"),
        (("stream", "--import-backoff-factor", "0.5"), "factor '0.5' must be at least 1"),
    ):
        r = run_cli(*args, env=_env(db))
        assert r.returncode == 2, r
        assert message in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_reimport_on_demand_and_list(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn: psycopg.Connection[TupleRow] = db.connect()
    conn.execute("CREATE TABLE public.items (id int PRIMARY KEY, v text)")
    conn.execute("INSERT INTO public.items SELECT g, 'v' || g FROM generate_series(1, 100) g")
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(pg2sink_proc, out)
    wait_imported(db, {"public.items"}, proc)
    (first,) = jobs.list_jobs(conn, "pg2sink", db.publication)

    listed = run_cli("import", "--list", env=_env(db))
    assert listed.returncode == 0, listed.stderr
    assert f"#{first.id} public.items: done, 100 rows" in listed.stdout

    again = run_cli("import", "--table", "public.items", env=_env(db))
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("import job ") and "public.items" in again.stdout
    wait_imported(db, {"public.items"}, proc)
    wait_confirmed(db, proc)
    assert proc.stop() == 0

    every = json.loads(run_cli("import", "--list", "--all", "--json", env=_env(db)).stdout)
    states = sorted((j["id"], j["state"], j["reason"]) for j in every)
    assert states[0] == (first.id, "expired", "join")
    assert states[1][1:] == ("done", "request")
    imported = [r for r in read_changelog(out) if r.get("operation") == "IMPORT"]
    assert len(imported) == 200  # twice the table

    status = json.loads(run_cli("status", "--json", env=_env(db)).stdout)
    assert [(j["table"], j["state"], j["rows_processed"]) for j in status["imports"]] == [
        ("items", "done", 100)
    ]
    text = run_cli("status", env=_env(db)).stdout
    assert "imports: 1 jobs" in text and "public.items: done, 100 rows" in text
