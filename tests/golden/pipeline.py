"""Captured frames through pg2sink's real row pipeline, with no server: the adapter.

This is the one module of tests/golden that names pg2sink's internals (the changelog
handler, the sinks' classes, the switch between the C and the Python Avro encoders). A
redesign of the pipeline changes this module, never the golden files: the bytes must
stay what they are.

- `replay`: every XLogData frame's pgoutput message into the ChangelogHandler (as the
  replication loop hands them: payload and the frame's WAL start; a checkpoint at each
  Commit), with --messages on, then a flush and close; the frames of a --streaming
  session through the StreamingHandler in front of it.
- `file_output`: the file sink's bytes.
- `kafka_output`: the Kafka sink's messages as its producer was handed them, taken by a
  recording stand-in for confluent-kafka's Producer (no broker: delivery is not what
  this test is about; tests/golden/test_live.py runs a real one), with a registry that
  hands out ids 1, 2... like a fresh one.
- `implementation`: the C encoder or the Python path, and a count of the tables the C
  encoder took, so that a run can tell which one it tested.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from pg2sink.catalog.catalog import CatalogLookup
from pg2sink.changelog import avro_native
from pg2sink.config import KafkaConfig
from pg2sink.logical.replication import XLOG_DATA_HEADER
from pg2sink.sinks.base import Sink
from pg2sink.sinks.file import FileSink
from pg2sink.sinks.kafka import KafkaSink
from pg2sink.sinks.kafka import sink as kafka_sink_module
from pg2sink.sinks.kafka.formats import AvroFormat
from pg2sink.subscription.handlers import ChangelogHandler
from pg2sink.subscription.streaming import StreamingHandler
from tests.golden.files import KafkaMessage, kafka_lines, registry_json

#: the topic prefix of the replayed Kafka output (a live run's differs: normalize.py)
TOPIC_PREFIX = "golden"
#: the environment variable of the encoder choice (issue #12; read by the redesign)
IMPL_VARIABLE = "PG2SINK_IMPL"
IMPLEMENTATIONS = ("python", "c")


@dataclass(frozen=True)
class Input:
    """Captured frames and the catalog answers they need."""

    frames: Sequence[bytes]
    catalog: CatalogLookup
    streamed: bool = False
    """Frames of a --streaming session (protocol 2, transactions sent while they run)."""


def replay(source: Input, sink: Sink) -> None:
    """Feed the frames (XLogData) through the changelog into `sink` (opened), then close.

    Streamed frames go through the StreamingHandler first, as with --streaming."""
    changelog = ChangelogHandler(source.catalog, sink, messages=True)
    with tempfile.TemporaryDirectory(prefix="pg2sink-golden-spill-") as spill_dir:
        handler = StreamingHandler(changelog, spill_dir) if source.streamed else changelog
        for frame in source.frames:
            _tag, wal_start, _wal_end, _sent = XLOG_DATA_HEADER.unpack_from(frame)
            # a memoryview, as libpq hands frames to the replication loop
            end_lsn = handler.feed(memoryview(frame)[XLOG_DATA_HEADER.size :], wal_start)
            if end_lsn:
                handler.checkpoint(end_lsn)
        handler.flush()
        handler.close()


def file_output(source: Input) -> bytes:
    """What `pg2sink --sink file --messages` writes for the input."""
    with tempfile.TemporaryDirectory(prefix="pg2sink-golden-") as tmp:
        path = Path(tmp) / "out.jsonl"
        sink = FileSink(str(path))
        sink.open()
        replay(source, sink)
        return path.read_bytes()


class FixedIdRegistry:
    """SchemaRegistry giving ids 1, 2... per distinct (subject, schema), as a fresh
    registry would; keeps what was registered for the golden file."""

    def __init__(self) -> None:
        self.registered: list[tuple[int, str, Mapping[str, Any]]] = []

    def register(self, subject: str, schema: Mapping[str, Any]) -> int:
        for schema_id, s, known in self.registered:
            if s == subject and known == schema:
                return schema_id
        schema_id = len(self.registered) + 1
        self.registered.append((schema_id, subject, schema))
        return schema_id

    def close(self) -> None:
        pass


@dataclass
class _Metadata:
    """list_topics()'s answer: every topic exists, with one partition."""

    topics: dict[str, Any]


