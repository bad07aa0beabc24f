"""The NATS JetStream sink: one message per record, confirmed only once JetStream
acknowledged it and everything before it.

Per record (subjects and message ids: subjects.py; payloads and the subject of each
format: formats/nats.py):
- Modification: the JSON line of the change to `<prefix>.<schema>.<table>` (--format
  wal-listener: its event to `<prefix><schema>_<table>`). With the default --format json
  an Insert's or Update's new row comes through the sink's RowWriter
  (sinks.base.WritesRows) without a Modification record, as in the file sink.
- Schema: its JSON line to `<prefix>.<schema>.<table>.schema` (not with imports' rows:
  the import's driver published it once; not with --format wal-listener, whose subjects
  carry wal-listener's events only). A table subject the stream does not hold is added
  to it first (client.py `cover`).
- Message (--messages): its JSON line to `<prefix>.messages`.
Each message has a Nats-Msg-Id, so JetStream stores a message replayed within the
stream's duplicate window once.

Publishing (client.py) and confirming: the delivery engine's Outbox
(sinks/delivery/outbox.py) hands the loop thread a batch every BATCH messages and at
each flush and acknowledgement check, and confirms a checkpoint once every message
written before it is acknowledged with no gap; JetStream acknowledges each message on a
reply subject of its own, and a failed message holds back every checkpoint after it.

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

from pg2sink.changelog.builder import RowWriter, TableShape
from pg2sink.changelog.records import Message, Modification, Operation, Record, Schema, Truncation
from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.formats.base import Origin
from pg2sink.formats.jsonenc import dumps
from pg2sink.formats.jsonlines import NewRowLines
from pg2sink.formats.nats import JsonPayload, Payload, format_payload
from pg2sink.formats.registry import encoder
from pg2sink.options import format_duration
from pg2sink.sinks.delivery.outbox import Outbox
from pg2sink.sinks.nats.client import Outgoing, Publisher
from pg2sink.sinks.nats.config import NatsConfig, subject_problem
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
#: A change's header block, from its LSN, sequence and subject (subjects.py's id).
_CHANGE_HEADER = b"NATS/1.0\r\nNats-Msg-Id: %d:%d:%s\r\n\r\n"


class _Table:
    """A table's subjects and its key columns, found once per Schema record."""

    __slots__ = ("change_header", "key", "schema_subject", "subject")

    def __init__(self, prefix: str, schema: Schema, payload: Payload) -> None:
        self.subject = table_subject(payload, prefix, schema.namespace, schema.name).encode()
        self.schema_subject = self.subject + b".schema"
        #: a change's header block from its (LSN, sequence): `_CHANGE_HEADER` with the
        #: subject already in (a 2-field formatting per change instead of 3)
        self.change_header = _CHANGE_HEADER.replace(b"%s", self.subject.replace(b"%", b"%%"))
        self.key = tuple(schema.primary_key or schema.schema.get("pg.primary_key") or ())


