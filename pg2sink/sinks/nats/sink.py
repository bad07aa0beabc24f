"""The NATS JetStream sink: one message per record, confirmed only once JetStream
acknowledged it and everything before it.

Per record (subjects and message ids: subjects.py; payloads: payload.py):
- Modification: the JSON line of the change to `<prefix>.<schema>.<table>`. With the
  default --format json an Insert's or Update's new row comes through `write_new_row`
  (sinks.base.WritesNewRows) without a Modification record, as in the file sink.
- Schema: its JSON line to `<prefix>.<schema>.<table>.schema` (not with imports' rows:
  the import's driver published it once).
- Message (--messages): its JSON line to `<prefix>.messages`.
Each message has a Nats-Msg-Id, so JetStream stores a message replayed within the
stream's duplicate window once.

Publishing (client.py): `write` appends the message to a batch, handed to the loop
thread every BATCH messages and at each flush and acknowledgement check;
JetStream acknowledges each message on a reply subject of its own. The sink counts the
messages it wrote and the delivery engine's Window (sinks/delivery) remembers, per
checkpoint, how many came before it: a checkpoint is acknowledged once that many
messages are acknowledged with no gap, so `acknowledged()` is the highest checkpoint
whose every message JetStream stored, and a failed message holds back every checkpoint
after it.

Failures: a JetStream error (no stream holds the subject, a refused message) raises
SinkError, and nothing after the message is confirmed. A lost connection does not stop
the stream: the loop connects again and sends again, in order, what was not
acknowledged (client.py); confirmations pause meanwhile. Messages waiting longer than
--nats-ack-timeout on a connection that seems alive (a frozen server) make the loop
replace the connection the same way. Only when the server stays away for longer than
--nats-ack-timeout while `write` waits for room does the sink raise
SinkUnavailableError: the service reconnects to PostgreSQL, which replays from the last
confirmed position, and the sink starts a new generation. Repeats are dropped by
JetStream within its duplicate window (at-least-once; once within the window).

Health: from the moment the connection is lost until it is back, GET /status answers
500 and pg2sink_sink_healthy is 0 (`report_health`; client.py's Outages).

Backpressure: at most MAX_IN_FLIGHT messages and MAX_IN_FLIGHT_BYTES of payload wait
for their acknowledgement; `write` waits for room beyond that, so memory stays bounded
while the server is slow or away.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from pg2sink.changelog.jsonenc import dumps
from pg2sink.changelog.jsonlines import NewRowLines
from pg2sink.changelog.records import Message, Modification, Operation, Record, Schema, Truncation
from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.options import format_duration
from pg2sink.sinks.delivery import Window
from pg2sink.sinks.nats.client import Outgoing, Publisher
from pg2sink.sinks.nats.config import NatsConfig, subject_problem
from pg2sink.sinks.nats.payload import JsonPayload, Payload, payload_for
from pg2sink.sinks.nats.subjects import MESSAGES, table_subject
from pg2sink.sinks.nats.wire import NO_HEADERS, msg_id_header

if TYPE_CHECKING:
    from pg2sink.observability.stats import StreamStats

log = logging.getLogger(__name__)

__all__ = ["NatsSink"]

#: Messages gathered before they are handed to the loop thread in one call.
BATCH = 256
#: Messages published and not yet acknowledged at most; `write` waits beyond.
MAX_IN_FLIGHT = 20_000
#: Payload bytes published and not yet acknowledged at most (the loop keeps them to
#: send again after an outage); `write` waits beyond.
MAX_IN_FLIGHT_BYTES = 64 << 20
#: Longest wait of flush() for acknowledgements, in seconds: short enough that the
#: replication loop keeps answering PostgreSQL while the server is away.
FLUSH_WAIT = 1.0
#: Longest wait at close() for the acknowledgements of what was written.
CLOSE_WAIT = 10.0
#: One wait for acknowledgements, in seconds.
_POLL = 0.001
#: A change's header block, from its LSN, sequence and subject (subjects.py's id).
_CHANGE_HEADER = b"NATS/1.0\r\nNats-Msg-Id: %d:%d:%s\r\n\r\n"


class _Table:
    """A table's subjects and its key columns, found once per Schema record."""

    __slots__ = ("change_header", "key", "schema_subject", "subject")

    def __init__(self, prefix: str, schema: Schema) -> None:
        self.subject = table_subject(prefix, schema.namespace, schema.name).encode()
        self.schema_subject = self.subject + b".schema"
        #: a change's header block from its (LSN, sequence): `_CHANGE_HEADER` with the
        #: subject already in (a 2-field formatting per change instead of 3)
        self.change_header = _CHANGE_HEADER.replace(b"%s", self.subject.replace(b"%", b"%%"))
        self.key = tuple(schema.primary_key or schema.schema.get("pg.primary_key") or ())


