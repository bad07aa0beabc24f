"""`pg2sink drop` reaches only its own objects: never a slot of another database."""

from __future__ import annotations

from psycopg import sql

from tests.conftest import Database, fresh_database, run_cli
from tests.support import scalar


def test_drop_refuses_a_slot_of_another_database(db: Database) -> None:
    with fresh_database(db.server) as other:
        other_conn = other.connect()
        other_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot,))
        conn = db.connect()
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(db.publication))
        )
        res = run_cli(
            "drop", "--source", db.dsn, "--slot", db.slot, "--publication", db.publication
        )
        assert res.returncode == 2, res
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert lines[0].startswith("pg2sink: error:") and repr(other.name) in lines[0], lines
        assert res.stdout == ""
        # nothing dropped: the other database's slot, nor this database's publication
        assert (
            scalar(
                other_conn,
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                (db.slot,),
            )
            == 1
        )
        assert (
            scalar(
                conn, "SELECT count(*) FROM pg_publication WHERE pubname = %s", (db.publication,)
            )
            == 1
        )


def test_drop_of_a_missing_slot_still_drops_the_publication(db: Database) -> None:
    conn = db.connect()
    conn.execute(sql.SQL("CREATE PUBLICATION {}").format(sql.Identifier(db.publication)))
    args = ("drop", "--source", db.dsn, "--slot", db.slot, "--publication", db.publication)
    # made by hand: left as it is unless pg2sink is told to manage it
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    assert f"publication {db.publication} was not created by pg2sink" in res.stdout
    assert (
        scalar(conn, "SELECT count(*) FROM pg_publication WHERE pubname = %s", (db.publication,))
        == 1
    )
    res = run_cli(*args, "--publication-mode", "manage")
    assert res.returncode == 0, res.stderr
    assert f"replication slot {db.slot} did not exist" in res.stdout
    assert f"dropped publication {db.publication}" in res.stdout
