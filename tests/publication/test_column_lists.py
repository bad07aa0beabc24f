"""--exclude-column as publication column lists, against the real PostgreSQL 15.

What pgoutput sends is read raw (pg_logical_slot_peek_binary_changes on a slot of the
test's own): the excluded values' bytes are not in it, for INSERT and UPDATE, and for
an INSERT in the transaction of an ADD COLUMN (pg2sink's event trigger extends the list
before it) or of a DROP COLUMN of a listed column (no CASCADE needed: the triggers take
the member out and put it back within the statement), with a writer committing
meanwhile. Where PostgreSQL refuses a list the table is published whole and one line
says so.
"""

from __future__ import annotations

import logging
import re
import struct
import threading
import time

import psycopg
import pytest
from psycopg.rows import TupleRow

from pg2sink.config import SecretDsn
from pg2sink.imports.migrate import apply_migrations
from pg2sink.logical.decoder import decode
from pg2sink.logical.messages import Begin, Relation
from pg2sink.publication.manager import PublicationManager
from pg2sink.publication.patterns import TableFilter
from pg2sink.routing.rules import compile_rules
from tests.conftest import Database

#: publication column lists are PostgreSQL 15+
pytestmark = pytest.mark.pg_since(15)


def _manager(
    conn: psycopg.Connection[TupleRow],
    db: Database,
    *exclude: str,
    via_root: bool = False,
    mode: str = "auto",
) -> PublicationManager:
    return PublicationManager(
        conn,
        db.publication,
        ("public",),
        TableFilter(),
        publish_via_partition_root=via_root,
        exclusions=compile_rules(exclude_columns=exclude).excluded,
        mode=mode,
    )


def _listed(conn: psycopg.Connection[TupleRow], db: Database) -> dict[str, list[str] | None]:
    rows = conn.execute(
        "SELECT tablename, attnames FROM pg_publication_tables WHERE pubname = %s",
        (db.publication,),
    ).fetchall()
    return {r[0]: list(r[1]) for r in rows}


def _has_list(conn: psycopg.Connection[TupleRow], table: str) -> bool:
    row = conn.execute(
        "SELECT prattrs IS NOT NULL FROM pg_publication_rel WHERE prrelid = %s::regclass",
        (table,),
    ).fetchone()
    assert row is not None
    return bool(row[0])


def _peek_rows(conn: psycopg.Connection[TupleRow], db: Database) -> list[tuple[str, bytes]]:
    """The slot's changes so far, each pgoutput message with its LSN (not consumed)."""
    time.sleep(1)  # synchronous_commit=off: decoding reads flushed WAL only
    rows = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
        " 'proto_version', '1', 'publication_names', %s)",
        (db.slot, db.publication),
    ).fetchall()
    return [(lsn, bytes(data)) for lsn, data in rows]


def _peek(conn: psycopg.Connection[TupleRow], db: Database) -> bytes:
    return b"".join(data for _, data in _peek_rows(conn, db))


def _carrying(rows: list[tuple[str, bytes]], *secrets: bytes) -> list[str]:
    """Each message whose bytes hold one of `secrets`, decoded with what was in force for it (the
    transaction, the relation's columns as last described): where a leak happened, for
    a failure that happens once in many runs."""
    found: list[str] = []
    xid: int | None = None
    columns: dict[int | None, list[str]] = {}
    for lsn, data in rows:
        message = decode(data)
        if isinstance(message, Begin):
            xid = message.xid
        elif isinstance(message, Relation):
            columns[message.relation_id] = [c.name for c in message.columns]
        if any(secret in data for secret in secrets):
            rel = getattr(message, "relation_id", None)
            found.append(f"xid {xid} at {lsn}: {message!r} (columns {columns.get(rel)})")
    return found


@pytest.fixture
def conn(db: Database) -> psycopg.Connection[TupleRow]:
    apply_migrations(SecretDsn(db.dsn), "pg2sink")
    return db.connect()