class NatsSink:
    """Sink publishing records to NATS JetStream; see the module docstring."""

    def __init__(
        self, cfg: NatsConfig, payload: Payload | None = None, *, schemas: bool = True
    ) -> None:
        """`schemas`: publish Schema records (False: only learn the table from them, as
        imports' executors do)."""
        self.cfg = cfg
        self._payload = payload or payload_for(cfg)
        self.json_values = self._payload.json_values
        self._schemas = schemas
        self._publisher: Publisher | None = None
        self._tables: dict[tuple[str, str], _Table] = {}
        self._messages_subject = f"{cfg.nats_subject_prefix}.{MESSAGES}".encode()
        #: the generation, the checkpoints and the in-flight bound
        self._window = Window(MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES)
        self._batch: list[Outgoing] = []
        #: the batch's length at which `_put` hands it over and checks for room: BATCH,
        #: or 1 after a batch was handed over early with no room left (see _submit)
        self._batch_limit = BATCH
        #: messages written in this generation, and their bytes
        self._written = 0
        self._written_bytes = 0
        #: (messages written before it, lsn) of the checkpoints not yet taken into the
        #: window (taken at each acknowledgement check: a commit of one change each costs
        #: an append, not a call)
        self._noted: list[tuple[int, int]] = []
        #: when the oldest message still waiting was handed over, if nothing waited then
        self._waiting_since = 0.0
        #: the JSON payloads of changes given by their fields (write_new_row), when the
        #: payload is pg2sink's JSON
        self._lines = NewRowLines(newline=False) if type(self._payload) is JsonPayload else None

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        """Connect and make sure the stream exists; SinkError naming why not."""
        publisher = Publisher(self.cfg)
        try:
            publisher.start()
        except SinkError:
            publisher.stop()
            raise
        self._publisher = publisher

    def report_health(self, stats: StreamStats) -> None:
        """Tell `stats` when the connection to NATS is lost and when it is back (GET
        /status, pg2sink_sink_healthy)."""
        if self._publisher is not None:
            self._publisher.outages.report_to(stats.sink_outage)

    def close(self) -> None:
        """Wait (bounded) for the acknowledgements of what was written, then disconnect;
        what is not acknowledged is not confirmed and comes again after a restart."""
        publisher = self._publisher
        if publisher is None:
            return
        try:
            left = self._wait_acked(CLOSE_WAIT)
        except SinkError as e:
            log.warning("%s", e)
            left = 0
        finally:
            self._publisher = None
            publisher.stop()
        if left:
            log.warning(
                "%d NATS messages not acknowledged at close; they are not confirmed and "
                "will be sent again after a restart",
                left,
            )
        log.info("nats sink closed")

    # -- records ---------------------------------------------------------------------

    def write(self, record: Record) -> None:
        cls = record.__class__
        if cls is Modification or cls is Truncation:
            m: Modification = record  # type: ignore[assignment]
            table = self._tables.get((m.namespace, m.name))
            if table is None:
                raise SinkError(f"change of {m.namespace}.{m.name} before its Schema record")
            if m.operation is Operation.IMPORT:
                header = _import_header(m, table)
            else:
                header = table.change_header % (m.lsn, m.sequence)
            self._put(table.subject, self._payload.change(m), header)
        elif isinstance(record, Message):
            subject = self._messages_subject
            self._put(subject, self._payload.message(record), _header(record.lsn, subject))
        else:
            assert isinstance(record, Schema)
            table = _Table(self.cfg.nats_subject_prefix, record)
            self._payload.learn(record)
            self._tables[(record.namespace, record.name)] = table
            if self._schemas:
                header = _header(record.lsn, table.schema_subject)
                self._put(table.schema_subject, self._payload.schema(record), header)

    def write_new_row(
        self,
        timestamp: datetime,
        sequence: int,
        lsn: int,
        xid: int,
        operation: Operation,
        namespace: str,
        name: str,
        after: dict[str, object] | None,
        before: dict[str, object] | None = None,
    ) -> None:
        """`write(Modification(timestamp, ..., name, before, after))` without the record:
        the changelog's fast path calls this for each Insert and Update (ChangelogBuilder's
        `emit_new_row`); the same message `write` publishes, byte for byte."""
        lines = self._lines
        table = self._tables.get((namespace, name))
        if lines is None or table is None or operation is Operation.IMPORT:
            # another --format, or what `write` reports or treats apart
            m = Modification(
                timestamp, sequence, lsn, xid, operation, namespace, name, before, after
            )
            self.write(m)
            return
        payload = lines.encode(
            timestamp, sequence, lsn, xid, operation, namespace, name, after, before
        )
        # _put, inlined: this runs once per change (a call is ~2% of its instructions)
        batch = self._batch
        batch.append((table.subject, payload, table.change_header % (lsn, sequence)))
        self._written += 1
        self._written_bytes += len(payload)
        if len(batch) >= self._batch_limit:
            self._hand_over()

    def publish(
        self,
        destination: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[tuple[str, bytes | None]],
        lsn: int,
    ) -> None:
        """An outbox message (base.PublishesMessages): to the subject `<prefix>.<destination>`
        (inside the sink's stream), Nats-Msg-Id `<lsn>:<subject>`; NATS messages have no
        key, and headers are refused at start (routing/outbox.check_sink). A destination
        that is no subject (empty tokens, spaces, wildcards) is an error: NATS would end
        the connection on it."""
        problem = subject_problem(destination)
        if problem:
            raise SinkError(f"outbox destination {destination!r} at LSN {lsn}: {problem}")
        subject = f"{self.cfg.nats_subject_prefix}.{destination}".encode()
        self._put(subject, value, _header(lsn, subject))

    def _put(self, subject: bytes, payload: bytes, header: bytes) -> None:
        batch = self._batch
        batch.append((subject, payload, header))
        self._written += 1
        self._written_bytes += len(payload)
        if len(batch) >= self._batch_limit:
            self._hand_over()

    def _hand_over(self) -> None:
        """The batch is full: hand it over, and wait while there is no room."""
        self._submit()
        if self._no_room():
            self._wait_for_room()

    def _submit(self) -> None:
        """Hand the batch to the loop thread."""
        if not self._batch:
            return
        publisher = self._publisher
        if publisher is None:
            raise SinkError("the nats sink was not opened")
        if self._acked_count() == self._written - len(self._batch):
            self._waiting_since = time.monotonic()  # nothing waited: the clock starts
        early = len(self._batch) < self._batch_limit
        publisher.submit(self._window.generation, self._batch)
        self._batch = []
        # A batch handed over before it filled (the stream asked for acknowledgements or
        # a flush: once per small transaction when pg2sink keeps up) skipped _put's room
        # check: with no room, the next message checks (else the messages in flight grow
        # past MAX_IN_FLIGHT on a stream of single-row transactions, and memory with
        # them: `make bench-stream ARGS="--sink nats"`).
        self._batch_limit = 1 if early and self._no_room() else BATCH

    def _no_room(self) -> bool:
        """Whether MAX_IN_FLIGHT messages or MAX_IN_FLIGHT_BYTES wait for JetStream."""
        publisher = self._publisher
        if publisher is None:
            return False
        return self._window.full(self._written, self._written_bytes, publisher.acked)

    def _wait_for_room(self) -> None:
        """Too much waits for acknowledgements: wait until there is room again (a server
        away for longer than --nats-ack-timeout ends the wait with SinkUnavailableError)."""
        log.debug("%d NATS messages wait for acknowledgement; waiting", self._written)
        while self._no_room():
            self._check(blocking=True)
            time.sleep(_POLL)

    # -- acknowledgement -------------------------------------------------------------

    def checkpoint(self, lsn: int) -> None:
        self._noted.append((self._written, lsn))
        # Not handed over here: a commit of one change each would wake the loop thread,
        # and write to the socket, once per message. The batch goes at BATCH messages,
        # or when the stream asks for acknowledgements or a flush (each time it has
        # caught up with the server, and every 512 messages while a flush is pending).

    def start_flush(self) -> None:
        self._submit()
        self._check()

    def pending_bytes(self) -> int:
        """Payload bytes written and not yet acknowledged."""
        return self._written_bytes - self._acked()[1]

    def acknowledged(self) -> int | None:
        self._submit()
        acked = self._check()
        window = self._window
        window.take(self._noted)
        return window.acknowledged(acked)

    def flush(self) -> int | None:
        if self._publisher is not None:
            self._wait_acked(FLUSH_WAIT)
        return self.acknowledged()

    def _wait_acked(self, seconds: float) -> int:
        """Submit, then wait up to `seconds` until everything written is acknowledged;
        the number of messages still waiting."""
        self._submit()
        deadline = time.monotonic() + seconds
        while (left := self._written - self._check()) and time.monotonic() < deadline:
            time.sleep(_POLL)
        return left

    def publish_all(self, what: str) -> None:
        """Wait until JetStream acknowledged everything written (imports, which must not
        wait for ever: SinkUnavailableError once the server has been away for longer
        than --nats-ack-timeout, and the partition is tried again)."""
        self._submit()
        while self._written > self._check(blocking=True):
            time.sleep(_POLL)
        log.debug("JetStream acknowledged %s", what)

    def _acked(self) -> tuple[int, int]:
        """Messages of this generation acknowledged with no gap before them, and their
        payload bytes."""
        publisher = self._publisher
        return (0, 0) if publisher is None else self._window.own(publisher.acked)

    def _acked_count(self) -> int:
        return self._acked()[0]

    def _check(self, *, blocking: bool = False) -> int:
        """The acknowledged count. Raises the failure of this generation; replaces the
        connection when messages waited longer than --nats-ack-timeout without any
        acknowledgement on it; and, `blocking` (a wait the stream cannot leave: room to
        write, an import's acknowledgements), raises SinkUnavailableError when the
        server was away that long (the stream cannot go on: the sink starts over for
        PostgreSQL's replay)."""
        publisher = self._publisher
        if publisher is None:
            return 0
        failure = publisher.failure
        if failure is not None and failure[0] == self._window.generation:
            self._restart()
            raise failure[1]
        acked = self._acked_count()
        if acked == self._written or self._batch:
            return acked
        now, timeout = time.monotonic(), self.cfg.nats_ack_timeout
        away_since = publisher.away_since
        if away_since is None:
            if now - max(publisher.progress_at, self._waiting_since) > timeout:
                publisher.drop_connection()
        elif blocking and now - away_since > timeout:
            log.debug("%d NATS messages wait for a server away", self._written - acked)
            self._restart()
            # the same text every time: the service logs a repeated reason once
            raise SinkUnavailableError(
                f"NATS at {publisher.url} has been unreachable for more than "
                f"--nats-ack-timeout ({format_duration(timeout)}) while pg2sink waited on "
                "it; starting over from the last confirmed position"
            )
        return acked

    def _restart(self) -> None:
        """Forget this generation's messages: PostgreSQL replays from the last confirmed
        position (whose Schema records come again, hence the tables too)."""
        self._window.restart()
        self._noted.clear()
        self._batch = []
        self._batch_limit = BATCH
        self._written = self._written_bytes = 0
        self._tables.clear()


def _header(lsn: int, subject: bytes) -> bytes:
    """The header block of a Schema record, a message or an outbox message: Nats-Msg-Id
    `<lsn>:<subject>` (subjects.py)."""
    return msg_id_header(b"%d:%s" % (lsn, subject))


def _import_header(m: Modification, table: _Table) -> bytes:
    """An imported row's header block: Nats-Msg-Id `import:<lsn>:<subject>:<key>`, the
    snapshot's position and the row's key (subjects.py); none for a table without a
    primary key."""
    if not table.key or m.after is None:
        return NO_HEADERS
    key = dumps({c: m.after.get(c) for c in table.key})
    return msg_id_header(b"import:%d:%s:%s" % (m.lsn, table.subject, key))
