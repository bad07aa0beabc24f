"""Publication membership manager against a real PostgreSQL."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.errors import ConfigError, ServerConfigError
from pg2sink.publication.manager import PublicationManager
from pg2sink.publication.patterns import TableFilter
from pg2sink.publication.published import publication_members, publication_via_root
from tests.conftest import Database


def members(conn: psycopg.Connection[TupleRow], pub: str) -> list[str]:
    return [t.qualified for t in publication_members(conn, pub)]


def manager(
    conn: psycopg.Connection[TupleRow],
    pub: str,
    schemas: tuple[str, ...] = ("public",),
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    allow_no_replica_identity: bool = False,
) -> PublicationManager:
    return PublicationManager(
        conn,
        pub,
        schemas,
        TableFilter.from_patterns(include, exclude),
        allow_no_replica_identity=allow_no_replica_identity,
    )


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


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


def test_table_without_identity_is_left_out_with_one_warning_per_change(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE nokey (v text)")
    conn.execute("CREATE TABLE nothing (id int primary key)")
    conn.execute("ALTER TABLE nothing REPLICA IDENTITY NOTHING")
    conn.execute("CREATE TABLE full_ (v text)")
    conn.execute("ALTER TABLE full_ REPLICA IDENTITY FULL")
    conn.execute("CREATE TABLE keyed (id int primary key)")
    conn.execute("CREATE TABLE idx (code int not null, v text)")
    conn.execute("CREATE UNIQUE INDEX idx_code ON idx (code)")
    conn.execute("ALTER TABLE idx REPLICA IDENTITY USING INDEX idx_code")
    m = manager(conn, db.publication)
    with caplog.at_level(logging.WARNING):
        m.reconcile()
        m.reconcile()  # still left out: not warned about again
    assert members(conn, db.publication) == ["public.full_", "public.idx", "public.keyed"]
    left_out = warnings(caplog)
    assert len(left_out) == 2, left_out
    assert "public.nokey" in left_out[0] and "public.nothing" in left_out[1]
    for w in left_out:
        assert "left out of publication" in w and "--allow-no-replica-identity" in w
    # the application's UPDATE and DELETE still work
    conn.execute("INSERT INTO nokey VALUES ('a'); UPDATE nokey SET v = 'b'; DELETE FROM nokey")
    # a key makes it join; losing the key again makes it leave, with a new warning
    caplog.clear()
    conn.execute("ALTER TABLE nokey ADD COLUMN id serial PRIMARY KEY")
    with caplog.at_level(logging.WARNING):
        assert [t.qualified for t in m.reconcile().joined] == ["public.nokey"]
        conn.execute("ALTER TABLE nokey DROP CONSTRAINT nokey_pkey")
        assert [t.qualified for t in m.reconcile().left] == ["public.nokey"]
    assert [w for w in warnings(caplog) if "public.nokey" in w and "left out" in w]
    # and so does an index identity whose index is dropped (it then acts as NOTHING)
    conn.execute("DROP INDEX idx_code")
    assert [t.qualified for t in m.reconcile().left] == ["public.idx"]


def test_allow_no_replica_identity_publishes_with_a_warning_naming_the_fix(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE nokey (v text)")
    with caplog.at_level(logging.WARNING):
        manager(conn, db.publication, allow_no_replica_identity=True).reconcile()
    assert members(conn, db.publication) == ["public.nokey"]
    warning = warnings(caplog)
    assert len(warning) == 1
    assert "REPLICA IDENTITY FULL" in warning[0] and "public.nokey" in warning[0]
    # without the flag the next instance takes it out again, so UPDATEs work again
    manager(conn, db.publication).reconcile()
    assert members(conn, db.publication) == []
    conn.execute("INSERT INTO nokey VALUES ('a'); UPDATE nokey SET v = 'b'")


def test_a_partitioned_table_counts_by_its_partitions(db: Database) -> None:
    conn = db.connect()
    # no key on the root, but each partition has one: safe to publish
    conn.execute("CREATE TABLE byleaf (id int, region text) PARTITION BY LIST (region)")
    conn.execute(
        "CREATE TABLE byleaf_eu PARTITION OF byleaf (primary key (id)) FOR VALUES IN ('eu')"
    )
    # a key on the root reaches every partition
    conn.execute(
        "CREATE TABLE rooted (id int, region text, primary key (id, region))"
        " PARTITION BY LIST (region)"
    )
    conn.execute("CREATE TABLE rooted_eu PARTITION OF rooted FOR VALUES IN ('eu')")
    # one keyless partition, two levels down: UPDATEs on it would fail
    conn.execute("CREATE TABLE mixed (id int, region text) PARTITION BY LIST (region)")
    conn.execute("CREATE TABLE mixed_eu PARTITION OF mixed (primary key (id)) FOR VALUES IN ('eu')")
    conn.execute(
        "CREATE TABLE mixed_us PARTITION OF mixed FOR VALUES IN ('us') PARTITION BY RANGE (id)"
    )
    conn.execute("CREATE TABLE mixed_us_1 PARTITION OF mixed_us FOR VALUES FROM (0) TO (10)")
    # no partitions yet: judged by itself
    conn.execute("CREATE TABLE empty_nokey (id int) PARTITION BY RANGE (id)")
    manager(conn, db.publication).reconcile()
    assert members(conn, db.publication) == ["public.byleaf", "public.rooted"]


def test_patterns_that_select_nothing_warn_at_every_reconcile(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE orders (id int primary key)")
    m = manager(conn, db.publication, include=("order", "user*"), exclude=("tmp_*",))
    with caplog.at_level(logging.WARNING):
        m.reconcile()
        m.reconcile()
    expected = (
        "-t 'order' -t 'user*' -T 'tmp_*' select no table in schema(s) public: "
        f"publication {db.publication} is empty"
    )
    assert warnings(caplog) == [expected, expected]
    caplog.clear()
    conn.execute("CREATE TABLE users (id int primary key)")
    with caplog.at_level(logging.WARNING):
        m.reconcile()
    assert warnings(caplog) == []
    assert members(conn, db.publication) == ["public.users"]
    # without patterns an empty schema is no mistake (its tables come later)
    conn.execute("CREATE SCHEMA empty")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        manager(conn, f"{db.publication}_2", schemas=("empty",)).reconcile()
    assert warnings(caplog) == []


def test_a_schema_that_does_not_exist_is_a_config_error(db: Database) -> None:
    conn = db.connect()
    m = manager(conn, db.publication, schemas=("public", "nope", "nada"))
    with pytest.raises(
        ConfigError, match=f"--schema nada, nope: no such schema in database {db.name}"
    ):
        m.reconcile()
    assert publication_via_root(conn, db.publication) is None  # rolled back: nothing made


def test_created_publication_is_logged_after_the_commit_only(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")

    def fail(*_: object) -> None:
        raise RuntimeError("the reconcile transaction fails after CREATE PUBLICATION")

    m = manager(conn, db.publication)
    m.on_change = fail
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError):
        m.reconcile()
    assert "created publication" not in caplog.text
    assert publication_via_root(conn, db.publication) is None
    m.on_change = None
    with caplog.at_level(logging.INFO):
        m.reconcile()
    assert f"created publication {db.publication}" in caplog.text


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
    # keyed: a table without a replica identity would be left out
    conn.execute(
        "CREATE TABLE m (id int, region text, primary key (id, region)) PARTITION BY LIST (region)"
    )
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
    conn.execute(
        "CREATE TABLE m (id int, region text, primary key (id, region)) PARTITION BY LIST (region)"
    )
    conn.execute("CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu')")
    manager(conn, db.publication).reconcile()
    assert publication_via_root(conn, db.publication) is False
    assert publication_via_root(conn, "no_such_publication") is None
    published = conn.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (db.publication,)
    ).fetchall()
    assert [r[0] for r in published] == ["m_eu"]  # leaves are published as themselves
