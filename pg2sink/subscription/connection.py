"""The replication connection: START_REPLICATION and the CopyBoth byte pipe.

This is the only place that touches the replication socket. It speaks
libpq through psycopg's low-level `pgconn` (get_copy_data/put_copy_data):
the pgoutput bytes it returns are decoded elsewhere (pg2sink.logical).
It is the replication loop's FrameSource (subscription.loop).
https://www.postgresql.org/docs/current/protocol-replication.html
"""

from __future__ import annotations

import array
import fcntl
import logging
import select
import termios
import time
from collections.abc import Callable, Sequence
from typing import Final, NoReturn

import psycopg
from psycopg import pq, sql
from psycopg.rows import TupleRow

from pg2sink.errors import ConnectError, SlotBusyError, SourceError
from pg2sink.logical.lsn import format_lsn

log = logging.getLogger(__name__)

#: A wait that ends sooner than this means the server is sending a burst; the next wait
#: then first sleeps this long, or longer while the burst is fast (see
#: ReplicationStream.wait).
COALESCE_SECONDS: Final = 0.001
#: The longest a burst's sleep grows to: the most a change waits in the socket while
#: the server streams at COALESCE_GROW_RATE or more.
COALESCE_MAX_SECONDS: Final = 0.016
#: In a burst, a wait sleeps unless at least this much is already waiting (about what
#: libpq reads at once): reads of a few messages each cost the walsender more than
#: the messages themselves.
COALESCE_READ_BYTES: Final = 16384
#: Bytes per second gathered during a sleep at or above which the next sleep doubles,
#: and below half of which it halves. 2,000 single-row transactions a second send
#: ~0.4 MB/s: such a trickle stays at COALESCE_SECONDS.
COALESCE_GROW_RATE: Final = 2 * 1024 * 1024


