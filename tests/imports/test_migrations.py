"""The internal schema: yoyo migrations under a configurable schema name, never published."""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.config import SecretDsn
from pg2sink.imports.migrate import apply_migrations
from pg2sink.publication.manager import PublicationManager
from pg2sink.publication.patterns import TableFilter
from pg2sink.publication.published import publication_members
from tests.conftest import Database, run_cli


def _tables(conn: psycopg.Connection[TupleRow], schema: str) -> set[str]:
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()
    return {r[0] for r in rows}


def test_apply_creates_the_schema_once(db: Database, pg_conn: psycopg.Connection[TupleRow]) -> None:
    applied = apply_migrations(SecretDsn(db.dsn), "pg2sink")
    assert applied == [
        "0001.import-jobs",
        "0002.capture-ddl",
        "0003.ddl-capture-users",
        "0004.column-lists",
        "0005.column-list-drops",
    ]
    assert {"import_jobs", "import_partitions", "_yoyo_migration"} <= _tables(pg_conn, "pg2sink")
    # nothing of it in public: the search_path was the internal schema only
    assert not _tables(pg_conn, "public") & {"import_jobs", "_yoyo_migration", "yoyo_lock"}
    assert apply_migrations(SecretDsn(db.dsn), "pg2sink") == []


def test_a_non_default_schema_name_with_odd_characters(
    db: Database, pg_conn: psycopg.Connection[TupleRow]
) -> None:
    name = 'Ops "internal"'
    assert apply_migrations(SecretDsn(db.dsn), name) == [
        "0001.import-jobs",
        "0002.capture-ddl",
        "0003.ddl-capture-users",
        "0004.column-lists",
        "0005.column-list-drops",
    ]
    assert {"import_jobs", "import_partitions"} <= _tables(pg_conn, name)
    assert "import_jobs" not in _tables(pg_conn, "pg2sink")
    # a second deployment in the same database has its own, independent schema
    assert len(apply_migrations(SecretDsn(db.dsn), "pg2sink")) == 5
    pg_conn.execute(
        sql.SQL(
            "INSERT INTO {} (publication, schema_name, table_name) VALUES ('p', 's', 't')"
        ).format(sql.Identifier(name, "import_jobs"))
    )
    row = pg_conn.execute("SELECT count(*) FROM pg2sink.import_jobs").fetchone()
    assert row == (0,)


def test_the_internal_schema_is_never_published(
    db: Database, pg_conn: psycopg.Connection[TupleRow]
) -> None:
    apply_migrations(SecretDsn(db.dsn), "internal")
    pg_conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY)")
    # even when the internal schema is among the selected schemas
    manager = PublicationManager(
        pg_conn, db.publication, ("public", "internal"), TableFilter(), "internal"
    )
    manager.reconcile()
    members = {t.qualified for t in publication_members(pg_conn, db.publication)}
    assert members == {"public.orders"}


def test_pg2sink_migrate_command(db: Database, pg_conn: psycopg.Connection[TupleRow]) -> None:
    env = {"PG2SINK_SOURCE": db.dsn}
    first = run_cli("migrate", "--internal-schema", "pg2sink_ops", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == (
        "applied 5 migration(s) to schema pg2sink_ops: 0001.import-jobs, 0002.capture-ddl, "
        "0003.ddl-capture-users, 0004.column-lists, 0005.column-list-drops"
    )
    again = run_cli("migrate", env={**env, "PG2SINK_INTERNAL_SCHEMA": "pg2sink_ops"})
    assert again.returncode == 0, again.stderr
    assert "(it was up to date)" in again.stdout
    assert "import_jobs" in _tables(pg_conn, "pg2sink_ops")
