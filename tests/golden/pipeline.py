"""Captured frames through pg2sink's real row pipeline into real sinks: the adapter.

This is the one module of tests/golden that names pg2sink's internals (the changelog
handler, the sinks' classes, the switch between the C and the Python Avro encoders). A
redesign of the pipeline changes this module, never the golden files: the bytes must
stay what they are.

- `replay`: every XLogData frame's pgoutput message into the ChangelogHandler (as the
  replication loop hands them: payload and the frame's WAL start; a checkpoint at each
  Commit), with --messages on, then a flush and close; the frames of a --streaming
  session through the StreamingHandler in front of it.
- `file_output`: the file sink's bytes.
- `kafka_output`: the Kafka sink's messages, sent to the session's real broker and
  registry and read back from them (broker.py), put in the golden files' form: the
  topic prefix TOPIC_PREFIX, and in Confluent's framing the golden schema id (1, 2... in
  order of registration) for the registry's, once the registry was found to hold
  exactly the schemas registered; magic byte and Avro body untouched.
- `implementation`: the C encoder or the Python path, whichever this session runs
  (PG2SINK_IMPL, chosen once per process by changelog._cmodule; make test runs the golden
  tests under each), and a count of the tables the C encoder took, so that a run can
  tell which one it tested.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from pg2sink.catalog.catalog import CatalogLookup
from pg2sink.changelog import _cmodule
from pg2sink.formats import avro_native
from pg2sink.formats.kafka import AvroFormat
from pg2sink.logical.copydata import XLOG_DATA_HEADER
from pg2sink.schema_registry import RegistryClient, SchemaRegistry, key_subject, value_subject
from pg2sink.sinks.base import Sink
from pg2sink.sinks.file import FileSink
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.sink import KafkaSink
from pg2sink.subscription.handlers import ChangelogHandler
from pg2sink.subscription.in_progress import StreamingHandler
from tests.conftest import KafkaStack
from tests.golden.broker import read_topics, registered
from tests.golden.files import KafkaMessage, kafka_lines, registry_json
from tests.golden.normalize import canonical

#: the topic prefix of the replayed Kafka output (a live run's differs: normalize.py)
TOPIC_PREFIX = "golden"
#: the implementation of this session's process: one, since PG2SINK_IMPL is read once at
#: import (an unset variable: c where the extension is built)
IMPLEMENTATIONS = (_cmodule.check(),)


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


@dataclass(frozen=True)
class Broker:
    """Where a Kafka output goes: the session's real Kafka broker and schema registry,
    under a topic prefix (and so subjects) no other test uses."""

    stack: KafkaStack
    topic_prefix: str


class LoggedRegistry:
    """The real registry client, noting in order what the sink registered through it:
    the golden files number schemas 1, 2... in order of registration, which the registry
    cannot tell afterwards (an id there is shared by every subject holding the schema)."""

    def __init__(self, client: SchemaRegistry) -> None:
        self.client = client
        self.registered: list[tuple[int, str, Mapping[str, Any]]] = []

    def register(self, subject: str, schema: Mapping[str, Any]) -> int:
        schema_id = self.client.register(subject, schema)
        if (schema_id, subject, schema) not in self.registered:
            self.registered.append((schema_id, subject, schema))
        return schema_id

    def close(self) -> None:
        self.client.close()


@dataclass
class KafkaOutput:
    messages: list[KafkaMessage]
    """As read back from the broker, in the golden files' form: the topic prefix
    TOPIC_PREFIX, each schema id in a key or value the golden one (`registered`)."""
    registered: list[tuple[int, str, Mapping[str, Any]]]
    """(golden id, subject, schema as the registry answers it) of each schema registered,
    in order of registration (Avro only)."""


def kafka_output(source: Input, broker: Broker, fmt: str, *extra: str) -> KafkaOutput:
    """What `pg2sink --sink kafka --format FMT --messages` produces for the input, read
    back from the broker and the registry; `extra`: 'tombstones'."""
    stack, prefix = broker.stack, broker.topic_prefix
    cfg = KafkaConfig(
        stack.bootstrap_servers,
        schema_registry_url=stack.registry_url,
        format=fmt,
        topic_prefix=prefix,
        tombstones="tombstones" in extra,
    )
    registry = LoggedRegistry(RegistryClient(stack.registry_url)) if fmt == "avro" else None
    sink = KafkaSink(cfg, AvroFormat(registry) if registry is not None else None)
    sink.open()
    # the sink's flush and close wait (bounded) for the broker's acknowledgements: a
    # message still unsent is missing from what is read back, a difference
    replay(source, sink)
    read = read_topics(stack, prefix)
    if registry is None:
        return KafkaOutput([golden_message(m, prefix, None) for m in read], [])
    # TopicNameStrategy: a topic's subjects are <topic>-key and <topic>-value; with what
    # the sink registered, an extra or a missing subject is a difference
    topics = {m.topic for m in read}
    subjects = [f"{t}-{part}" for t in topics for part in ("key", "value")]
    held = registered(stack, [*subjects, *(subject for _, subject, _ in registry.registered)])
    ids = golden_ids(registry.registered, held)
    messages = [golden_message(m, prefix, ids) for m in read]
    answers = {(s, i): schema for s, versions in held.items() for i, schema in versions}
    schemas = [
        (ids[(subject, i)], _golden_topic(subject, prefix), answers[(subject, i)])
        for i, subject, _ in registry.registered
    ]
    return KafkaOutput(messages, schemas)


def golden_ids(
    logged: Sequence[tuple[int, str, Mapping[str, Any]]],
    held: Mapping[str, Sequence[tuple[int, Any]]],
) -> dict[tuple[str, int], int]:
    """Golden id by (subject, registry id): 1, 2... in order of registration. The
    registry must hold exactly what the sink registered: the same subjects, each with
    those schemas (compared by content: a registry may reformat) in that order."""
    by_subject: dict[str, list[tuple[int, str]]] = {}
    for schema_id, subject, schema in logged:
        by_subject.setdefault(subject, []).append((schema_id, canonical(schema)))
    holds = {s: [(i, canonical(schema)) for i, schema in v] for s, v in held.items()}
    assert holds == by_subject, f"the registry holds {holds}, the sink registered {by_subject}"
    return {(subject, schema_id): n for n, (schema_id, subject, _) in enumerate(logged, 1)}


def _golden_topic(name: str, prefix: str) -> str:
    """A topic or subject under TOPIC_PREFIX instead of the run's `prefix`."""
    assert name.startswith(prefix + "."), name
    return TOPIC_PREFIX + name[len(prefix) :]


