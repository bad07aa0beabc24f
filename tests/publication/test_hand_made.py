"""Publications pg2sink did not create: used as they are unless told (--publication-mode),
and what their `publish` option leaves out said at start, in status and in a metric."""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import services
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.errors import ConfigError
from pg2sink.publication.manager import PublicationManager
from pg2sink.publication.patterns import TableFilter
from pg2sink.publication.published import CREATED_MARK, publication_members
from tests.conftest import Database, Pg2Sink, read_jsonl, run_cli, wait_for
from tests.support import scalar

Proc = Callable[..., Pg2Sink]

LEFT_OUT = "does not publish UPDATE, DELETE, TRUNCATE"


def _manager(
    conn: psycopg.Connection[TupleRow], db: Database, mode: str = "auto"
) -> PublicationManager:
    return PublicationManager(conn, db.publication, ("public",), TableFilter(), mode=mode)


def _members(conn: psycopg.Connection[TupleRow], db: Database) -> list[str]:
    return [t.qualified for t in publication_members(conn, db.publication)]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _insert_only(conn: psycopg.Connection[TupleRow], db: Database) -> None:
    conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    conn.execute("CREATE TABLE b (id int PRIMARY KEY)")
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE a WITH (publish = 'insert')").format(
            sql.Identifier(db.publication)
        )
    )


def test_an_insert_only_publication_made_by_hand_is_used_as_it_is(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    conn = db.connect()
    _insert_only(conn, db)
    manager = _manager(conn, db)
    with caplog.at_level(logging.WARNING):
        rec = manager.reconcile()
        manager.reconcile()  # said once, not at every poll
    assert _members(conn, db) == ["public.a"]  # b not added
    assert [t.qualified for t in rec.members] == ["public.a"]
    assert not manager.managing
    said = _warnings(caplog)
    assert len([w for w in said if LEFT_OUT in w]) == 1, said
    assert len([w for w in said if "was not created by pg2sink" in w]) == 1, said
    assert rec.joined == ()  # its members at the start are not imported again
    # a table the DBA adds joins (its import job is made then)
    conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE b").format(sql.Identifier(db.publication)))
    assert [t.qualified for t in manager.reconcile().joined] == ["public.b"]
    conn.execute(
        sql.SQL("ALTER PUBLICATION {} DROP TABLE b").format(sql.Identifier(db.publication))
    )
    # told to manage it: b joins, the publish option stays the DBA's
    _manager(conn, db, "manage").reconcile()
    assert _members(conn, db) == ["public.a", "public.b"]
    row = conn.execute(
        "SELECT pubinsert, pubupdate FROM pg_publication WHERE pubname = %s", (db.publication,)
    ).fetchone()
    assert row == (True, False)


def test_stream_status_and_metric_say_what_the_publication_leaves_out(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    _insert_only(conn, db)
    port = services.free_port()
    out = tmp_path / "o.jsonl"
    p = pg2sink_proc("--file-path", str(out), "--metrics-address", f"127.0.0.1:{port}").start()
    p.wait_streaming(60)
    warned = [line for line in p.stderr().splitlines() if LEFT_OUT in line]
    assert len(warned) == 1 and "WARNING" in warned[0], p.stderr()
    assert _members(conn, db) == ["public.a"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert 'pg2sink_publication_publishes{action="insert"} 1.0' in metrics
    assert 'pg2sink_publication_publishes{action="update"} 0.0' in metrics
    # the UPDATE never arrives; the INSERTs do
    conn.execute("INSERT INTO a VALUES (1, 'x')")
    conn.execute("UPDATE a SET v = 'y'")
    conn.execute("INSERT INTO a VALUES (2, 'z')")
    wait_for(lambda: out.exists() and out.read_text().count('"INSERT"') >= 2, 60, "inserts")
    assert '"UPDATE"' not in out.read_text()
    p.stop()
    status = json.loads(run_cli("status", "--json", env=p.env).stdout)
    assert status["publication_left_out"] == ["UPDATE", "DELETE", "TRUNCATE"]
    assert status["publication_managed"] is False
    assert status["publication_kind"] == "FOR TABLE"
    assert any(LEFT_OUT in w for w in status["warnings"])
    text = run_cli("status", env=p.env).stdout
    assert (
        f"publication {db.publication} (FOR TABLE, used as it is): 1 tables; publishes INSERT "
        "(not UPDATE, DELETE, TRUNCATE)"
    ) in text


def test_for_all_tables_and_in_schema_publications_are_read_never_managed(db: Database) -> None:
    conn = db.connect()
    conn.execute("CREATE SCHEMA app; CREATE SCHEMA pg2sink")
    conn.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE app.c (id int PRIMARY KEY)")
    conn.execute("CREATE TABLE pg2sink.internal (id int PRIMARY KEY)")
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(db.publication))
    )
    rec = _manager(conn, db).reconcile()
    # every table but pg2sink's own, whatever --schema says
    assert [t.qualified for t in rec.members] == ["app.c", "public.a"]
    with pytest.raises(ConfigError, match="FOR ALL TABLES: its tables are not pg2sink's"):
        _manager(conn, db, "manage").reconcile()
    conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(db.publication)))
    if conn.info.server_version >= 150000:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLES IN SCHEMA app").format(
                sql.Identifier(db.publication)
            )
        )
        conn.execute("CREATE TABLE app.d (id int PRIMARY KEY)")
        manager = _manager(conn, db)
        assert [t.qualified for t in manager.reconcile().members] == ["app.c", "app.d"]
        assert manager.info is not None and manager.info.kind == "FOR TABLES IN SCHEMA"


def test_use_never_creates_and_auto_marks_what_it_creates(db: Database) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
    with pytest.raises(ConfigError, match="does not exist: --publication-mode use"):
        _manager(conn, db, "use").reconcile()
    manager = _manager(conn, db)
    manager.reconcile()
    assert manager.managing and _members(conn, db) == ["public.a"]
    comment = "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s"
    assert scalar(conn, comment, (db.publication,)) == CREATED_MARK
    # a publication of a pg2sink from before the mark (it has import jobs): managed, marked
    conn.execute(
        sql.SQL("COMMENT ON PUBLICATION {} IS NULL").format(sql.Identifier(db.publication))
    )
    conn.execute("CREATE SCHEMA pg2sink; CREATE TABLE pg2sink.import_jobs (publication text)")
    conn.execute("INSERT INTO pg2sink.import_jobs VALUES (%s)", (db.publication,))
    conn.execute("CREATE TABLE b (id int PRIMARY KEY)")
    again = _manager(conn, db)
    again.reconcile()
    assert again.managing and _members(conn, db) == ["public.a", "public.b"]
    assert scalar(conn, comment, (db.publication,)) == CREATED_MARK


def test_a_for_all_tables_publication_streams_none_of_pg2sinks_own_tables(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(db.publication))
    )
    out = tmp_path / "o.jsonl"
    p = pg2sink_proc("--file-path", str(out)).start()
    p.wait_streaming(60)
    # pg2sink writes its internal schema while it streams: an import job requested
    assert run_cli("import", "--table", "public.a", env=p.env).returncode == 0
    conn.execute("INSERT INTO a VALUES (1)")
    wait_for(lambda: out.exists() and '"INSERT"' in out.read_text(), 60, "the insert")
    p.stop()
    records = read_jsonl(out)
    tables = {(r["namespace"], r["name"]) for r in records if "namespace" in r}
    assert tables == {("public", "a")}, records