def test_excluded_values_never_reach_pgoutput(
    conn: psycopg.Connection[TupleRow], db: Database
) -> None:
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text, password text)")
    conn.execute("CREATE TABLE plain (id int PRIMARY KEY, v text)")
    _manager(conn, db, "public.users.pass*", "*.token").reconcile()
    assert _listed(conn, db) == {"users": ["id", "name"], "plain": ["id", "v"]}
    assert not _has_list(conn, "plain")  # nothing excluded: published whole
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot,))
    conn.execute("INSERT INTO users VALUES (1, 'ann', 'pw-ins-1')")
    conn.execute("UPDATE users SET name = 'anna', password = 'pw-upd-1' WHERE id = 1")
    with conn.transaction():
        conn.execute("ALTER TABLE users ADD COLUMN extra text, ADD COLUMN token text")
        conn.execute("INSERT INTO users VALUES (2, 'bob', 'pw-ins-2', 'xtra-2', 'tok-2')")
    # a column renamed to an excluded name leaves the list too
    with conn.transaction():
        conn.execute("ALTER TABLE users RENAME COLUMN extra TO token2")
        conn.execute("ALTER TABLE users RENAME COLUMN token2 TO password2")
        conn.execute("INSERT INTO users VALUES (3, 'cat', 'pw-ins-3', 'pw2-3', 'tok-3')")
    raw = _peek(conn, db)
    for value in (b"ann", b"anna", b"bob", b"xtra-2", b"extra", b"cat"):
        assert value in raw, value
    for secret in (b"pw-ins-1", b"pw-upd-1", b"pw-ins-2", b"tok-2", b"token", b"pw-ins-3"):
        assert secret not in raw, secret
    assert b"pw2-3" not in raw and _listed(conn, db)["users"] == ["id", "name"]


def test_drop_column_needs_no_cascade(conn: psycopg.Connection[TupleRow], db: Database) -> None:
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text, note text, password text)")
    conn.execute("ALTER TABLE users ADD COLUMN a text, ADD COLUMN b text, ADD COLUMN c text")
    _manager(conn, db, "users.password").reconcile()
    # PostgreSQL 15 refuses to drop a listed column without CASCADE (the member depends
    # on it): migration 0005's trigger takes the member out first, 0004's puts it back
    conn.execute("ALTER TABLE users DROP COLUMN note")
    assert _listed(conn, db) == {"users": ["id", "name", "a", "b", "c"]}
    conn.execute("ALTER TABLE users DROP COLUMN a CASCADE")  # still accepted
    conn.execute("ALTER TABLE users DROP COLUMN password")  # unlisted
    assert _listed(conn, db) == {"users": ["id", "name", "b", "c"]}
    # names as the ALTER resolves them: quoted, qualified, the caller's search_path, and
    # any statement of a string of several
    conn.execute("SET search_path = pg_catalog, public")
    conn.execute(
        'SELECT 1; ALTER TABLE IF EXISTS ONLY public . "users" DROP b; ALTER TABLE users DROP c'
    )
    assert _listed(conn, db) == {"users": ["id", "name"]}
    assert conn.execute("SHOW search_path").fetchone() == ("pg_catalog, public",)
    # a DO block's text shows its statements; a function's do not (CASCADE, documented)
    conn.execute("ALTER TABLE users ADD d text, ADD e text")
    conn.execute("DO $$ BEGIN ALTER TABLE users DROP COLUMN d; END $$")
    conn.execute(
        "CREATE FUNCTION public.drop_e() RETURNS void LANGUAGE plpgsql"
        " AS 'BEGIN ALTER TABLE users DROP COLUMN e; END'"
    )
    with pytest.raises(psycopg.errors.DependentObjectsStillExist):
        conn.execute("SELECT public.drop_e()")
    assert _listed(conn, db) == {"users": ["id", "name", "e"]}


def _text(value: str) -> bytes:
    """A text column's bytes in a pgoutput tuple: 't', the length, the value."""
    return b"t" + struct.pack(">i", len(value)) + value.encode()


