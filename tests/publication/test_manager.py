"""Publication membership manager against a real PostgreSQL."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.errors import ServerConfigError
from pg2sink.publication.manager import (
    PublicationManager,
    publication_members,
    publication_via_root,
)
from pg2sink.publication.patterns import TableFilter
from tests.conftest import Database


def members(conn: psycopg.Connection[TupleRow], pub: str) -> list[str]:
    return [t.qualified for t in publication_members(conn, pub)]


def manager(
    conn: psycopg.Connection[TupleRow],
    pub: str,
    schemas: tuple[str, ...] = ("public",),
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
) -> PublicationManager:
    return PublicationManager(conn, pub, schemas, TableFilter.from_patterns(include, exclude))


def test_creates_publication_and_adds_matching_tables(db: Database) -> None:
    conn = db.connect()
    conn.execute("CREATE SCHEMA app; CREATE SCHEMA pg2sink")
    conn.execute("CREATE TABLE public.a (id int primary key)")
    conn.execute("CREATE TABLE public.b (id int primary key)")
    conn.execute("CREATE TABLE app.c (id int primary key)")
    conn.execute("CREATE TABLE pg2sink.internal (id int primary key)")
    conn.execute("CREATE TABLE other_schema_table (id int primary key)")
    result = manager(conn, db.publication, ("public", "app", "pg2sink")).reconcile()
    assert sorted(t.qualified for t in result.joined) == [
        "app.c",
        "public.a",
        "public.b",
        "public.other_schema_table",
    ]
    assert members(conn, db.publication) == [
        "app.c",
        "public.a",
        "public.b",
        "public.other_schema_table",
    ]
    # idempotent: nothing changes on a second pass
    again = manager(conn, db.publication, ("public", "app", "pg2sink")).reconcile()
    assert again.joined == () and again.left == ()


def test_tables_leave_when_they_stop_matching_or_are_dropped(db: Database) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE keep_me (id int primary key)")
    conn.execute("CREATE TABLE tmp_scratch (id int primary key)")
    conn.execute("CREATE TABLE gone (id int primary key)")
    manager(conn, db.publication).reconcile()
    assert members(conn, db.publication) == [
        "public.gone",
        "public.keep_me",
        "public.tmp_scratch",
    ]
    conn.execute("DROP TABLE gone")
    result = manager(conn, db.publication, exclude=("tmp_*",)).reconcile()
    assert [t.qualified for t in result.left] == ["public.tmp_scratch"]
    assert members(conn, db.publication) == ["public.keep_me"]


def test_include_and_exclude_patterns(db: Database) -> None:
    conn = db.connect()
    for name in ("users", "users_archive", "orders", "Mixed Case"):
        conn.execute(sql.SQL("CREATE TABLE {} (id int primary key)").format(sql.Identifier(name)))
    manager(
        conn, db.publication, include=("user*", '"Mixed Case"'), exclude=("*_archive",)
    ).reconcile()
    assert members(conn, db.publication) == ["public.Mixed Case", "public.users"]


def test_partitions_are_covered_by_their_root(db: Database) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE m (id int, at date, primary key (id, at)) PARTITION BY RANGE (at)")
    conn.execute(
        "CREATE TABLE m_2024 PARTITION OF m FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')"
    )
    manager(conn, db.publication).reconcile()
    assert members(conn, db.publication) == ["public.m"]


def test_table_without_identity_joins_with_a_warning_naming_the_fix(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE nokey (v text)")
    with caplog.at_level(logging.WARNING):
        manager(conn, db.publication).reconcile()
    assert members(conn, db.publication) == ["public.nokey"]
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1
    assert "REPLICA IDENTITY FULL" in warning[0] and "public.nokey" in warning[0]


def test_two_managers_serialise_on_the_advisory_lock(db: Database) -> None:
    first = db.connect()
    second = db.connect()
    first.execute("CREATE TABLE t1 (id int primary key)")
    # Hold the lock as the first instance would in the middle of a reconcile.
    first.execute("BEGIN")
    first.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
        (f"pg2sink.publication.{db.publication}",),
    )
    done = threading.Event()

    def run_second() -> None:
        manager(second, db.publication).reconcile()
        done.set()

    t = threading.Thread(target=run_second)
    t.start()
    assert not done.wait(0.5), "the second reconcile must wait for the lock"
    first.execute("COMMIT")
    assert done.wait(10)
    t.join()
    assert members(first, db.publication) == ["public.t1"]


def test_missing_privileges_are_a_clear_config_error(db: Database) -> None:
    admin = db.connect()
    admin.execute("CREATE TABLE owned_by_admin (id int primary key)")
    role = f"r_{db.name}"
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        admin.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(db.name), sql.Identifier(role)
            )
        )
        conn = psycopg.connect(db.dsn.replace("user=postgres", f"user={role}"), autocommit=True)
        try:
            with pytest.raises(ServerConfigError, match="ownership"):
                manager(conn, db.publication).reconcile()
        finally:
            conn.close()
    finally:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_publish_via_partition_root_is_set_and_follows_the_flag(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE m (id int, region text) PARTITION BY LIST (region)")
    conn.execute("CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu')")

    def reconcile(flag: bool) -> None:
        PublicationManager(
            conn, db.publication, ("public",), TableFilter(), publish_via_partition_root=flag
        ).reconcile()

    reconcile(True)
    assert publication_via_root(conn, db.publication) is True
    assert members(conn, db.publication) == ["public.m"]  # the root, not its partitions
    caplog.set_level(logging.INFO, logger="pg2sink.publication.manager")
    reconcile(True)
    assert "publish_via_partition_root" not in caplog.text  # unchanged: no ALTER
    reconcile(False)  # an existing publication is altered when the flag changes
    assert publication_via_root(conn, db.publication) is False
    assert "publish_via_partition_root set to false" in caplog.text
    reconcile(True)
    assert publication_via_root(conn, db.publication) is True
    # a partition created later is covered without joining: PostgreSQL publishes it
    # through its root
    conn.execute("CREATE TABLE m_us PARTITION OF m FOR VALUES IN ('us')")
    reconcile(True)
    assert members(conn, db.publication) == ["public.m"]
    published = conn.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (db.publication,)
    ).fetchall()
    assert [r[0] for r in published] == ["m"]  # via the root: listed as the root


def test_without_publish_via_partition_root_the_default_is_off(db: Database) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE m (id int, region text) PARTITION BY LIST (region)")
    conn.execute("CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu')")
    manager(conn, db.publication).reconcile()
    assert publication_via_root(conn, db.publication) is False
    assert publication_via_root(conn, "no_such_publication") is None
    published = conn.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (db.publication,)
    ).fetchall()
    assert [r[0] for r in published] == ["m_eu"]  # leaves are published as themselves
