"""What a real Kafka broker and schema registry hold after a run: the tests' read-back.

- `read_topics`: every message of the topics under a prefix, read from the broker with a
  real consumer from each partition's start up to its end at the time of the call (the
  watermarks: no waiting for messages that may never come, no guessed timeout).
- `registered`: the schemas the registry holds under the subjects named, each subject's
  versions in order with their ids, as the registry's REST API answers.
"""

from __future__ import annotations

import json
import time
import urllib.error
import uuid
from collections.abc import Iterable
from typing import Any

import confluent_kafka as ck

from tests.conftest import KafkaStack
from tests.golden.files import KafkaMessage
from tests.sinks.kafka.test_kafka import registry_get

#: how long the broker may take to answer a metadata or watermark request, in seconds
ANSWER_WAIT = 30.0
#: how long reading what the watermarks promised may take, in seconds
READ_WAIT = 30.0


def _under(name: str, prefix: str) -> bool:
    return name.startswith(prefix + ".")


def read_topics(stack: KafkaStack, prefix: str) -> list[KafkaMessage]:
    """The messages of the topics `prefix`.*, grouped by topic (in name order), each
    topic's in its partition's order. A topic must have one partition (the broker's
    default here): the golden files keep one order per topic."""
    consumer = ck.Consumer(
        {
            "bootstrap.servers": stack.bootstrap_servers,
            "group.id": f"golden-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        metadata = consumer.list_topics(timeout=ANSWER_WAIT)
        topics = sorted(t for t in metadata.topics if _under(t, prefix))
        ends: dict[tuple[str, int], int] = {}
        starts = []
        for topic in topics:
            partitions = sorted(metadata.topics[topic].partitions)
            assert partitions == [0], f"{topic}: partitions {partitions}, one expected"
            low, high = _watermarks(consumer, topic)
            if high > low:
                ends[(topic, 0)] = high
                starts.append(ck.TopicPartition(topic, 0, low))
        consumer.assign(starts)
        return _read_until(consumer, ends, topics)
    finally:
        consumer.close()


#: the answers of a broker about a topic it created a moment ago (on a producer's first
#: use) and whose partition has no leader yet: the topic is there, its end is not known
_NEW_TOPIC = frozenset(
    {
        ck.KafkaError.NOT_LEADER_FOR_PARTITION,
        ck.KafkaError.LEADER_NOT_AVAILABLE,
        ck.KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)


def _watermarks(consumer: ck.Consumer, topic: str) -> tuple[int, int]:
    """Partition 0's (low, high) offsets, once it has a leader (within ANSWER_WAIT)."""
    deadline = time.monotonic() + ANSWER_WAIT
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                ck.TopicPartition(topic, 0), timeout=ANSWER_WAIT
            )
            return low, high
        except ck.KafkaException as e:
            if e.args[0].code() not in _NEW_TOPIC or time.monotonic() >= deadline:
                raise
        time.sleep(0.2)


def _read_until(
    consumer: ck.Consumer, ends: dict[tuple[str, int], int], topics: list[str]
) -> list[KafkaMessage]:
    """Consume until every partition reached its end offset; then group by topic."""
    read: dict[str, list[KafkaMessage]] = {t: [] for t in topics}
    left = dict(ends)
    while left:
        msg = consumer.poll(READ_WAIT)
        assert msg is not None, f"the broker's end offsets not reached in {READ_WAIT} s: {left}"
        assert msg.error() is None, msg.error()
        topic, offset = msg.topic(), msg.offset()
        key, value = msg.key(), msg.value()
        assert topic is not None and offset is not None
        end = left.get((topic, 0))
        if end is None or offset >= end:
            continue  # written after the end offsets were taken: not this read's
        assert not isinstance(key, str) and not isinstance(value, str)  # no deserializer
        read[topic].append(KafkaMessage(topic, key, value, _headers(msg.headers())))
        if offset + 1 >= end:
            del left[(topic, 0)]
    return [m for t in topics for m in read[t]]


def _headers(raw: object) -> tuple[tuple[str, bytes], ...]:
    """A consumed message's headers, in order (a list of pairs from librdkafka)."""
    if raw is None:
        return ()
    assert isinstance(raw, list), raw
    for name, value in raw:
        assert isinstance(value, bytes), (name, value)  # pg2sink sends none empty
    return tuple(raw)


def registered(stack: KafkaStack, subjects: Iterable[str]) -> dict[str, list[tuple[int, Any]]]:
    """Per subject of `subjects` that the registry holds: its versions' (id, schema) in
    version order. The subjects are named, not listed from `GET /subjects`: a registry
    that a whole test session shares soon holds more than the 1,000 that call returns."""
    out = {}
    for subject in sorted(set(subjects)):
        try:
            versions = registry_get(stack, f"subjects/{subject}/versions")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                continue  # not registered: a difference if the sink registered it
            raise
        answers = [registry_get(stack, f"subjects/{subject}/versions/{v}") for v in versions]
        out[subject] = [(a["id"], json.loads(a["schema"])) for a in answers]
    return out
