"""The one catalog query the metrics need: the server's WAL position and our slot.

Run on the catalog (non-replication) connection every poll interval; its
result feeds pg2sink_replication_lag_bytes, pg2sink_wal_retained_bytes and
pg2sink_slot_active through StreamStats.set_server_position().
"""

from __future__ import annotations

import psycopg
from psycopg.rows import TupleRow

from pg2sink.observability.stats import ServerPosition

__all__ = ["server_position"]

# A standby has no current WAL insert position; its replay position is where
# its logical slots (PostgreSQL 16+) can go.
# https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADMIN-BACKUP
# restart_lsn is the oldest WAL the slot still needs: the server keeps
# everything from there on (pg_replication_slots,
# https://www.postgresql.org/docs/current/view-pg-replication-slots.html).
_POSITION = """
SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END
         - '0/0'::pg_lsn,
       s.restart_lsn - '0/0'::pg_lsn,
       s.active
  FROM (SELECT 1) AS one
  LEFT JOIN pg_replication_slots AS s ON s.slot_name = %(slot)s
"""


def server_position(conn: psycopg.Connection[TupleRow], slot: str) -> ServerPosition:
    """The server's WAL position and slot `slot`'s restart_lsn and activity.

    restart_lsn and active are None when the slot does not exist.
    """
    row = conn.execute(_POSITION, {"slot": slot}).fetchone()
    assert row is not None  # the LEFT JOIN always yields one row
    wal, restart, active = row
    return ServerPosition(
        wal_lsn=int(wal) if wal is not None else 0,
        restart_lsn=int(restart) if restart is not None else None,
        active=bool(active) if active is not None else None,
    )
