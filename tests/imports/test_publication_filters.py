"""Imports read exactly what the publication publishes: its column list and row filter.

A PostgreSQL 15 publication made by hand, `FOR TABLE public.users (id, name) WHERE
(name <> 'hidden')`: the stream sends only `id` and `name` of the rows the filter
accepts, so an import (a job made when the table joined, and one requested with
`pg2sink import --table`) must write no `password` and no filtered-out row, with the
Schema record the stream sends. pg2sink's reconcile leaves the hand-made column list and
row filter as they are (the table is already a member: it is never added again).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.config import SecretDsn
from pg2sink.imports import jobs
from pg2sink.imports.migrate import apply_migrations
from tests.conftest import Database, KafkaStack, Pg2Sink, run_cli
from tests.imports.support import (
    read_changelog,
    start_with_imports,
    wait_confirmed,
    wait_imported,
)
from tests.sinks.kafka.test_kafka import Reader, registry_get

# column lists and row filters are PostgreSQL 15+
pytestmark = [pytest.mark.slow, pytest.mark.pg_since(15)]

SECRETS = (b"password", b"hidden", b"pw-ann", b"pw-bob", b"pw-cat", b"pw-eve")


def _users_published_in_part(db: Database) -> psycopg.Connection[TupleRow]:
    conn = db.connect()
    conn.execute("CREATE TABLE public.users (id int PRIMARY KEY, name text, password text)")
    conn.execute(
        "INSERT INTO public.users VALUES (1, 'ann', 'pw-ann'), (2, 'hidden', 'pw-hid'),"
        " (3, 'bob', 'pw-bob')"
    )
    conn.execute(
        sql.SQL(
            "CREATE PUBLICATION {} FOR TABLE public.users (id, name) WHERE (name <> 'hidden')"
        ).format(sql.Identifier(db.publication))
    )
    return conn


def _published(conn: psycopg.Connection[TupleRow], db: Database) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT attnames, rowfilter FROM pg_publication_tables WHERE pubname = %s",
        (db.publication,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def _request_import(db: Database) -> None:
    r = run_cli(
        "import",
        "--table",
        "public.users",
        env={"PG2SINK_SOURCE": db.dsn, "PG2SINK_PUBLICATION": db.publication},
    )
    assert r.returncode == 0, r.stderr


def _stream_changes(conn: psycopg.Connection[TupleRow]) -> None:
    # (no UPDATE: PostgreSQL refuses one while the row filter's column is not in the
    # replica identity)
    conn.execute("INSERT INTO public.users VALUES (4, 'cat', 'pw-cat'), (5, 'hidden', 'pw-eve')")


def test_file_sink_imports_only_the_published_columns_and_rows(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = _users_published_in_part(db)
    published = _published(conn, db)
    assert published == (["id", "name"], "(name <> 'hidden'::text)")
    # a job made when the table joined, run once the publication lists only some of it
    apply_migrations(SecretDsn(db.dsn), "pg2sink")
    jobs.create_jobs(conn, "pg2sink", db.publication, [("public", "users")], "join")
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(pg2sink_proc, out)
    wait_imported(db, {"public.users"}, proc)
    _request_import(db)  # a new pending job when it returns
    wait_imported(db, {"public.users"}, proc)
    _stream_changes(conn)
    wait_confirmed(db, proc)
    assert proc.stop() == 0
    # several reconciles ran (every 500 ms): the column list and row filter are intact
    assert _published(conn, db) == published

    data = out.read_bytes()
    for secret in SECRETS:
        assert secret not in data, secret
    records = read_changelog(out)
    imported = [r for r in records if r.get("operation") == "IMPORT"]
    assert sorted(r["after"]["id"] for r in imported) == [1, 1, 3, 3]
    assert all(set(r["after"]) == {"id", "name"} for r in imported)
    streamed = [r for r in records if r.get("operation") == "INSERT"]
    assert [r["after"] for r in streamed] == [{"id": 4, "name": "cat"}]
    # the imports' Schema records (one per job) are the one the stream sends
    schemas = [json.dumps(r["schema"], sort_keys=True) for r in records if r["kind"] == "schema"]
    assert len(schemas) == 3 and len(set(schemas)) == 1, schemas


def test_kafka_sink_imports_only_the_published_columns_and_rows(
    db: Database,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    pg2sink_proc: Callable[..., Pg2Sink],
    tmp_path: Path,
) -> None:
    conn = _users_published_in_part(db)
    proc = start_with_imports(
        pg2sink_proc,
        tmp_path / "unused.jsonl",
        "--sink",
        "kafka",
        "--kafka-bootstrap-servers",
        kafka_stack.bootstrap_servers,
        "--schema-registry-url",
        kafka_stack.registry_url,
        "--topic-prefix",
        topic_prefix,
    )
    _request_import(db)
    wait_imported(db, {"public.users"}, proc)
    _stream_changes(conn)
    wait_confirmed(db, proc)
    assert proc.stop() == 0

    reader = Reader(
        kafka_stack.bootstrap_servers, [f"{topic_prefix}.public.users"], kafka_stack.registry_url
    )
    try:
        messages = reader.read(3, timeout=60)
        reader.read_for(3)
    finally:
        reader.close()
    values = [m.value for m in messages if m.value is not None]
    imported = [v for v in values if v["operation"] == "IMPORT"]
    assert sorted(v["after"]["id"] for v in imported) == [1, 3]
    assert all(set(v["after"]) == {"id", "name"} for v in values), values
    assert [v["after"]["id"] for v in values if v["operation"] == "INSERT"] == [4]
    assert all(v["after"]["name"] != "hidden" for v in values)
    # the import registered the row schema the stream then found registered: one version
    topic = f"{topic_prefix}.public.users"
    assert registry_get(kafka_stack, f"subjects/{topic}-value/versions") == [1]