def test_drop_column_streams_on_without_the_excluded_values(
    conn: psycopg.Connection[TupleRow], db: Database
) -> None:
    conn.execute(
        "CREATE TABLE users (id int PRIMARY KEY, name text, note text, extra text, password text)"
    )
    _manager(conn, db, "users.password").reconcile()
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot,))
    conn.execute("INSERT INTO users VALUES (1, 'before-1', 'note-1', 'extra-1', 'pw-1')")
    with conn.transaction():  # changes in the DROP's transaction, before and after it
        conn.execute("INSERT INTO users VALUES (2, 'before-2', 'note-2', 'extra-2', 'pw-2')")
        conn.execute("ALTER TABLE users DROP COLUMN note")
        conn.execute("INSERT INTO users VALUES (3, 'after-3', 'extra-3', 'pw-3')")
    # a writer commits all along while a column is dropped: it waits for the DROP's lock,
    # neither deadlocks nor loses a change
    stop, written = threading.Event(), []

    def write() -> None:
        with psycopg.connect(db.dsn, autocommit=True) as w:
            for i in range(100, 100_000):
                if stop.is_set():
                    return
                w.execute(
                    "INSERT INTO users (id, name, password) VALUES (%s, %s, %s)",
                    (i, f"w-{i}", f"pw-w-{i}"),
                )
                written.append(i)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        time.sleep(0.3)
        conn.execute("ALTER TABLE users DROP COLUMN extra")
        (drop,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone() or ("?",)
        time.sleep(0.3)
    finally:
        stop.set()
        writer.join()
    conn.execute("INSERT INTO users VALUES (4, 'after-4', 'pw-4')")
    assert len(written) > 10
    rows = _peek_rows(conn, db)
    raw = b"".join(data for _, data in rows)
    shown = ["before-1", "note-1", "before-2", "after-3", "extra-3", "after-4"]
    for value in shown + [f"w-{i}" for i in written]:
        assert _text(value) in raw, value
    # seen once in CI (2026-11-25), not in about 250 runs since: say what leaked
    leaks = _carrying(rows, b"pw-", b"password")
    assert not leaks, f"{len(leaks)} leaks (the DROP of extra ended at {drop}): {leaks[:6]}"
    assert _listed(conn, db) == {"users": ["id", "name"]}


def test_no_deadlock_with_a_writer_that_then_locks_the_table(
    conn: psycopg.Connection[TupleRow], db: Database
) -> None:
    """A transaction that wrote to the table, then asks for a stronger lock while the DROP
    waits for it: PostgreSQL lets it go first, as without the trigger. (With ALTER
    PUBLICATION's lock taken before the DROP's, this was a deadlock: one of the two
    failed with "deadlock detected".)"""
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text, note text, password text)")
    _manager(conn, db, "users.password").reconcile()
    failures: list[BaseException] = []

    def drop() -> None:
        try:
            with psycopg.connect(db.dsn, autocommit=True) as other:
                other.execute("ALTER TABLE users DROP COLUMN note")
        except psycopg.Error as e:
            failures.append(e)

    with psycopg.connect(db.dsn) as writer:
        writer.execute("INSERT INTO users VALUES (1, 'a', 'b', 'c')")
        dropping = threading.Thread(target=drop)
        dropping.start()
        wait = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'users'::regclass"
        deadline = time.monotonic() + 10
        while conn.execute(wait).fetchone() != (1,) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert conn.execute(wait).fetchone() == (1,)  # the DROP waits for the writer
        writer.execute("CREATE INDEX ON users (name)")  # a SHARE lock, after the DROP's
        writer.commit()
        dropping.join()
    assert not failures
    assert _listed(conn, db) == {"users": ["id", "name"]}


def test_the_caller_search_path_runs_nothing_of_its_schemas(
    conn: psycopg.Connection[TupleRow], db: Database
) -> None:
    """The trigger reads the statement's names under the caller's search_path with its
    owner's rights: functions and operators of the caller's schemas must not run."""
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, note text, password text)")
    _manager(conn, db, "users.password").reconcile()
    conn.execute("CREATE SCHEMA evil")
    conn.execute("CREATE TABLE evil.called (what text)")
    for name, args in (
        ("current_query", ""),
        ("current_setting", "a text"),
        ("to_regclass", "a text"),
        ("regexp_matches", "a text, b text, c text"),
        ("set_config", "a text, b text, c boolean"),
    ):
        conn.execute(
            f"CREATE FUNCTION evil.{name}({args}) RETURNS text LANGUAGE sql"
            f" AS $$ INSERT INTO evil.called VALUES ('{name}') RETURNING 'x' $$"
        )
    conn.execute(
        "CREATE FUNCTION evil.match(a text, b text) RETURNS boolean LANGUAGE sql"
        " AS $$ INSERT INTO evil.called VALUES ('~*') RETURNING true $$"
    )
    conn.execute("CREATE OPERATOR evil.~* (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.match)")
    conn.execute("SET search_path = evil, pg_catalog, public")
    conn.execute("ALTER TABLE public.users DROP COLUMN note")
    conn.execute("RESET search_path")
    assert conn.execute("SELECT count(*) FROM evil.called").fetchone() == (0,)
    assert _listed(conn, db) == {"users": ["id"]}


