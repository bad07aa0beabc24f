"""The logical replication slot: look up, create (pgoutput) and drop.

The slot is where PostgreSQL remembers how far pg2sink has durably
confirmed; streaming always restarts from its confirmed_flush_lsn.
https://www.postgresql.org/docs/current/logicaldecoding-explanation.html#LOGICALDECODING-REPLICATION-SLOTS
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
from psycopg import pq, sql
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


def ensure_slot(
    conn: psycopg.Connection[TupleRow],
    name: str,
    *,
    failover: bool = False,
    nudge: Callable[[], None] | None = None,
) -> SlotInfo:
    """Return the slot, creating a pgoutput slot when it does not exist.

    `failover`: create it with FAILOVER (PostgreSQL 17+; an existing slot is altered by
    `enable_failover`). `nudge`: called about every second while the slot is being
    created, on a standby: it asks the primary to log its running transactions, which the
    standby's new slot waits for (see `standby_nudge`)."""
    info = get_slot(conn, name)
    dbname = conn.info.dbname
    if info is None:
        create = (
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)"
            if failover
            else "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')"
        )
        try:
            with _nudging(nudge):
                conn.execute(create, (name,))
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
            log.info(
                "created replication slot %s (pgoutput%s)", name, ", failover" if failover else ""
            )
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


#: The first version whose slots can be failover slots (synchronized to a standby).
FAILOVER_VERSION = 170000


def check_failover_server(conn: psycopg.Connection[TupleRow], in_recovery: bool) -> None:
    """ServerConfigError when --slot-failover cannot be honoured by this server."""
    version = conn.info.server_version
    if version < FAILOVER_VERSION:
        raise ServerConfigError(
            f"--slot-failover needs PostgreSQL 17 or newer; the server is "
            f"{version // 10000}: drop --slot-failover (the slot then lives on this "
            "server only)"
        )
    if in_recovery:
        raise ServerConfigError(
            "--slot-failover: a slot created on a standby cannot be a failover slot; "
            "drop --slot-failover, or stream from the primary"
        )


def enable_failover(
    conn: psycopg.Connection[TupleRow], repl: psycopg.Connection[TupleRow], name: str
) -> bool:
    """Turn FAILOVER on for the existing slot `name` (PostgreSQL 17+), read on `conn`,
    through the replication connection `repl` (ALTER_REPLICATION_SLOT is a replication
    command); True when it was off."""
    row = conn.execute(
        "SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (name,)
    ).fetchone()
    if row is None or row[0]:
        return False
    command = sql.SQL("ALTER_REPLICATION_SLOT {} (FAILOVER true)").format(sql.Identifier(name))
    # a replication command runs through the simple query protocol only
    result = repl.pgconn.exec_(command.as_bytes(repl))
    if result.status != pq.ExecStatus.COMMAND_OK:
        message = (result.error_message or b"").decode(errors="replace").strip()
        sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE)
        if sqlstate == b"55006":  # object_in_use
            raise SlotBusyError(f"replication slot {name!r} is active in another process")
        raise ServerConfigError(f"cannot make replication slot {name!r} a failover slot: {message}")
    log.info("replication slot %s is now a failover slot", name)
    return True


def standby_nudge(primary: psycopg.Connection[TupleRow]) -> Callable[[], None]:
    """A `nudge` for ensure_slot on a standby: pg_log_standby_snapshot() on the primary.

    A slot created on a standby waits for the primary's next running-transactions record,
    which the primary writes on its own every 15 s or so (and only when it is not idle).
    Without the function's privilege (superuser by default) the creation just waits."""
    refused: list[str] = []

    def nudge() -> None:
        if refused:
            return
        try:
            primary.execute("SELECT pg_log_standby_snapshot()")
        except psycopg.Error as e:
            refused.append(str(e))
            log.info(
                "creating the slot on the standby waits for the primary's next "
                "running-transactions record (pg_log_standby_snapshot: %s)",
                e.diag.message_primary or type(e).__name__,
            )

    return nudge


@contextlib.contextmanager
def _nudging(nudge: Callable[[], None] | None) -> Iterator[None]:
    """Call `nudge` about every second in a thread while the block runs."""
    if nudge is None:
        yield
        return
    done = threading.Event()

    def loop() -> None:
        while not done.wait(1.0):
            nudge()

    thread = threading.Thread(target=loop, name="pg2sink-slot-nudge", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
