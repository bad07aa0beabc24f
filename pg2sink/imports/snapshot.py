"""The exported snapshot of an import job, and which transactions it sees.

An import reads a table at one snapshot, exported by a session that stays open (idle in
transaction) until the job ends; the planner and every Spark partition import it with
SET TRANSACTION SNAPSHOT, so all of them read the same state
(https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-SNAPSHOT-SYNCHRONIZATION).

`Visibility` answers, for a transaction id read from pgoutput (32 bits), whether its
effects are in that snapshot: the stream's import gate uses it. pg_current_snapshot()
gives 64-bit xid8 values (epoch << 32 | xid), so a 32-bit xid is first widened to the
64-bit value nearest the snapshot's xmax: xids in the stream are never more than 2^31
away from it (PostgreSQL's own wraparound limit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.catalog.server import connect
from pg2sink.config import SecretDsn

log = logging.getLogger(__name__)

_EPOCH = 1 << 32
_HALF = 1 << 31


@dataclass(frozen=True)
class Visibility:
    """A snapshot as pg_current_snapshot() shows it: xmin:xmax:xip (xid8 values)."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Visibility:
        """'748:752:748,750' → Visibility(748, 752, {748, 750})."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def widen(self, xid: int) -> int:
        """The 64-bit xid whose low 32 bits are `xid`, nearest to xmax."""
        full = (self.xmax & ~(_EPOCH - 1)) | (xid & (_EPOCH - 1))
        if full > self.xmax + _HALF:
            full -= _EPOCH
        elif full < self.xmax - _HALF:
            full += _EPOCH
        return full

    def visible(self, xid: int) -> bool:
        """Whether the committed transaction `xid` (32-bit, as pgoutput sends it) is seen."""
        full = self.widen(xid)
        if full < self.xmin:
            return True
        if full >= self.xmax:
            return False
        return full not in self.xip

    def __str__(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(str(x) for x in sorted(self.xip))}"


def current_snapshot(conn: psycopg.Connection[TupleRow]) -> Visibility:
    row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
    assert row is not None
    return Visibility.parse(row[0])


def wait_for_transactions(
    conn: psycopg.Connection[TupleRow],
    *,
    stop: Callable[[], bool] = lambda: False,
    poll: float = 0.05,
) -> bool:
    """Wait until every transaction running now has ended; False if `stop` said so.

    A transaction in flight when a table joined the publication has its changes before
    the join unpublished: only a snapshot taken after it ended contains them."""
    horizon = current_snapshot(conn).xmax
    logged = False
    started = time.monotonic()
    while True:
        row = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()
        assert row is not None
        if int(row[0]) >= horizon:
            return True
        if stop():
            return False
        if not logged and time.monotonic() - started > 5:
            logged = True
            log.info("import waits for transactions older than xid %d to end", horizon)
        time.sleep(poll)


@dataclass
class ExportedSnapshot:
    """An open REPEATABLE READ session that exported its snapshot; close() ends it."""

    conn: psycopg.Connection[TupleRow]
    name: str
    visibility: Visibility
    lsn: int
    """WAL insert position when the snapshot was taken (on a standby: its replay
    position, which no transaction the snapshot misses committed before)."""
    time: datetime
    """Server time when the snapshot was taken."""

    @classmethod
    def open(cls, dsn: SecretDsn) -> ExportedSnapshot:
        conn = connect(dsn, application_name="pg2sink import snapshot")
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            row = conn.execute(
                "SELECT pg_export_snapshot(), pg_current_snapshot()::text, "
                "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
                "ELSE pg_current_wal_insert_lsn() END - '0/0', statement_timestamp()"
            ).fetchone()
            assert row is not None
        except BaseException:
            conn.close()
            raise
        return cls(conn, row[0], Visibility.parse(row[1]), int(row[2]), row[3])

    def close(self) -> None:
        try:
            if not self.conn.closed:
                self.conn.execute("ROLLBACK")
        except psycopg.Error:
            pass
        self.conn.close()


def use_snapshot(conn: psycopg.Connection[TupleRow], name: str) -> None:
    """Start a REPEATABLE READ transaction on `conn` (autocommit) reading snapshot `name`."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name)))
