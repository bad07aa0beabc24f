"""server_position() against the real test server."""

from __future__ import annotations

from pg2sink.observability.position import server_position
from tests.conftest import Database


def test_position_of_an_existing_slot(db: Database) -> None:
    conn = db.connect()
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot,))
    conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    conn.execute("INSERT INTO t SELECT generate_series(1, 1000)")
    pos = server_position(conn, db.slot)
    assert pos.active is False  # nobody streams from it
    assert pos.restart_lsn is not None
    # the inserts came after the slot, so the server is ahead of its restart_lsn
    assert pos.restart_lsn < pos.wal_lsn <= db.current_lsn()


def test_position_without_the_slot(db: Database) -> None:
    pos = server_position(db.connect(), "no_such_slot")
    assert pos.restart_lsn is None and pos.active is None
    assert 0 < pos.wal_lsn <= db.current_lsn()