def test_the_trigger_locks_only_tables_the_role_may_alter(
    conn: psycopg.Connection[TupleRow], db: Database
) -> None:
    """The trigger runs with its owner's rights: a table named in the text of another
    role's ALTER TABLE is neither locked nor taken out of the publication."""
    role = f"r_{db.name}"
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, note text, password text)")
    _manager(conn, db, "users.password").reconcile()
    conn.execute(f'CREATE ROLE "{role}"')
    try:
        conn.execute(f'GRANT CREATE ON SCHEMA public TO "{role}"')
        conn.execute(f'SET ROLE "{role}"')
        conn.execute("CREATE TABLE mine (id int, x int)")
        locks = (
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()"
            " AND relation = 'users'::regclass AND mode = 'AccessExclusiveLock'"
        )
        with conn.transaction():
            conn.execute("ALTER TABLE mine DROP x; SELECT 'ALTER TABLE users DROP note'")
            assert conn.execute(locks).fetchone() == (0,)
            assert _listed(conn, db) == {"users": ["id", "note"]}
        conn.execute("RESET ROLE")
        with conn.transaction():  # the owner's (a superuser's) same text: locked
            conn.execute("ALTER TABLE mine ADD y int; SELECT 'ALTER TABLE users DROP note'")
            assert conn.execute(locks).fetchone() == (1,)
        assert _listed(conn, db) == {"users": ["id", "note"]}
    finally:
        conn.execute("RESET ROLE")
        conn.execute("DROP TABLE IF EXISTS mine")
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')


def test_two_internal_schemas_each_put_their_table_back(
    conn: psycopg.Connection[TupleRow], db: Database
) -> None:
    """Two pg2sink deployments in one database, each with its triggers and publication:
    a table the text names but the statement does not alter is taken out by both at its
    start and must be back in both at its end."""
    apply_migrations(SecretDsn(db.dsn), "other")
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, note text, password text)")
    conn.execute("CREATE TABLE mine (id int)")
    _manager(conn, db, "users.password").reconcile()
    second = f"{db.publication}_b"
    PublicationManager(
        conn,
        second,
        ("public",),
        TableFilter(),
        "other",
        exclusions=compile_rules(exclude_columns=("users.password",)).excluded,
    ).reconcile()
    try:
        conn.execute("ALTER TABLE mine ADD y int; SELECT 'ALTER TABLE users DROP note'")
        rows = conn.execute(
            "SELECT pubname, attnames FROM pg_publication_tables WHERE tablename = 'users'"
        ).fetchall()
        assert sorted((r[0], list(r[1])) for r in rows) == [
            (db.publication, ["id", "note"]),
            (second, ["id", "note"]),
        ]
    finally:
        conn.execute("DROP EVENT TRIGGER other_column_lists")
        conn.execute("DROP EVENT TRIGGER other_column_drops")
        conn.execute(f'DROP PUBLICATION "{second}"')