class NatsSink(Outbox[Outgoing]):
    """Sink publishing records to NATS JetStream; see the module docstring."""

    #: records are written as pg2sink's JSON (relay: a JSON topic's values, in their JSON
    #: form, can be written here as they are)
    writes_json = True

    def __init__(
        self, cfg: NatsConfig, payload: Payload | None = None, *, schemas: bool = True
    ) -> None:
        """`schemas`: publish Schema records (False: only learn the table from them, as
        imports' executors do)."""
        super().__init__(BATCH, MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES)
        self.cfg = cfg
        self._payload = payload or payload_for(cfg)
        self._schemas = schemas and self._payload.schema_records
        #: the format publishes no Schema record where the stream's would: said at open
        self._no_schemas_note = schemas and not self._schemas
        self._publisher: Publisher | None = None
        self._tables: dict[tuple[str, str], _Table] = {}
        self._messages_subject = f"{cfg.nats_subject_prefix}.{MESSAGES}".encode()

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        """Connect and make sure the stream exists; SinkError naming why not."""
        publisher = Publisher(self.cfg)
        try:
            publisher.start()
        except SinkError:
            publisher.stop()
            raise
        self.client = self._publisher = publisher
        if self._no_schemas_note:
            log.info(
                "--format %s: Schema records are not published (its subjects carry the "
                "tool's own events only)",
                self.cfg.format,
            )

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
            left = self.wait_acked(CLOSE_WAIT)
        except SinkError as e:
            log.warning("%s", e)
            left = 0
        finally:
            self.client = self._publisher = None
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
            payload = self._payload.change(m)
            self.put((table.subject, payload, header), len(payload))
        elif isinstance(record, Message):
            subject = self._messages_subject
            payload = self._payload.message(record)
            self.put((subject, payload, _header(record.lsn, subject)), len(payload))
        else:
            assert isinstance(record, Schema)
            table = _Table(self.cfg.nats_subject_prefix, record, self._payload)
            if self._publisher is not None:
                self._publisher.cover(table.subject.decode())
            self._payload.learn(record)
            self._tables[(record.namespace, record.name)] = table
            if self._schemas:
                header = _header(record.lsn, table.schema_subject)
                payload = self._payload.schema(record)
                self.put((table.schema_subject, payload, header), len(payload))

    def row_writer(self, table: TableShape) -> RowWriter | None:
        """The message of each new row of `table` (sinks.base.WritesRows) with the
        default --format json: the row read from pgoutput's bytes straight to its JSON
        values, the message `write` publishes for its Modification, byte for byte. None
        for another --format (its encoder takes records)."""
        known = self._tables.get((table.namespace, table.name))
        if type(self._payload) is not JsonPayload or known is None:
            return None
        read = table.reader(to_json=True)
        encode = NewRowLines(table.namespace, table.name, newline=False).encode
        subject, change_header = known.subject, known.change_header

        def write(
            data: bytes, timestamp: datetime, sequence: int, lsn: int, xid: int, op: Operation
        ) -> bool:
            after = read(data)
            if after is None:
                return False
            payload = encode(timestamp, sequence, lsn, xid, op, after)
            # _put, inlined: this runs once per change (a call is ~2% of its instructions)
            batch = self._batch
            batch.append((subject, payload, change_header % (lsn, sequence)))
            self._written += 1
            self._written_bytes += len(payload)
            if len(batch) >= self._batch_limit:
                self._hand_over()
            return True

        return write

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
        prefix = self.cfg.nats_subject_prefix.removesuffix(".")  # wal-listener's may end in .
        subject = f"{prefix}.{destination}".encode()
        self.put((subject, value, _header(lsn, subject)), len(value))

    # -- acknowledgement (the rest: Outbox) --------------------------------------------

    def flush(self) -> int | None:
        if self._publisher is not None:
            self.wait_acked(FLUSH_WAIT)
        return self.acknowledged()

    def publish_all(self, what: str) -> None:
        """Wait until JetStream acknowledged everything written (imports, which must not
        wait for ever: SinkUnavailableError once the server has been away for longer
        than --nats-ack-timeout, and the partition is tried again)."""
        self.wait_all()
        log.debug("JetStream acknowledged %s", what)

    def waited(self, waiting: int, blocking: bool) -> None:
        """Replaces the connection when messages waited longer than --nats-ack-timeout
        without any acknowledgement on it; and, `blocking` (a wait the stream cannot
        leave: room to write, an import's acknowledgements), raises
        SinkUnavailableError when the server was away that long (the stream cannot go
        on: the sink starts over for PostgreSQL's replay)."""
        publisher = self._publisher
        if publisher is None:
            return
        now, timeout = time.monotonic(), self.cfg.nats_ack_timeout
        away_since = publisher.away_since
        if away_since is None:
            if now - max(publisher.progress_at, self._waiting_since) > timeout:
                publisher.drop_connection()
        elif blocking and now - away_since > timeout:
            log.debug("%d NATS messages wait for a server away", waiting)
            self.restart()
            # the same text every time: the service logs a repeated reason once
            raise SinkUnavailableError(
                f"NATS at {publisher.url} has been unreachable for more than "
                f"--nats-ack-timeout ({format_duration(timeout)}) while pg2sink waited on "
                "it; starting over from the last confirmed position"
            )

    def restart(self) -> None:
        """Also forget the tables: the replay's Schema records come again."""
        super().restart()
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


def payload_for(cfg: NatsConfig) -> Payload:
    """The payload of the config's --format."""
    if cfg.format == "json":
        return JsonPayload()
    f = cfg.formatting
    origin = Origin(f.host, f.database, cfg.nats_subject_prefix)
    return format_payload(cfg.format, encoder(cfg.format, origin, f.debezium_schemas))
