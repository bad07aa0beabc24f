"""The logical replication slot: look up, create (pgoutput) and drop.

The slot is where PostgreSQL remembers how far pg2sink has durably
confirmed; streaming always restarts from its confirmed_flush_lsn.
https://www.postgresql.org/docs/current/logicaldecoding-explanation.html#LOGICALDECODING-REPLICATION-SLOTS
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg.rows import TupleRow

from pg2sink.errors import ConfigError, ServerConfigError, SlotBusyError
from pg2sink.logical.lsn import parse_lsn

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SlotInfo:
    name: str
    plugin: str | None
    database: str | None
    active: bool
    active_pid: int | None
    confirmed_flush_lsn: int | None
    restart_lsn: int | None


def get_slot(conn: psycopg.Connection[TupleRow], name: str) -> SlotInfo | None:
    row = conn.execute(
        "SELECT slot_name, plugin, database, active, active_pid,"
        " confirmed_flush_lsn::text, restart_lsn::text"
        " FROM pg_replication_slots WHERE slot_name = %s",
        (name,),
    ).fetchone()
    if row is None:
        return None
    return SlotInfo(
        name=row[0],
        plugin=row[1],
        database=row[2],
        active=row[3],
        active_pid=row[4],
        confirmed_flush_lsn=parse_lsn(row[5]) if row[5] else None,
        restart_lsn=parse_lsn(row[6]) if row[6] else None,
    )


def ensure_slot(conn: psycopg.Connection[TupleRow], name: str) -> SlotInfo:
    """Return the slot, creating a pgoutput slot when it does not exist."""
    info = get_slot(conn, name)
    dbname = conn.info.dbname
    if info is None:
        try:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        except psycopg.errors.DuplicateObject:
            pass  # another instance created it between our check and now
        except psycopg.errors.InsufficientPrivilege as e:
            raise ServerConfigError(
                f"cannot create replication slot {name!r}: {e.diag.message_primary}. "
                "Grant the role REPLICATION (ALTER ROLE ... REPLICATION)"
            ) from None
        except psycopg.errors.ObjectNotInPrerequisiteState as e:
            raise ServerConfigError(
                f"cannot create replication slot {name!r}: {e.diag.message_primary}"
            ) from None
        else:
            log.info("created replication slot %s (pgoutput)", name)
        info = get_slot(conn, name)
        assert info is not None
    if info.plugin != "pgoutput":
        raise ServerConfigError(
            f"replication slot {name!r} uses plugin {info.plugin!r}, not pgoutput: "
            "pick another --slot or drop it with pg2sink drop"
        )
    if info.database != dbname:
        raise ServerConfigError(
            f"replication slot {name!r} belongs to database {info.database!r}, "
            f"not {dbname!r}: pick another --slot"
        )
    return info


def check_slot_database(conn: psycopg.Connection[TupleRow], name: str) -> SlotInfo | None:
    """The slot if it exists; ConfigError when it is not a slot of the connected database.

    Slot names are cluster-wide, so `--slot x` with the wrong `--source` would otherwise
    reach (and drop) another database's slot."""
    info = get_slot(conn, name)
    dbname = conn.info.dbname
    if info is not None and info.database != dbname:
        owner = f"database {info.database!r}" if info.database else "no database (a physical slot)"
        raise ConfigError(
            f"replication slot {name!r} belongs to {owner}, not {dbname!r}: nothing dropped; "
            "connect --source to its database, or pick another --slot"
        )
    return info


def drop_slot(conn: psycopg.Connection[TupleRow], name: str) -> bool:
    """Drop the slot of the connected database; False when it did not exist, ConfigError
    when it belongs to another database, SlotBusyError while it is in use."""
    info = check_slot_database(conn, name)
    if info is None:
        return False
    if info.active:
        raise SlotBusyError(
            f"replication slot {name!r} is in use by process {info.active_pid}: "
            "stop the pg2sink streaming from it first"
        )
    try:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    except psycopg.errors.ObjectInUse as e:
        raise SlotBusyError(f"replication slot {name!r}: {e.diag.message_primary}") from None
    except psycopg.errors.UndefinedObject:
        return False
    return True
