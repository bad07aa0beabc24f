"""The catalog queries the metrics need: the server's WAL position and our slot's health.

Run on the catalog (non-replication) connection every poll interval; its result feeds
pg2sink_replication_lag_bytes, pg2sink_wal_retained_bytes, pg2sink_slot_active and the
slot-health metrics through StreamStats.set_server_position(). `pg2sink status` reads the
same health (`slot_health`), and the stream refuses an invalidated slot with one line
(`check_slot_valid`).

pg_replication_slots grows by version, so the columns asked for are the server's
(https://www.postgresql.org/docs/current/view-pg-replication-slots.html): `wal_status`
and `safe_wal_size` (13+), `conflicting` (16+: a slot on a standby invalidated by a
recovery conflict), `inactive_since`, `invalidation_reason`, `failover`, `synced` (17+).
Before 17 the reason is inferred: `wal_status = 'lost'` is `wal_removed`, and on 16
`conflicting` is one of `rows_removed` and `wal_level_insufficient` (it does not say
which).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.errors import ServerConfigError
from pg2sink.observability.stats import ServerPosition

__all__ = [
    "SlotHealth",
    "check_slot_valid",
    "invalidated_message",
    "server_position",
    "slot_health",
]

# A standby has no current WAL insert position; its replay position is where
# its logical slots (PostgreSQL 16+) can go.
# https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADMIN-BACKUP
# restart_lsn is the oldest WAL the slot still needs: the server keeps
# everything from there on.
_POSITION = """
SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END
         - '0/0'::pg_lsn,
       s.restart_lsn - '0/0'::pg_lsn,
       s.active
  FROM (SELECT 1) AS one
  LEFT JOIN pg_replication_slots AS s ON s.slot_name = %(slot)s
"""

#: the health columns, by the first version that has them; absent ones read NULL
_HEALTH_COLUMNS: tuple[tuple[str, int], ...] = (
    ("wal_status", 130000),
    ("safe_wal_size", 130000),
    ("conflicting", 160000),
    ("inactive_since", 170000),
    ("invalidation_reason", 170000),
    ("failover", 170000),
    ("synced", 170000),
)


@dataclass(frozen=True)
class SlotHealth:
    """What the server says of the slot's health (None: the server has no such column)."""

    wal_status: str | None
    """reserved, extended, unreserved or lost (WAL the slot needs was removed)."""
    safe_wal_size: int | None
    """Bytes of WAL that can still be written before the slot risks 'lost'
    (max_slot_wal_keep_size); None when unlimited."""
    conflicting: bool | None
    inactive_since: datetime | None
    invalidation_reason: str | None
    """As the server says (17+) or inferred (see the module docstring); None: valid."""
    failover: bool | None
    synced: bool | None

    @property
    def invalidated(self) -> bool:
        return self.invalidation_reason is not None


def slot_health(conn: psycopg.Connection[TupleRow], slot: str) -> SlotHealth | None:
    """The slot's health columns this server has; None when the slot does not exist."""
    version = conn.info.server_version
    columns = [
        sql.Identifier(name) if version >= since else sql.SQL("NULL")
        for name, since in _HEALTH_COLUMNS
    ]
    row = conn.execute(
        sql.SQL(
            "SELECT {}, pg_is_in_recovery() FROM pg_replication_slots WHERE slot_name = %s"
        ).format(sql.SQL(", ").join(columns)),
        (slot,),
    ).fetchone()
    if row is None:
        return None
    wal_status, safe, conflicting, inactive_since, reason, failover, synced, standby = row
    if reason is None and version < 170000:
        # 16's `conflicting` is true for a logical slot invalidated for any reason, and
        # its wal_status reads 'lost' either way: on a primary (no recovery conflicts)
        # the WAL was removed; on a standby a conflict is what invalidates slots
        if conflicting and standby:
            reason = "rows_removed or wal_level_insufficient (conflicting)"
        elif conflicting or wal_status == "lost":
            reason = "wal_removed"
    return SlotHealth(
        wal_status=wal_status,
        safe_wal_size=int(safe) if safe is not None else None,
        conflicting=conflicting,
        inactive_since=inactive_since,
        invalidation_reason=reason,
        failover=failover,
        synced=synced,
    )


#: what each invalidation means, for the line that stops pg2sink
_CAUSES = {
    "wal_removed": "the server removed WAL the slot still needed (max_slot_wal_keep_size)",
    "rows_removed": "a recovery conflict: rows the slot still needed were vacuumed away",
    "wal_level_insufficient": "wal_level on the primary went below logical",
    "idle_timeout": "it was inactive longer than idle_replication_slot_timeout",
}


#: reasons of a conflict with recovery (a slot on a standby; 16 says only `conflicting`)
_CONFLICTS = ("rows_removed", "wal_level_insufficient")


def invalidated_message(slot: str, reason: str) -> str:
    """The one line that stops pg2sink on an invalidated slot: the cause and the way back."""
    if reason.startswith(_CONFLICTS):
        return (
            f"replication slot {slot} was invalidated by a conflict with recovery ({reason}): "
            "the primary removed rows it still needed (a standby needs hot_standby_feedback = "
            "on and primary_slot_name) or its wal_level dropped below logical; the slot can "
            f"never stream again: drop it (pg2sink drop --slot {slot}, with the same --source "
            "and --primary) and start pg2sink again, which re-imports every table"
        )
    cause = _CAUSES.get(reason, reason)
    return (
        f"replication slot {slot} was invalidated by the server ({reason}: {cause}): it can "
        "never stream again and the changes since its confirmed position are lost. Run "
        "pg2sink drop (drops the slot and the publication pg2sink made), then pg2sink "
        "stream, which creates them and imports every table again"
    )


def check_slot_valid(conn: psycopg.Connection[TupleRow], slot: str) -> SlotHealth | None:
    """The slot's health; ServerConfigError (terminal: never a retry loop) when the
    server invalidated it."""
    health = slot_health(conn, slot)
    if health is not None and health.invalidation_reason is not None:
        raise ServerConfigError(invalidated_message(slot, health.invalidation_reason))
    return health


def server_position(conn: psycopg.Connection[TupleRow], slot: str) -> ServerPosition:
    """The server's WAL position and slot `slot`'s restart_lsn, activity and health.

    restart_lsn, active and health are None when the slot does not exist.
    """
    row = conn.execute(_POSITION, {"slot": slot}).fetchone()
    assert row is not None  # the LEFT JOIN always yields one row
    wal, restart, active = row
    health = slot_health(conn, slot) if active is not None else None
    return ServerPosition(
        wal_lsn=int(wal) if wal is not None else 0,
        restart_lsn=int(restart) if restart is not None else None,
        active=bool(active) if active is not None else None,
        wal_status=health.wal_status if health else None,
        safe_wal_size=health.safe_wal_size if health else None,
        inactive_since=(
            health.inactive_since.timestamp() if health and health.inactive_since else None
        ),
        invalidation_reason=health.invalidation_reason if health else None,
    )
