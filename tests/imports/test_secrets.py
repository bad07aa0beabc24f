"""The source password never leaves pg2sink through an import: not in its logs (Spark's
included), the records, the HTTP API, `pg2sink status` or the jobs' recorded errors.

The test server trusts local connections, so the password is accepted and ignored: what
is checked is that the DSN's secret is never printed, whichever path it travels (the
Spark runner hands it to the JDBC readers and to every executor)."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import services
from psycopg import sql

from tests.conftest import Database, Pg2Sink, run_cli
from tests.imports.support import jobs_state, start_with_imports, wait_imported

pytestmark = pytest.mark.slow

SECRET = "hunter2-imports-5ecret"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_password_appears_nowhere_through_an_import(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.imported (id int PRIMARY KEY, v text)")
        conn.execute(
            "INSERT INTO public.imported SELECT g, 'v' || g FROM generate_series(1, 500) g"
        )
    dsn = f"{db.dsn} password={SECRET}"
    port = services.free_port()
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(
        pg2sink_proc,
        out,
        "--log-level",
        "debug",
        env={"PG2SINK_SOURCE": dsn, "PG2SINK_METRICS_ADDRESS": f"127.0.0.1:{port}"},
    )
    wait_imported(db, {"public.imported"}, proc)

    # and once more on demand, through the CLI
    res = run_cli(
        "import",
        "--table",
        "public.imported",
        env={"PG2SINK_SOURCE": dsn, "PG2SINK_PUBLICATION": db.publication},
    )
    assert res.returncode == 0, res.stderr
    assert SECRET not in res.stdout + res.stderr
    wait_imported(db, {"public.imported"}, proc)

    base = f"http://127.0.0.1:{port}"
    api = "".join(_get(base + path) for path in ("/status", "/stats", "/metrics", "/health"))
    status = run_cli("status", env={"PG2SINK_SOURCE": dsn, "PG2SINK_PUBLICATION": db.publication})
    assert status.returncode == 0, status.stderr
    proc.stop()

    with psycopg.connect(db.dsn, autocommit=True) as conn:
        errors = conn.execute(
            sql.SQL("SELECT coalesce(string_agg(error, ' '), '') FROM {}").format(
                sql.Identifier("pg2sink", "import_jobs")
            )
        ).fetchone()
    records = out.read_text()
    assert '"operation":"IMPORT"' in records  # the import did run through Spark
    assert "public.imported" in jobs_state(db)
    for where, text in {
        "pg2sink's log": proc.stderr(),
        "the records": records,
        "the HTTP API": api,
        "pg2sink status": status.stdout + status.stderr,
        "import_jobs.error": errors[0] if errors else "",
    }.items():
        assert SECRET not in text, f"the password is in {where}"