@dataclass
class _TopicMetadata:
    error: None = None
    partitions: Mapping[int, object] | None = None


class RecordingProducer:
    """What the Kafka sink uses of confluent_kafka.Producer; keeps each produced message
    and delivers at once (nothing is ever queued)."""

    def __init__(self, settings: Mapping[str, Any], into: list[KafkaMessage]) -> None:
        self.settings = settings
        self.messages = into

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: object = None,
        alias: object = None,
        timestamp: int = 0,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> None:
        self.messages.append(KafkaMessage(topic, key, value, tuple(headers or ())))

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _Metadata:
        names = [topic] if topic else sorted({m.topic for m in self.messages})
        return _Metadata({n: _TopicMetadata(partitions={0: object()}) for n in names})

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def purge(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("a replay has no failed delivery to purge after")

    def __len__(self) -> int:
        return 0


@dataclass
class KafkaOutput:
    messages: list[KafkaMessage]
    registered: list[tuple[int, str, Mapping[str, Any]]]
    """(id, subject, schema) of each schema registered (Avro only)."""


def kafka_output(source: Input, fmt: str, *extra: str) -> KafkaOutput:
    """What `pg2sink --sink kafka --format FMT --messages` produces for the input;
    `extra`: 'tombstones'."""
    cfg = KafkaConfig(
        "golden:9092", format=fmt, topic_prefix=TOPIC_PREFIX, tombstones="tombstones" in extra
    )
    registry = FixedIdRegistry()
    messages: list[KafkaMessage] = []
    with mock.patch.object(
        kafka_sink_module, "Producer", lambda settings: RecordingProducer(settings, messages)
    ):
        sink = KafkaSink(cfg, AvroFormat(registry) if fmt == "avro" else None)
        sink.open()
        replay(source, sink)
    return KafkaOutput(messages, registry.registered)


@dataclass
class NativeUse:
    """How many table shapes the C encoder was built for during a run."""

    tables: int = 0


@contextlib.contextmanager
def implementation(impl: str) -> Iterator[NativeUse]:
    """Run the pipeline on the C encoder (`c`) or the Python path (`python`).

    Sets PG2SINK_IMPL (the redesign's switch) and, today, turns the C encoder off by
    avro_native's own flag, the state of an install built without a compiler."""
    assert impl in IMPLEMENTATIONS, impl
    if impl == "c":
        assert avro_native.available(), "the C extension is not built: `make setup` builds it"
    use = NativeUse()
    build = avro_native.NativeRowEncoder.build

    def counted(*args: Any) -> avro_native.NativeRowEncoder | None:
        native = build(*args)
        use.tables += native is not None
        return native

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, {IMPL_VARIABLE: impl}))
        stack.enter_context(
            mock.patch.object(avro_native.NativeRowEncoder, "build", staticmethod(counted))
        )
        if impl == "python":
            stack.enter_context(mock.patch.object(avro_native, "_BUILT", False))
        yield use


def _avro_messages(source: Input) -> bytes:
    return kafka_lines(kafka_output(source, "avro", "tombstones").messages, text=False)


def _avro_registry(source: Input) -> bytes:
    return registry_json(kafka_output(source, "avro", "tombstones").registered)


def _json_messages(source: Input) -> bytes:
    return kafka_lines(kafka_output(source, "json").messages, text=True)


#: each golden output file (files.py) and how it is made from the input
OUTPUTS: Mapping[str, Callable[[Input], bytes]] = {
    "file.jsonl": file_output,
    "kafka_avro.jsonl": _avro_messages,
    "kafka_avro.registry.json": _avro_registry,
    "kafka_json.jsonl": _json_messages,
}

#: the golden file of an output under --streaming (frames_streamed.bin), where it is not
#: the same: a Schema record sent inside a streamed transaction carries the LSN the
#: StreamingHandler gives the replayed transaction's Begin (its first Stream Start's),
#: not that of the first change sent
STREAMED = {"file.jsonl": "file.streamed.jsonl"}
