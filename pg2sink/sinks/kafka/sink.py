"""The Kafka sink: one message per Modification, acknowledged contiguously.

Per record:
- Schema: the table's topic is resolved (topics.TopicRouter) and checked once (it must
  exist or be auto-created); in Avro the key and value schemas are registered
  (formats.AvroFormat); with --schema-topic the Schema's JSON line is published there,
  keyed by 'schema.table'.
- Modification: one message to the table's topic, key = the key columns (null for tables
  without a key and for TRUNCATE), headers operation, lsn, xid (UTF-8). With --tombstones
  a DELETE is followed by a null-value message for its key, and an UPDATE that changed the
  key by one for the old key, so log compaction forgets deleted rows. A TRUNCATE carries
  its options in the value (Avro field `truncate`, JSON key `truncate`).
- Message (--messages): the file sink's JSON line, without the newline, to --message-topic
  (default '<prefix>.messages'), keyed by the message's prefix, headers lsn (and xid for a
  transactional message); JSON whatever --format says (docs/changes.md).

Delivery: an idempotent producer (enable.idempotence=true, acks=all; librdkafka retries
and keeps per-partition order) that reports failed deliveries only
(delivery.report.only.error). A checkpoint is acknowledged once the producer is seen
drained with no failure (acks.py: why not a report per message, and when `start_flush()`
drains it); those are the only LSNs the stream confirms to PostgreSQL.

A failed delivery (the broker was away for longer than message.timeout.ms, say) raises
SinkUnavailableError: the service reconnects and PostgreSQL replays from the last
confirmed LSN, so nothing is lost and changes after that LSN may repeat (at-least-once).
The sink then starts over: queued messages are purged (the replay produces them again).
A message that was in flight then and fails later is reported like any failure and
restarts the stream once more: a report cannot tell which stream produced it, and
treating it as a failure can only repeat changes, never lose one.
Errors that retrying cannot fix (message too large, not authorised, an incompatible
schema) raise SinkError and stop the stream with nothing after them confirmed.

Health: whether Kafka is reachable changes only on evidence (health.BrokerHealth: a
delivery or a metadata response, after librdkafka's error_cb reported trouble and a
probe confirmed it), is logged once per change, and reaches GET /status through
`report_health` (the changelog handler passes the stream's StreamStats).

Backpressure: when librdkafka's queue is full (queue.buffering.max.messages / kbytes),
`write` waits (serving the producer) until there is room, so memory stays bounded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pg2sink.changelog.builder import RowWriter, TableShape
from pg2sink.changelog.records import Message as MessageRecord
from pg2sink.changelog.records import Modification, Operation, Record, Schema, Truncation
from pg2sink.errors import ConfigError, SinkError
from pg2sink.formats.jsonenc import dumps
from pg2sink.formats.jsonlines import message_object, schema_line
from pg2sink.formats.kafka import Format, TableFormat
from pg2sink.observability.stats import StreamStats
from pg2sink.sinks.kafka.acks import Checkpoints
from pg2sink.sinks.kafka.config import KafkaConfig, message_format
from pg2sink.sinks.kafka.health import PROBE_WAIT, BrokerHealth
from pg2sink.sinks.kafka.producer import (
    TROUBLE,
    LibrdkafkaLog,
    delivery_error,
    producer_settings,
    reason,
)
from pg2sink.sinks.kafka.topic_check import TopicCheck
from pg2sink.sinks.kafka.topics import TopicRouter, topic_name
from pg2sink.sinks.kafka.txtopic import TransactionTopic

log = logging.getLogger(__name__)

#: Longest wait of flush() for the deliveries of the latest checkpoint, in seconds. Short
#: enough that the replication loop keeps answering PostgreSQL during a broker outage.
FLUSH_WAIT = 1.0
#: start_flush() drains (waits) only when the producer was last seen empty this long ago:
#: a drain stops producing for a round trip, and the stream asks for up to ten flushes a
#: second when it has caught up with the server (a drain at every flush about halves
#: the rate of `make bench-stream ARGS="--sink kafka"`)
DRAIN_AFTER = 1.0
#: One wait for room in a full producer queue, in seconds.
ROOM_WAIT = 0.002
#: Longest wait at close() for messages still in flight, in seconds.
CLOSE_WAIT = 10.0

#: the operation header of each operation
_OPERATION_HEADERS = {op: ("operation", op.value.encode()) for op in Operation}


class KafkaSink:
    """Sink writing records to Kafka; see the module docstring."""

    def __init__(self, cfg: KafkaConfig, fmt: Format | None = None) -> None:
        self.cfg = cfg
        self.router = TopicRouter(cfg.topic_prefix, dict(cfg.topic_map), cfg.fallback_topic)
        self.message_topic = cfg.message_topic or topic_name(cfg.topic_prefix, "messages")
        self._format = fmt
        self.writes_json = cfg.format == "json"
        self._producer: Any = None
        self._tables: dict[tuple[str, str], tuple[str, TableFormat]] = {}
        self._checkpoints = Checkpoints()
        #: incremented with every new producer: the reports of a replaced one are ignored
        self._generation = 0
        self._failure: KafkaError | None = None
        self._failed_topic = ""
        #: key and value bytes of the failed message
        self._failed_size = 0
        self._health = BrokerHealth(cfg.bootstrap_servers)
        self._topics = TopicCheck(cfg.bootstrap_servers, self._health)
        self._reported: set[str] = set()
        #: when the producer was last seen empty (time.monotonic)
        self._last_drained = 0.0
        self._queue_full = False
        #: messages produced, and of them delivered (known at each drain)
        self._produced = 0
        self._delivered = 0
        #: key and value bytes produced since the producer was last seen drained
        #: (pg2sink_raw_buffer_bytes)
        self._queued_bytes = 0
        # the xid header of the last change (headers are copied by produce)
        self._xid: int | None = None
        self._xid_header: tuple[str, bytes] = ("xid", b"")
        self._headers: list[tuple[str, bytes]] = [("operation", b""), ("lsn", b""), ("xid", b"")]
        #: --transaction-topic: BEGIN and END records around each transaction's changes
        self._txtopic = TransactionTopic.of(
            cfg.transaction_topic, self._produce, lambda t: self._topics.check(self._producer, t)
        )

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        """Create the producer (and the registry client); contacts no server yet."""
        if self._format is None:
            self._format = self._make_format()
        self._producer = self._make_producer()
        log.debug("kafka sink producing to %s", self.cfg.bootstrap_servers)

    def _make_format(self) -> Format:
        return message_format(self.cfg)

    def _make_producer(self) -> Any:
        settings: dict[str, Any] = producer_settings(self.cfg)
        if "bootstrap.servers" not in settings:
            raise ConfigError("--sink=kafka needs --kafka-bootstrap-servers")
        settings["error_cb"] = self._on_error
        settings["delivery.report.only.error"] = True  # confluent-kafka's own: a bool
        # failures only (delivery.report.only.error), tagged with this producer's generation
        self._generation += 1
        settings["on_delivery"] = partial(self._on_failure, self._generation)
        settings["logger"] = LibrdkafkaLog()
        try:
            return Producer(settings)
        except (KafkaException, TypeError, ValueError) as e:
            raise ConfigError(f"invalid --kafka-config: {reason(e)}") from None

    def close(self) -> None:
        """Wait (bounded) for messages in flight; what is left is replayed after restart."""
        if self._format is not None:
            self._format.close()
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            left = producer.flush(CLOSE_WAIT)
        except KafkaException as e:
            # a transactional producer's pending end of transaction can fail here (seen
            # once: INVALID_TXN_STATE); nothing after it is confirmed, so closing goes on
            log.warning(
                "Kafka producer at close: %s; what it held is sent again after a restart", reason(e)
            )
            return
        if left:
            log.warning(
                "%d Kafka messages not delivered at close; they are not confirmed and will "
                "be sent again after a restart",
                left,
            )
        if not left:
            self._delivered = self._produced
        log.info("kafka sink closed: %d messages delivered", self._delivered)

    # -- records ---------------------------------------------------------------------

    def write(self, record: Record) -> None:
        if self._failure is not None:
            self._raise_failure()
        if record.__class__ is Modification or record.__class__ is Truncation:
            # every change the row writer (row_writer) does not take: inline rather
            # than a method of its own, a call less per change
            m: Modification = record
            if self._txtopic is not None:
                self._txtopic.change(m)
            entry = self._tables.get((m.namespace, m.name))
            if entry is None:
                raise SinkError(f"change of {m.namespace}.{m.name} before its Schema record")
            topic, table = entry
            # key_row(m), inline: the new row, the old one for DELETE, none for TRUNCATE
            row = m.after
            if row is None and m.operation is Operation.DELETE:
                row = m.before
            key = table.key(row) if row is not None else None
            xid = m.xid
            if xid != self._xid:  # the same for a whole transaction
                self._xid = xid
                self._xid_header = ("xid", str(xid).encode())
            # one list reused for every message: produce() copies the headers
            headers = self._headers
            headers[0] = _OPERATION_HEADERS[m.operation]
            headers[1] = ("lsn", b"%d" % m.lsn)  # str(m.lsn).encode(), a little cheaper
            headers[2] = self._xid_header
            self._produce(topic, key, table.value(m), headers)
            if self.cfg.tombstones:
                self._tombstones(m, topic, table, key, headers)
        elif isinstance(record, MessageRecord):
            self._write_message(record)
        else:
            assert isinstance(record, Schema)
            self._write_schema(record)

    def row_writer(self, table: TableShape) -> RowWriter | None:
        """The writer of this table's new rows (sinks.base.WritesRows): key and value from
        pgoutput's bytes by the format's row encoder, produced as write() would; False
        when it declines a message (write() then gets it); None: no row encoder."""
        entry = self._tables.get((table.namespace, table.name))
        encode = entry[1].row_encoder(table) if entry is not None else None
        if entry is None or encode is None:
            return None
        topic = entry[0]
        produce = self._produce
        headers = self._headers
        # _produce() inline for this sink's own producing (a subclass's _produce decides
        # per message: transactional.py): a Python call less per change; anything
        # produce() refuses (a full queue, an unknown topic...) goes through _produce(),
        # which waits or records the failure, as the refused message was not queued
        inline = type(self)._produce is KafkaSink._produce

        def write(
            data: bytes, commit_time: datetime, sequence: int, lsn: int, xid: int, op: Operation
        ) -> bool:
            if self._failure is not None:
                self._raise_failure()
            encoded = encode(data, commit_time, sequence, lsn, xid, op)
            if encoded is None:
                return False
            if xid != self._xid:  # as in write()
                self._xid = xid
                self._xid_header = ("xid", str(xid).encode())
            headers[0] = _OPERATION_HEADERS[op]
            headers[1] = ("lsn", b"%d" % lsn)
            headers[2] = self._xid_header
            key, value = encoded
            if inline:
                try:
                    # as in _produce(), which counts the same
                    self._producer.produce(topic, value, key, -1, None, None, 0, headers)
                except (BufferError, KafkaException, AttributeError):
                    pass  # (AttributeError: not opened; _produce() says so)
                else:
                    self._produced += 1
                    self._queued_bytes += len(value) + (len(key) if key is not None else 0)
                    return True
            produce(topic, key, value, headers)
            return True

        txtopic = self._txtopic
        return write if txtopic is None else txtopic.wrap(write, table.namespace, table.name)

    def _write_schema(self, s: Schema) -> None:
        topic = self.router.topic(s.namespace, s.name)
        self._topics.check(self._producer, topic)
        assert self._format is not None, "the kafka sink was not opened"
        self._tables[(s.namespace, s.name)] = (topic, self._format.table(s, topic))
        schema_topic = self.cfg.schema_topic
        if schema_topic:
            self._topics.check(self._producer, schema_topic)
            key = f"{s.namespace}.{s.name}".encode()
            self._produce(schema_topic, key, schema_line(s).rstrip(b"\n"), None)

    def _write_message(self, m: MessageRecord) -> None:
        """A logical decoding message: JSON to the message topic, keyed by its prefix."""
        topic = self.message_topic
        self._topics.check(self._producer, topic)
        headers = [("lsn", str(m.lsn).encode())]
        if m.xid is not None:
            headers.append(("xid", str(m.xid).encode()))
        self._produce(topic, m.prefix.encode(), dumps(message_object(m)), headers)

    def _tombstones(
        self,
        m: Modification,
        topic: str,
        table: TableFormat,
        key: bytes | None,
        headers: list[tuple[str, bytes]],
    ) -> None:
        """Null values that let log compaction forget a key that no longer exists."""
        if m.operation is Operation.DELETE:
            dead = key
        elif m.operation is Operation.UPDATE and m.before is not None:
            old = table.key(m.before)
            dead = old if old != key else None
        else:
            return
        if dead is not None:
            self._produce(topic, dead, None, headers)

    # -- producing -------------------------------------------------------------------

    def publish(
        self,
        destination: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[tuple[str, bytes | None]],
        lsn: int,
    ) -> None:
        """An outbox message (base.PublishesMessages) to topic `destination`, checked like
        the sink's own topics, with an `lsn` header (a None header: one without value)."""
        self._topics.check(self._producer, destination)
        all_headers = cast(list[tuple[str, bytes]], [("lsn", b"%d" % lsn), *headers])
        self._produce(destination, key, value, all_headers)

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
    ) -> None:
        producer = self._producer
        if producer is None:
            raise SinkError("the kafka sink was not opened")
        self._produced += 1
        self._queued_bytes += (len(value) if value else 0) + (len(key) if key else 0)
        while True:
            try:
                # positional (topic, value, key, partition, on_delivery, alias, timestamp,
                # headers): cheaper than keywords; -1 = the configured partitioner, no
                # callback of its own (the producer's reports failures), 0 = now
                producer.produce(topic, value, key, -1, None, None, 0, headers)
                return
            except BufferError:
                self._wait_for_room()
            except KafkaException as e:
                # refused at once (too large, unknown topic...): handled as a failed delivery
                self._failure, self._failed_topic = e.args[0], topic
                self._failed_size = (len(value) if value else 0) + (len(key) if key else 0)
                self._raise_failure()

    def _wait_for_room(self) -> None:
        """The producer's queue is full: wait a moment for deliveries to make room.

        Short waits, retried by the caller: librdkafka reports failures only, so nothing
        wakes poll() when a delivery frees room (a long poll() stalls for all its timeout)."""
        if not self._queue_full:
            self._queue_full = True  # logged once until the producer is next seen empty
            log.debug("kafka producer queue full; waiting for deliveries")
        self._producer.poll(ROOM_WAIT)
        if self._failure is not None:
            self._raise_failure()

    # -- librdkafka callbacks (served by poll/flush, on this thread) -----------------

    def _on_failure(self, generation: int, error: KafkaError | None, msg: Message) -> None:
        """A delivery report: failures only (delivery.report.only.error)."""
        if error is None or generation != self._generation:
            return  # (a success all the same) or a report of a replaced producer
        if error.code() == KafkaError._PURGE_QUEUE:
            return  # purged by _restart: the replay produces it again
        if self._failure is None:
            self._failure = error
            self._failed_topic = msg.topic() or ""
            self._failed_size = len(msg.value() or b"") + len(msg.key() or b"")

    def _drained(self) -> bool:
        """Serve the producer's reports; True (and every checkpoint so far acknowledged)
        when nothing is queued or in flight and no delivery failed."""
        producer = self._producer
        producer.poll(0)
        if self._failure is not None:
            self._raise_failure()
        if self._health.probe_due():
            self._probe()
        if len(producer):
            return False
        self._checkpoints.drained()
        self._last_drained = time.monotonic()
        self._queue_full = False
        self._queued_bytes = 0
        if self._produced > self._delivered:
            # messages were delivered: evidence that Kafka answers (an empty queue with
            # nothing produced is none: it is empty while every broker is down)
            self._delivered = self._produced
            self._reported.clear()
            self._health.reached()
        return True

    def _probe(self) -> None:
        """One metadata request (health.py): evidence either way."""
        # a topic already checked keeps the answer small; none asks for every topic
        topic = self._topics.any_checked()
        try:
            self._producer.list_topics(topic, timeout=PROBE_WAIT)
        except KafkaException as e:
            self._health.probe_failed(reason(e))
        else:
            self._health.reached()

    def report_health(self, stats: StreamStats) -> None:
        """Tell `stats` when Kafka becomes unreachable and reachable again (/status)."""
        self._health.report_to(stats)

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            if self._failure is None:
                self._failure = error
            log.error("Kafka producer failed: %s", error.str())
        elif error.code() in TROUBLE:
            self._health.trouble(error.str())
        elif error.str() not in self._reported:
            # once until deliveries succeed again: librdkafka repeats errors while they last
            self._reported.add(error.str())
            log.warning("Kafka: %s", error.str())

    # -- acknowledgement -------------------------------------------------------------

    def checkpoint(self, lsn: int) -> None:
        if self._txtopic is not None:
            self._txtopic.checkpoint(lsn)  # its END record belongs before the checkpoint
        self._checkpoint(lsn)

    def _checkpoint(self, lsn: int) -> None:
        self._checkpoints.checkpoint(lsn)

    def pending_bytes(self) -> int:
        """Key and value bytes produced since the producer was last seen drained."""
        return self._queued_bytes

    def start_flush(self) -> None:
        """Acknowledge the checkpoints if the producer is empty; else drain it (bounded by
        FLUSH_WAIT) when it was last seen empty DRAIN_AFTER ago, unless the broker is known
        to be away."""
        if self._producer is None or self._drained():
            return
        if not self._health.down and time.monotonic() - self._last_drained >= DRAIN_AFTER:
            self._producer.flush(FLUSH_WAIT)
            self._drained()

    def flush(self) -> int | None:
        producer = self._producer
        if producer is None or self._drained():
            return self._checkpoints.acknowledged()
        deadline = time.monotonic() + FLUSH_WAIT
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            producer.flush(min(remaining, 0.1))
            if self._drained():
                break
        return self._checkpoints.acknowledged()

    def acknowledged(self) -> int | None:
        if self._producer is not None:
            self._drained()
        return self._checkpoints.acknowledged()

    # -- failures --------------------------------------------------------------------

    def _raise_failure(self) -> None:
        """Raise the recorded delivery failure after resetting for a replay."""
        error, topic = self._failure, self._failed_topic
        assert error is not None
        self._restart(fatal=error.fatal())
        raise self._error(error, topic)

    def _restart(self, fatal: bool) -> None:
        """Forget this stream's messages: PostgreSQL replays from the confirmed LSN."""
        if self._txtopic is not None:
            self._txtopic.forget()  # the server sends the transaction again
        self._checkpoints = Checkpoints()
        self._queued_bytes = 0
        self._produced = self._delivered  # the purged ones were not
        self._tables.clear()
        self._topics.forget()
        self._failure = None
        if self._producer is not None:
            # queued messages will be produced again by the replay
            self._producer.purge(in_queue=True, in_flight=False, blocking=False)
            if fatal:
                # an idempotent producer that hit a fatal error accepts nothing more
                self._producer = self._make_producer()

    def _error(self, error: KafkaError, topic: str) -> SinkError:
        return delivery_error(error, topic, self._failed_size)