def golden_message(
    m: KafkaMessage, prefix: str, ids: Mapping[tuple[str, int], int] | None
) -> KafkaMessage:
    """`m` as the golden files have it; `ids`: golden id by (subject, id) (Avro)."""
    key, value = m.key, m.value
    if ids is not None and m.topic != f"{prefix}.messages":  # Message records are JSON
        key = _golden_framing(key, key_subject(m.topic), ids)
        value = _golden_framing(value, value_subject(m.topic), ids)
    return KafkaMessage(_golden_topic(m.topic, prefix), key, value, m.headers)


def _golden_framing(
    data: bytes | None, subject: str, ids: Mapping[tuple[str, int], int]
) -> bytes | None:
    """Confluent's framing (magic byte, 4-byte schema id, body) with the golden id; an id
    the registry does not hold for `subject` becomes 0, which no golden message has.
    The magic byte and the body are kept as they are, to compare exactly."""
    if data is None:
        return None
    golden = ids.get((subject, int.from_bytes(data[1:5], "big")), 0)
    return data[:1] + golden.to_bytes(4, "big") + data[5:]


@dataclass
class NativeUse:
    """How many table shapes the C encoder was built for during a run."""

    tables: int = 0


@contextlib.contextmanager
def implementation(impl: str) -> Iterator[NativeUse]:
    """Run the pipeline on the C encoder (`c`) or the Python path (`python`), which must
    be this session's (IMPLEMENTATIONS), counting the tables the C encoder was built for."""
    assert impl == _cmodule.IMPL, f"this session runs PG2SINK_IMPL={_cmodule.IMPL}, not {impl}"
    use = NativeUse()
    build = avro_native.NativeRowEncoder.build

    def counted(*args: Any) -> avro_native.NativeRowEncoder | None:
        native = build(*args)
        use.tables += native is not None
        return native

    with mock.patch.object(avro_native.NativeRowEncoder, "build", staticmethod(counted)):
        yield use


def _avro_messages(source: Input, broker: Broker) -> bytes:
    return kafka_lines(kafka_output(source, broker, "avro", "tombstones").messages, text=False)


def _avro_registry(source: Input, broker: Broker) -> bytes:
    return registry_json(kafka_output(source, broker, "avro", "tombstones").registered)


def _json_messages(source: Input, broker: Broker) -> bytes:
    return kafka_lines(kafka_output(source, broker, "json").messages, text=True)


#: each golden output file (files.py) made with no server, and how it is made
FILE_OUTPUTS: Mapping[str, Callable[[Input], bytes]] = {"file.jsonl": file_output}
#: each golden output file made through the real broker and registry, and how
KAFKA_OUTPUTS: Mapping[str, Callable[[Input, Broker], bytes]] = {
    "kafka_avro.jsonl": _avro_messages,
    "kafka_avro.registry.json": _avro_registry,
    "kafka_json.jsonl": _json_messages,
}
OUTPUTS = sorted({*FILE_OUTPUTS, *KAFKA_OUTPUTS})

#: the golden file of an output under --streaming (frames_streamed.bin), where it is not
#: the same: a Schema record sent inside a streamed transaction carries the LSN the
#: StreamingHandler gives the replayed transaction's Begin (its first Stream Start's),
#: not that of the first change sent
STREAMED = {"file.jsonl": "file.streamed.jsonl"}
