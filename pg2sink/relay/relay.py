"""The relay's loop: a batch of messages into the sink, then its offsets committed.

Per batch (at most --relay-batch-size messages, or what arrived within POLL_WAIT):

1. each message's value is decoded: Avro (decode.Shape, its writer schema from the
   registry), the first change of a table shape preceded by the shape's Schema record, so
   the sink creates or evolves the table before its rows; or JSON (decode.record_of),
   the first change of a table preceded by its latest Schema record in the schema topic
   (schemas.read_schema_topic; one consumed is written before its table's next
   change); or a psql-streamer event (psql_streamer.py), its table's Schema record made
   from its events; each table named by names.TableNames (a table of a second topic
   stops the relay unless --relay-schema-prefix names it after its topic); tombstones
   (null values) are skipped; a message that cannot be read (decode.UnreadableError)
   stops the relay with its topic, partition and offset, or goes to
   --relay-dead-letter-topic (deadletter.py);
2. a checkpoint follows every source transaction (a change of topic or xid, or a
   sequence that does not grow), and the batch's end;
3. the sink is flushed until it has acknowledged the batch's last checkpoint, and the
   dead-letter topic until it has acknowledged the batch's dead letters;
4. only then the consumer's offsets (each partition's next message) are committed.

The relay reports to a StreamStats as the stream does (its HTTP API and /metrics,
commands/relay.py): "replication" is the Kafka consumer, changes are counted per table,
dead letters as errors of kind `dead_letter`.

A crash before 4 leaves the offsets where they were: the batch is consumed and written
again (at-least-once). Nothing is committed that the sink does not durably hold.

Checkpoints are not the records' LSNs: a sink keeps checkpoints as a growing mark (the
Kafka sink acknowledges the highest one drained, the DuckDB sink drops a transaction
whose checkpoint is not above what its file holds), and consumed LSNs do not grow: the
sources' LSNs are unrelated, and even one source's changes come in commit order across
partitions and topics, not in LSN order. `Marks` gives strictly growing numbers instead,
microseconds since the epoch, which also grow over restarts of the relay (unless the
clock goes back), so a sink never takes a new batch for one it holds already.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as KafkaMessage

from pg2sink.changelog.records import Modification, Schema
from pg2sink.errors import ConfigError, SinkError, SinkUnavailableError
from pg2sink.formats.jsonenc import loads
from pg2sink.observability.stats import StreamStats
from pg2sink.relay.config import RelayConfig
from pg2sink.relay.deadletter import DeadLetters
from pg2sink.relay.decode import Shape, UnreadableError, record_of, schema_id
from pg2sink.relay.names import TableNames
from pg2sink.relay.offsets import OffsetRows, stored_offsets
from pg2sink.relay.psql_streamer import EventTables, is_event
from pg2sink.relay.schemas import Shapes, read_schema_topic
from pg2sink.sinks.base import ReportsHealth, Sink, UsesSlot
from pg2sink.subscription.loop import StopRequested

log = logging.getLogger(__name__)

R = TypeVar("R", Schema, Modification)

__all__ = ["Marks", "Relay", "consumer_settings"]

#: longest wait of one consume() call, in seconds (a stop request is seen within it)
POLL_WAIT = 0.5
#: longest wait for the sink to acknowledge a batch, in seconds; then the relay stops
#: with the batch's offsets uncommitted
ACK_WAIT = 60.0
#: how often the consumer looks for new topics matching --topics (librdkafka's default,
#: five minutes, would leave a new table's topic unread that long)
METADATA_REFRESH_MS = "10000"


class Marks:
    """Strictly growing checkpoints: microseconds since the epoch, one more than the last
    when the clock has not moved on."""

    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        """The next checkpoint."""
        self.last = max(self.last + 1, time.time_ns() // 1000)
        return self.last


def consumer_settings(cfg: RelayConfig) -> dict[str, str]:
    """librdkafka's settings: the user's, then those the relay needs (it commits
    itself, after the sink acknowledged)."""
    settings = {
        "client.id": "pg2sink-relay",
        "auto.offset.reset": "earliest",
        "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
        **cfg.relay_consumer.reveal(),
    }
    settings.update(
        {
            "bootstrap.servers": cfg.relay_bootstrap_servers,
            "group.id": cfg.relay_group_id,
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
        }
    )
    return settings


class Relay:
    """Consumes pg2sink's topics into `sink`; see the module docstring."""

    def __init__(
        self,
        cfg: RelayConfig,
        sink: Sink,
        shapes: Shapes | None,
        stats: StreamStats | None = None,
    ) -> None:
        self.cfg = cfg
        self.sink = sink
        self.shapes = shapes
        self.stats = StreamStats() if stats is None else stats
        #: psql-streamer's tables, learnt from their events
        self.events = EventTables(dict(cfg.relay_primary_key))
        #: --relay-dead-letter-topic's producer (None: an unreadable message stops)
        self.dead_letters: DeadLetters | None = None
        self.marks = Marks()
        self.relayed = 0
        #: the shape each table's Schema record was last written with (Avro)
        self._shapes: dict[tuple[str, str], Shape] = {}
        #: JSON: each table's latest Schema record known, and those written
        self._schemas: dict[tuple[str, str], Schema] = {}
        #: (topic, schema, table) of the tables whose latest Schema record is written
        self._written: set[tuple[str, str, str]] = set()
        self.names = TableNames(cfg.relay_schema_prefix)
        #: --relay-exactly-once: the DuckDB file keeping the offsets (offsets.py)
        self.offsets_file: Path | None = None
        self._offset_rows = OffsetRows(cfg.relay_group_id)
        #: the next offset of each partition consumed since the last checkpoint
        self._pending: dict[tuple[str, int], int] = {}
        #: the offsets the file held at start
        self._stored: dict[tuple[str, int], int] = {}
        #: (topic, xid, sequence) of the last change written
        self._last: tuple[str, int, int] | None = None
        self._consumer: Consumer | None = None

    def run(self, stop: StopRequested) -> None:
        """Relay until `stop` is requested (SIGINT, SIGTERM); the batch under way is
        finished first."""
        if isinstance(self.sink, UsesSlot):
            # the DuckDB sink's row in pg2sink_state: one per consumer group
            self.sink.use_slot(f"relay.{self.cfg.relay_group_id}")
        try:
            consumer = Consumer(consumer_settings(self.cfg))
        except (KafkaException, TypeError, ValueError) as e:
            raise ConfigError(f"invalid --relay-kafka-config: {e}") from None
        self._consumer = consumer
        if isinstance(self.sink, ReportsHealth):
            self.sink.report_health(self.stats)
        try:
            if self.cfg.relay_dead_letter_topic:
                settings = {"bootstrap.servers": self.cfg.relay_bootstrap_servers}
                settings.update(self.cfg.relay_consumer.reveal())
                self.dead_letters = DeadLetters(settings, self.cfg.relay_dead_letter_topic)
            if self.offsets_file is not None:
                self._stored = stored_offsets(self.offsets_file, self.cfg.relay_group_id)
            self.sink.open()
            self.stats.sink_up()
            # librdkafka takes a topic starting with ^ as a regular expression
            topics = [f"^({self.cfg.relay_topics})$"]
            if self.offsets_file is not None:  # each partition from the file's offset
                consumer.subscribe(topics, on_assign=self._on_assign)
            else:
                consumer.subscribe(topics)
            log.info(
                "pg2sink relay is relaying topics %r from %s (group %s)",
                self.cfg.relay_topics,
                self.cfg.relay_bootstrap_servers,
                self.cfg.relay_group_id,
            )
            self.stats.replication_up()
            while not stop.requested:
                batch = consumer.consume(self.cfg.relay_batch_size, POLL_WAIT)
                if batch:
                    self._relay(batch)
        except SinkError as e:
            self.stats.sink_down(str(e))
            raise
        finally:
            try:
                self.sink.close()
            finally:
                consumer.close()
                if self.shapes is not None:
                    self.shapes.close()
                log.info("pg2sink relay stopped: %d changes relayed", self.relayed)

    def _relay(self, batch: list[KafkaMessage]) -> None:
        """One batch: written, acknowledged by the sink, then its offsets committed."""
        offsets: dict[tuple[str, int], int] = {}
        for msg in batch:
            error = msg.error()
            if error is not None:
                self._consumer_error(error)
                continue
            topic, value = msg.topic() or "", msg.value()
            if value is not None:  # a tombstone (--tombstones) repeats its DELETE's key
                try:
                    self._write(topic, value)
                except UnreadableError as e:
                    self._unreadable(msg, e)
            # after the write: a checkpoint it put before its change covers those before
            offsets[topic, msg.partition() or 0] = (msg.offset() or 0) + 1
            self._pending[topic, msg.partition() or 0] = (msg.offset() or 0) + 1
        if not self.stats.replication_connected:
            self.stats.replication_up()
        mark = self._checkpoint()
        started = time.monotonic()
        self._wait_for(mark)
        if self.dead_letters is not None:
            self.dead_letters.flush(ACK_WAIT)
        self.stats.observe_flush(time.monotonic() - started, len(batch))
        self._commit(offsets)
        log.debug("relayed %d messages; offsets committed", len(batch))

    def _unreadable(self, msg: KafkaMessage, error: UnreadableError) -> None:
        """A message that cannot be read: a dead letter, or the relay stops."""
        where = f"topic {msg.topic()!r} [{msg.partition()}] at offset {msg.offset()}"
        if self.dead_letters is None:
            raise SinkError(
                f"cannot read the message of {where}: {error} (--relay-dead-letter-topic "
                "sets such messages aside instead of stopping)"
            )
        self.dead_letters.put(msg, str(error))
        self.stats.count_error("dead_letter")
        log.warning(
            "the message of %s goes to dead-letter topic %r: %s",
            where,
            self.dead_letters.topic,
            error,
        )

    def _counted(self, m: Modification) -> None:
        """Write change `m` and count it."""
        self.sink.write(m)
        self.stats.table_changes(m.namespace, m.name)[m.operation] += 1
        self.relayed += 1

    def _write(self, topic: str, value: bytes) -> None:
        """One message's change, after its transaction's checkpoint and its shape's
        Schema record when they are due."""
        sid = schema_id(value)
        if sid is None:
            try:
                obj = loads(value)
            except ValueError as e:
                raise UnreadableError(f"a message is neither Avro nor JSON: {e}") from None
            if isinstance(obj, dict) and is_event(obj):
                # again, numbers exact: an event's numbers are numeric columns' values
                self._write_event(topic, loads(value, exact_numbers=True))
            else:
                self._write_json(topic, obj)
            return
        if self.shapes is None:
            raise SinkError(f"topic {topic!r} is Avro: the relay needs --schema-registry-url")
        shape = self.shapes.get(sid)
        namespace = self.names.namespace(topic, shape.namespace, shape.name)
        m = _renamed(shape.modification(value), namespace)
        self._boundary(topic, m)
        table = (namespace, shape.name)
        if self._shapes.get(table) is not shape:
            self.sink.write(_renamed(shape.schema(m.timestamp, m.lsn), namespace))
            self._shapes[table] = shape
        self._counted(m)

    def _write_event(self, topic: str, obj: dict[str, object]) -> None:
        """A psql-streamer event: its table's Schema record when it is new or grew, then
        its change."""
        schema, change = self.events.records(obj)
        namespace = self.names.namespace(topic, change.namespace, change.name)
        change = _renamed(change, namespace)
        self._boundary(topic, change)
        if schema is not None:
            self.sink.write(_renamed(schema, namespace))
        self._counted(change)

    def _write_json(self, topic: str, obj: object) -> None:
        """A JSON line's record: a change after its table's Schema record."""
        if not getattr(self.sink, "writes_json", False):
            raise SinkError(
                f"topic {topic!r} is JSON, whose values are in their JSON form: relay it "
                "into a sink that writes JSON (file, kafka --format json, nats, kinesis), "
                "or produce Avro (--format avro)"
            )
        record = record_of(obj)
        if isinstance(record, Schema):
            # written before the table's next change, named as that change's topic says
            table = (record.namespace, record.name)
            self._schemas[table] = record
            self._written = {w for w in self._written if w[1:] != table}
            return
        if not isinstance(record, Modification):
            self.sink.write(record)  # a Message
            return
        table = (record.namespace, record.name)
        namespace = self.names.namespace(topic, *table)
        record = _renamed(record, namespace)
        self._boundary(topic, record)
        if (topic, *table) not in self._written:
            self.sink.write(_renamed(self._schema_of(table), namespace))
            self._written.add((topic, *table))
        self._counted(record)

    def _schema_of(self, table: tuple[str, str]) -> Schema:
        """The latest Schema record of `table` in the schema topic (read again when the
        table is new to it)."""
        if table not in self._schemas:
            if not self.cfg.relay_schema_topic:
                raise SinkError(
                    f"a JSON change of {table[0]}.{table[1]}: the relay needs "
                    "--from-schema-topic (the producing pg2sink's --schema-topic)"
                )
            settings = consumer_settings(self.cfg)
            self._schemas.update(read_schema_topic(settings, self.cfg.relay_schema_topic))
        schema = self._schemas.get(table)
        if schema is None:
            raise SinkError(
                f"no Schema record of {table[0]}.{table[1]} in --from-schema-topic "
                f"{self.cfg.relay_schema_topic!r}"
            )
        return schema

    def _boundary(self, topic: str, m: Modification) -> None:
        """A checkpoint before `m` when it starts another source transaction."""
        last = self._last
        if last is not None and (last[0] != topic or last[1] != m.xid or m.sequence <= last[2]):
            # another transaction: the sink takes the one before as a whole
            self._checkpoint()
        self._last = (topic, m.xid, m.sequence)

    def _checkpoint(self) -> int:
        """A checkpoint, after the offsets it covers when the file keeps them."""
        if self.offsets_file is not None:
            after = self._last[2] if self._last is not None else -1
            for record in self._offset_rows.records(self._pending, after):
                self.sink.write(record)
        self._pending.clear()
        mark = self.marks.next()
        self.sink.checkpoint(mark)
        return mark

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions given to this relay start where the DuckDB file says, if it does
        (the eager assignment librdkafka does by default: assign() takes the whole set)."""
        for tp in partitions:
            stored = self._stored.get((tp.topic, tp.partition))
            if stored is not None:
                tp.offset = stored
                log.info(
                    "%s [%d] starts at offset %d (the DuckDB file's)",
                    tp.topic,
                    tp.partition,
                    stored,
                )
        consumer.assign(partitions)

    def _wait_for(self, mark: int) -> None:
        """Flush until the sink acknowledges `mark`; SinkUnavailableError after ACK_WAIT."""
        deadline = time.monotonic() + ACK_WAIT
        while True:
            acked = self.sink.flush()
            if acked is not None and acked >= mark:
                return
            if time.monotonic() > deadline:
                raise SinkUnavailableError(
                    f"the sink did not accept a batch within {ACK_WAIT:.0f} s; its offsets "
                    "are not committed (it is relayed again after a restart)"
                )

    def _commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commit each partition's next offset, waiting for the broker's answer."""
        assert self._consumer is not None
        parts = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        if not parts:
            return
        try:
            self._consumer.commit(offsets=parts, asynchronous=False)
        except KafkaException as e:
            raise SinkUnavailableError(
                f"cannot commit the relay's offsets (the sink holds the batch; it is "
                f"written again after a restart): {e}"
            ) from None

    def _consumer_error(self, error: KafkaError) -> None:
        """A consumer error: the end of a partition is none; a fatal one stops."""
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.fatal() or error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise SinkError(f"Kafka consumer failed: {error.str()}")
        self.stats.replication_down(f"Kafka consumer: {error.str()}")
        log.warning("Kafka consumer: %s", error.str())


def _renamed(record: R, namespace: str) -> R:
    """`record` in schema `namespace` (names.TableNames); itself when that is its own."""
    if record.namespace == namespace:
        return record
    if isinstance(record, Schema):
        row = {**record.schema, "pg.namespace": namespace}
        return dataclasses.replace(record, namespace=namespace, schema=row)
    return dataclasses.replace(record, namespace=namespace)
