"""Decoding on a hot standby (PostgreSQL 16+): which server pg2sink writes to, and
waiting for the standby to replay what the primary wrote.

On a standby nothing can be written: the publication, pg2sink's internal schema and the
import jobs live on the primary (--primary), and reach the standby through replication.
The slot, the stream and the imports' reads stay on the standby. What pg2sink wrote on
the primary counts only once the standby has replayed it: a slot created, or an import
snapshot taken, before the standby replays a table's join would miss the rows committed
between the two. docs/high-availability.md has the set-up.
https://www.postgresql.org/docs/current/logicaldecoding-explanation.html#LOGICALDECODING-REPLICATION-SLOTS-SYNCHRONIZATION
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import psycopg
from psycopg.rows import TupleRow

from pg2sink.catalog.server import connect
from pg2sink.errors import ConfigError, ConnectError, ServerConfigError
from pg2sink.sensitive import SecretDsn

log = logging.getLogger(__name__)

#: The first version that decodes on a hot standby.
STANDBY_DECODING_VERSION = 160000
#: How long a standby may take to replay the primary's position before pg2sink gives up
#: on this attempt (a retryable error: the session starts over).
REPLAY_TIMEOUT = 60.0


def in_recovery(conn: psycopg.Connection[TupleRow]) -> bool:
    """Whether the server of `conn` is a standby (pg_is_in_recovery())."""
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def connect_primary(
    standby: psycopg.Connection[TupleRow],
    primary: SecretDsn | None,
    publication: str,
    internal_schema: str,
) -> psycopg.Connection[TupleRow]:
    """The connection pg2sink writes through while --source (`standby`) is in recovery:
    to --primary, checked to be a primary of a version that decodes on a standby."""
    version = standby.info.server_version
    if version < STANDBY_DECODING_VERSION:
        raise ServerConfigError(
            f"--source is a standby of PostgreSQL {version // 10000}: logical decoding on a "
            "standby needs PostgreSQL 16 or newer; point --source at the primary"
        )
    if primary is None:
        raise ConfigError(
            "--source is a hot standby (pg_is_in_recovery() is true), where nothing can be "
            f"written: pass --primary with the primary's connection string, where pg2sink "
            f"keeps publication {publication} and its schema {internal_schema} (the slot, "
            "the stream and the imports' reads stay on the standby)"
        )
    conn = connect(primary, application_name="pg2sink primary")
    try:
        if in_recovery(conn):
            raise ConfigError(
                f"--primary ({primary.redacted()}) is in recovery too: it must be the primary "
                "the standby replicates from"
            )
    except BaseException:
        conn.close()
        raise
    return conn


def warn_without_feedback(standby: psycopg.Connection[TupleRow]) -> None:
    """One WARNING when the standby sends the primary no feedback: the primary's VACUUM
    may then remove catalog rows the standby's slot needs, which invalidates it."""
    row = standby.execute(
        "SELECT current_setting('hot_standby_feedback')::bool,"
        " coalesce(current_setting('primary_slot_name'), '') <> ''"
    ).fetchone()
    if row is not None and not (row[0] and row[1]):
        log.warning(
            "the standby has %s: the primary may remove catalog rows the slot still needs, "
            "and the standby then invalidates the slot (set hot_standby_feedback = on and "
            "primary_slot_name on the standby; docs/high-availability.md)",
            "hot_standby_feedback off" if not row[0] else "no primary_slot_name",
        )


def primary_position(primary: psycopg.Connection[TupleRow]) -> int:
    """The primary's current WAL position: everything committed there so far ends before it."""
    row = primary.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
    assert row is not None
    return int(row[0])


def wait_for_replay(
    standby: psycopg.Connection[TupleRow],
    lsn: int,
    *,
    stop: Callable[[], bool] = lambda: False,
    timeout: float = REPLAY_TIMEOUT,
    poll: float = 0.05,
) -> bool:
    """Wait until `standby` has replayed the WAL up to `lsn`; False if `stop` said so,
    ConnectError (retryable) after `timeout` seconds."""
    started = time.monotonic()
    while True:
        row = standby.execute("SELECT pg_last_wal_replay_lsn() - '0/0'").fetchone()
        replayed = int(row[0]) if row is not None and row[0] is not None else 0
        if replayed >= lsn:
            return True
        if stop():
            return False
        if time.monotonic() - started > timeout:
            raise ConnectError(
                f"the standby has not replayed the primary's WAL for {timeout:.0f}s "
                f"({lsn - replayed} bytes behind): is it replicating from --primary?"
            )
        time.sleep(poll)