class ReplicationStream:
    """A started logical replication stream on a `replication=database` connection."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self.fileno = self.pgconn.socket
        #: FrameSource.get_copy_data: libpq's own bound method, called once per change
        #: without a Python frame around it (see FrameSource)
        self.get_copy_data = self.pgconn.get_copy_data
        #: whether the last wait ended within COALESCE_SECONDS (a burst is coming)
        self._busy = False
        #: how long the next wait in a burst sleeps first (adapted by `_adapt`)
        self._coalesce = COALESCE_SECONDS
        self._queued = array.array("i", [0])
        #: how `wait` sleeps in a burst (a test records the calls instead)
        self.sleep: Callable[[float], None] = time.sleep

    def start(
        self,
        slot: str,
        publication: str,
        start_lsn: int = 0,
        proto_version: int = 1,
        extra_options: Sequence[tuple[str, str]] = (),
        streaming: bool = False,
    ) -> None:
        """Send START_REPLICATION and wait for the server to enter CopyBoth.

        start_lsn 0/0 means "from the slot's confirmed_flush_lsn": the server
        never goes back before it, so a restart resumes exactly there.
        `streaming` asks for in-progress transactions (protocol version 2,
        PostgreSQL 14+; see subscription.in_progress).
        """
        if streaming:
            proto_version = max(proto_version, 2)
            extra_options = [*extra_options, ("streaming", "on")]
        options = [
            ("proto_version", str(proto_version)),
            # publication_names is itself a comma-separated list of identifiers.
            ("publication_names", sql.Identifier(publication).as_string(self.conn)),
            *extra_options,
        ]
        query = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
            sql.Identifier(slot),
            sql.SQL(format_lsn(start_lsn)),
            sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(k), sql.Literal(v)) for k, v in options
            ),
        )
        pgconn = self.pgconn
        pgconn.send_query(query.as_bytes(self.conn))
        self._flush_out()
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            select.select([self.fileno], [], [], 1.0)
        result = pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            message = _result_error(result) or pgconn.get_error_message()
            sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE) if result else None
            if sqlstate == b"55006":  # object_in_use: another walsender has the slot
                # no advice here: only the caller knows whether it waits (--retry-initial)
                raise SlotBusyError(
                    f"replication slot {slot!r} is active in another process ({message})"
                )
            raise SourceError(f"START_REPLICATION failed: {message}")
        log.info(
            "streaming from slot %s, publication %s, start %s",
            slot,
            publication,
            format_lsn(start_lsn),
        )

    def read(self) -> memoryview | None:
        """The next CopyData payload if one is buffered, else None (never blocks)."""
        nbytes, data = self.get_copy_data(1)
        if nbytes > 0:
            return data
        if nbytes == 0:
            return None
        self.ended()

    def ended(self) -> NoReturn:
        """Raise for a get_copy_data result < 0: the copy is over.

        -1: the server ended the copy (e.g. it is shutting down); -2: error.
        """
        result = self.pgconn.get_result()
        message = _result_error(result) or self.pgconn.get_error_message()
        raise ConnectError(f"replication stream ended: {message.strip() or 'server closed it'}")

    def wait(self, timeout: float, extra_fds: Sequence[int] = ()) -> None:
        """Block until the socket (or an extra fd) is readable or `timeout` passes.

        In a burst (the last wait ended within COALESCE_SECONDS) it first sleeps,
        unless a read's worth is already waiting. A loop that keeps up with the
        walsender would otherwise read a few messages at a time: each wake-up costs this
        process a select, a recv and the loop's idle step, and the walsender more than
        the messages themselves (the walsender's CPU falls as the sleep grows:
        `make bench-stream ARGS="--sink null"`). The sleep starts at COALESCE_SECONDS,
        doubles while the server sends at COALESCE_GROW_RATE or more, up to
        COALESCE_MAX_SECONDS, halves as the burst thins, and starts over after a pause:
        a first message after a pause is read as soon as it arrives, and a trickle
        waits at most COALESCE_SECONDS more.
        """
        fds = [self.fileno, *extra_fds]
        # what is already there is read at once: libpq reads a buffer's worth per call
        readable, _, _ = select.select(fds, [], [], 0.0)
        if self._busy and timeout > self._coalesce and readable in ([], [self.fileno]):
            before = self._waiting() if readable else 0
            if before < COALESCE_READ_BYTES:
                self.sleep(self._coalesce)
                timeout -= self._coalesce
                rate = (self._waiting() - before) / self._coalesce
                if rate >= COALESCE_GROW_RATE:
                    self._coalesce = min(self._coalesce * 2, COALESCE_MAX_SECONDS)
                elif rate < COALESCE_GROW_RATE / 2:
                    self._coalesce = max(self._coalesce / 2, COALESCE_SECONDS)
                readable = []
        if not readable:
            started = time.monotonic()
            readable, _, _ = select.select(fds, [], [], max(timeout, 0.0))
            self._busy = time.monotonic() - started < COALESCE_SECONDS
            if not self._busy:
                self._coalesce = COALESCE_SECONDS
        if self.fileno in readable:
            try:
                self.pgconn.consume_input()
            except psycopg.OperationalError as e:
                raise ConnectError(f"replication connection lost: {e}") from None

    def _waiting(self) -> int:
        """Bytes received in the socket and not yet read (FIONREAD)."""
        fcntl.ioctl(self.fileno, termios.FIONREAD, self._queued)
        return self._queued[0]

    def send(self, payload: bytes) -> None:
        """Queue a CopyData message to the server and push it out."""
        if self.pgconn.put_copy_data(payload) != 1:
            raise ConnectError("cannot send to the server: " + self.pgconn.get_error_message())
        self._flush_out()

    def _flush_out(self) -> None:
        while True:
            pending = self.pgconn.flush()
            if pending == 0:
                return
            if pending < 0:
                raise ConnectError(
                    "replication connection lost: " + self.pgconn.get_error_message()
                )
            select.select([self.fileno], [self.fileno], [], 1.0)
            self.pgconn.consume_input()

    def close(self) -> None:
        self.conn.close()


def _result_error(result: pq.abc.PGresult | None) -> str:
    if result is None:
        return ""
    msg = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
    return msg.decode(errors="replace") if msg else ""