def test_refused_lists_fall_back_and_say_so(
    conn: psycopg.Connection[TupleRow], db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    conn.execute("CREATE TABLE full_id (id int PRIMARY KEY, password text)")
    conn.execute("ALTER TABLE full_id REPLICA IDENTITY FULL")
    conn.execute("CREATE TABLE parted (id int PRIMARY KEY, password text) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10)")
    conn.execute("CREATE TABLE by_hand (id int PRIMARY KEY, password text)")
    conn.execute("CREATE TABLE listed (id int PRIMARY KEY, password text)")
    conn.execute(f'CREATE PUBLICATION "{db.publication}" FOR TABLE by_hand (id, password)')
    # made by hand: pg2sink manages its membership only when told to
    manager = _manager(conn, db, "*.password", mode="manage")
    with caplog.at_level(logging.WARNING):
        manager.reconcile()
        manager.reconcile()  # said once, not at every poll
    lines = [r.getMessage() for r in caplog.records if "still travel" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "public.full_id: REPLICA IDENTITY FULL" in lines[0]
    assert "public.parted: a partitioned table needs --publish-via-partition-root" in lines[0]
    assert "public.by_hand: its column list or row filter was set by hand" in lines[0]
    assert "listed" not in lines[0]
    assert _has_list(conn, "listed") and not _has_list(conn, "full_id")
    assert _listed(conn, db)["by_hand"] == ["id", "password"]  # the user's, as it was
    # a FULL identity set later: the trigger publishes the table whole again
    conn.execute("ALTER TABLE listed REPLICA IDENTITY FULL")
    assert not _has_list(conn, "listed")
    conn.execute("UPDATE listed SET password = 'x'")  # PostgreSQL accepts it
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        manager.reconcile()
    assert "public.listed: REPLICA IDENTITY FULL" in caplog.text


def test_partitioned_root_via_root_and_lifting_exclusions(
    conn: psycopg.Connection[TupleRow], db: Database
) -> None:
    conn.execute("CREATE TABLE parted (id int PRIMARY KEY, password text) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10)")
    _manager(conn, db, "parted.password", via_root=True).reconcile()
    assert _listed(conn, db) == {"parted": ["id"]}
    conn.execute("ALTER TABLE parted ADD COLUMN v text")
    assert _listed(conn, db) == {"parted": ["id", "v"]}
    # started again without --exclude-column: published whole, no longer pg2sink's list
    _manager(conn, db, via_root=True).reconcile()
    assert not _has_list(conn, "parted")
    conn.execute("ALTER TABLE parted ADD COLUMN w text")
    assert not _has_list(conn, "parted")
    # pg2sink drop: the publication's patterns and marks go with it
    again = _manager(conn, db, "parted.password", via_root=True)
    again.reconcile()
    stored = "SELECT count(*) FROM pg2sink.column_exclusions WHERE publication = %s"
    assert conn.execute(stored, (db.publication,)).fetchone() == (1,)
    assert again.drop()
    assert conn.execute(stored, (db.publication,)).fetchone() == (0,)


def test_without_the_right_to_create_the_trigger_no_list(
    conn: psycopg.Connection[TupleRow], db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A list without the trigger would miss columns added later: published whole."""
    role = f"r_{db.name}"
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, password text)")
    conn.execute(f'CREATE ROLE "{role}"')
    try:
        conn.execute(f'GRANT CREATE ON DATABASE "{db.name}" TO "{role}"')
        conn.execute(f'ALTER TABLE users OWNER TO "{role}"')
        conn.execute(f'GRANT USAGE ON SCHEMA pg2sink TO "{role}"')
        conn.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA pg2sink TO "{role}"')
        conn.execute(f'SET ROLE "{role}"')
        with caplog.at_level(logging.WARNING):
            _manager(conn, db, "users.password").reconcile()
        conn.execute("RESET ROLE")
        assert _listed(conn, db) == {"users": ["id", "password"]}
        assert "public.users: creating the event trigger" in caplog.text
        assert "needs a superuser" in caplog.text
    finally:
        conn.execute("RESET ROLE")
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')


def test_capture_ddl_sends_the_alter_table_once(
    conn: psycopg.Connection[TupleRow], db: Database
) -> None:
    """--capture-ddl's trigger stays silent for the ALTER PUBLICATION statements the list's
    trigger runs: a consumer replaying DDL would run the ALTER TABLE three times."""
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, password text)")
    _manager(conn, db, "users.password").reconcile()
    conn.execute(
        "CREATE EVENT TRIGGER pg2sink_capture_ddl ON ddl_command_end"
        " EXECUTE FUNCTION pg2sink.capture_ddl()"
    )
    try:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot,))
        with conn.transaction():
            conn.execute("ALTER TABLE users ADD COLUMN extra text")
            conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
        time.sleep(1)  # synchronous_commit=off: decoding reads flushed WAL only
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
            " 'proto_version', '1', 'publication_names', %s, 'messages', 'true')",
            (db.slot, db.publication),
        ).fetchall()
    finally:
        conn.execute("DROP EVENT TRIGGER pg2sink_capture_ddl")
    tags = re.findall(rb'"tag" : "([A-Z ]+)"', b"".join(bytes(r[0]) for r in rows))
    assert tags == [b"ALTER TABLE", b"CREATE TABLE"]
    assert _listed(conn, db)["users"] == ["id", "extra"]
