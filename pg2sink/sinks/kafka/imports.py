"""The Kafka sink's import writer: an import's rows produced by Spark's executors.

The driver writes the table's Schema record with a KafkaSink of its own (the topic is
checked, the Avro subjects registered, --schema-topic written) and waits for the
broker's acknowledgement; the executors then get the subjects' ids with the target, so
they never call the registry. Each task produces its partition with a KafkaSink of its
own (the stream's producer settings: idempotent, acks=all, the user's --kafka-config;
lz4 compression unless that sets another, producer.PRODUCER_DEFAULTS), keyed by primary
key and encoded by the same per-table encoders as the stream (Avro: the stream's C
encoder of new rows, formats.avro_native, fed each row as the pgoutput Insert message
of its text, changelog.batches.write_raw), and returns only when the broker
acknowledged every message: the partition is marked done after that.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pg2sink.changelog.batches import ImportTable, write_modifications, write_raw
from pg2sink.changelog.records import Schema
from pg2sink.errors import ConfigError, SinkError
from pg2sink.sinks.kafka.config import KafkaConfig

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from pg2sink.formats.kafka import Format
    from pg2sink.sinks.base import Sink

__all__ = [
    "KafkaImportTarget",
    "KnownSchemaIds",
    "RecordingRegistry",
    "wait_acknowledged",
]

#: Longest wait for a task's Kafka deliveries, in seconds (librdkafka retries inside it).
DELIVERY_WAIT = 300.0


@dataclass(frozen=True)
class KafkaImportTarget:
    """The Kafka sink's ImportTarget (sinks/base.py)."""

    cfg: KafkaConfig = dataclasses.field(repr=False)
    """The stream's Kafka settings (holds secrets: never logged)."""
    schema_ids: tuple[tuple[str, int], ...] = ()
    """Avro: the (subject, id) pairs the driver registered in `begin`."""

    def problem(self) -> str | None:
        return None

    def begin(self, schema: Schema) -> KafkaImportTarget:
        """Produce the Schema record (registers the subjects, checks the topic, writes
        --schema-topic) and wait for it; the target with the subjects' ids."""
        from pg2sink.formats.kafka import AvroFormat
        from pg2sink.sinks.kafka.config import message_format
        from pg2sink.sinks.kafka.sink import KafkaSink

        recording: RecordingRegistry | None = None
        fmt: Format
        if self.cfg.format != "avro":
            fmt = message_format(self.cfg)
        else:
            if not self.cfg.schema_registry_url:
                raise ConfigError(
                    "--format avro needs --schema-registry-url (or use --format json)"
                )
            from pg2sink.schema_registry import RegistryClient

            recording = RecordingRegistry(
                RegistryClient(self.cfg.schema_registry_url, self.cfg.registry.reveal())
            )
            fmt = AvroFormat(recording)
        # imports are not transactional (docs/kafka-exactly-once.md)
        producer = KafkaSink(dataclasses.replace(self.cfg, exactly_once=False), fmt)
        producer.open()
        try:
            producer.write(schema)
            wait_acknowledged(producer, f"the Schema record of {schema.namespace}.{schema.name}")
        finally:
            producer.close()
        ids = tuple(recording.ids.items()) if recording is not None else ()
        return dataclasses.replace(self, schema_ids=ids)

    def write_rows(self, table: ImportTable, batches: Iterator[pa.RecordBatch]) -> int:
        """Produce every row and wait for every delivery; the number of rows."""
        from pg2sink.formats.kafka import AvroFormat
        from pg2sink.sinks.kafka.config import message_format
        from pg2sink.sinks.kafka.sink import KafkaSink

        # the driver published the Schema record to --schema-topic once; imports are not
        # transactional (docs/kafka-exactly-once.md)
        cfg = dataclasses.replace(self.cfg, schema_topic=None, exactly_once=False)
        fmt: Format = (
            message_format(cfg)
            if cfg.format != "avro"
            else AvroFormat(KnownSchemaIds(dict(self.schema_ids)))
        )
        sink = KafkaSink(cfg, fmt)
        sink.open()
        try:
            sink.write(table.schema)
            s = table.schema
            # the stream's C encoder of new rows (Avro), fed the pgoutput messages of the
            # batches' text; None: the table or process takes the Python path
            raw = sink.row_writer(table.shape())
            # start_flush after each batch serves delivery reports as we go
            if raw is not None:
                seq = write_raw(table, batches, raw, sink.write, sink.start_flush)
            else:
                seq = write_modifications(table, batches, sink.write, sink.start_flush)
            wait_acknowledged(sink, f"the import's messages of {s.namespace}.{s.name}")
        finally:
            sink.close()
        return seq


class KnownSchemaIds:
    """A SchemaRegistry that answers with the ids the driver registered (executors)."""

    def __init__(self, ids: Mapping[str, int]) -> None:
        self._ids = dict(ids)

    def register(self, subject: str, schema: Mapping[str, Any]) -> int:
        try:
            return self._ids[subject]
        except KeyError:
            raise SinkError(f"subject {subject!r} was not registered by the driver") from None

    def close(self) -> None:
        pass


class RecordingRegistry:
    """Wraps the driver's registry client and remembers the ids it returned."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.ids: dict[str, int] = {}

    def register(self, subject: str, schema: Mapping[str, Any]) -> int:
        schema_id: int = self._inner.register(subject, schema)
        self.ids[subject] = schema_id
        return schema_id

    def close(self) -> None:
        self._inner.close()


def wait_acknowledged(sink: Sink, what: str) -> None:
    """Checkpoint everything `sink` was given and flush until the broker acknowledged it
    all; SinkError naming `what` after DELIVERY_WAIT seconds."""
    sink.checkpoint(1)
    deadline = time.monotonic() + DELIVERY_WAIT
    while sink.flush() != 1:
        if time.monotonic() > deadline:
            raise SinkError(f"Kafka did not acknowledge {what} within {DELIVERY_WAIT:.0f}s")
