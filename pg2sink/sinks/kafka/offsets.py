"""The offsets topic of --exactly-once: where each Kafka transaction records its checkpoint.

Every transaction of the exactly-once sink (transactional.py) ends with one record here,
committed atomically with the transaction's data messages:

    key:   the transactional id (UTF-8), e.g. 'pg2sink.my_slot'
    value: {"slot": "my_slot", "lsn": 22052544, "lsn_text": "0/1507DC0"}

`lsn` is the sink's latest checkpoint when the transaction committed: every change that
came before it in the stream is in Kafka. The topic is compacted (only the last record
of a key matters) and created when missing: one partition, the broker's replication
factor, cleanup.policy=compact.

At start, after `init_transactions` settled (committed or aborted) whatever transaction
an earlier instance left open, `read_checkpoint` reads the topic with
isolation.level=read_committed to its end and returns the last checkpoint of the key.
"""

from __future__ import annotations

import json
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.logical.lsn import format_lsn
from pg2sink.sinks.kafka.producer import LibrdkafkaLog, reason

__all__ = ["READ_WAIT", "checkpoint_value", "client_settings", "ensure_topic", "read_checkpoint"]

#: Longest wait for the offsets topic's end (another producer's open transaction holds a
#: read_committed reader back until it ends), in seconds.
READ_WAIT = 60.0
#: Timeout of one metadata or admin request, in seconds.
REQUEST_WAIT = 10.0
#: Settings of --kafka-config that a consumer or admin client shares with the producer
#: (where and how to connect); the producer's own ones would only be warned about.
_SHARED_PREFIXES = ("bootstrap.", "security.", "sasl.", "ssl.", "socket.", "broker.", "client.")


def client_settings(servers: str, producer: dict[str, str]) -> dict[str, Any]:
    """Connection settings for a consumer or an admin client, from the producer's."""
    settings: dict[str, Any] = {k: v for k, v in producer.items() if k.startswith(_SHARED_PREFIXES)}
    if servers:
        settings["bootstrap.servers"] = servers
    settings["logger"] = LibrdkafkaLog()
    return settings


def checkpoint_value(slot: str, lsn: int) -> bytes:
    """The JSON value of one checkpoint record."""
    return json.dumps({"slot": slot, "lsn": lsn, "lsn_text": format_lsn(lsn)}).encode()


def ensure_topic(settings: dict[str, Any], topic: str) -> None:
    """Create `topic` compacted with one partition unless it exists; SinkError when it
    cannot be created, SinkUnavailableError when Kafka does not answer."""
    admin = AdminClient(settings)
    try:
        if topic in admin.list_topics(topic, timeout=REQUEST_WAIT).topics:
            found = admin.list_topics(topic, timeout=REQUEST_WAIT).topics[topic]
            if found.error is None:
                return
        new = NewTopic(topic, 1, -1, config={"cleanup.policy": "compact"})
        admin.create_topics([new], request_timeout=REQUEST_WAIT)[topic].result(REQUEST_WAIT)
    except KafkaException as e:
        error = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
        if error is not None and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return  # created meanwhile (or by the broker on the metadata request)
        if error is not None and error.retriable():
            raise SinkUnavailableError(
                f"cannot create the offsets topic {topic!r}: {reason(e)}"
            ) from None
        raise SinkError(
            f"cannot create the offsets topic {topic!r} ({reason(e)}): create it compacted "
            "(kafka-topics.sh --create --topic ... --config cleanup.policy=compact) or name "
            "another with --offsets-topic"
        ) from None


def read_checkpoint(settings: dict[str, Any], topic: str, key: str) -> int | None:
    """The `lsn` of the last committed record of `key` in `topic`, None if it has none."""
    consumer = Consumer(
        {
            **settings,
            "group.id": f"pg2sink-offsets-reader.{key}",  # never joined nor committed
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        return _read(consumer, topic, key.encode())
    except KafkaException as e:
        raise SinkUnavailableError(
            f"cannot read the offsets topic {topic!r}: {reason(e)}"
        ) from None
    finally:
        consumer.close()


def _read(consumer: Any, topic: str, key: bytes) -> int | None:
    """Read every partition of `topic` to the end it had when the reading started."""
    partitions = consumer.list_topics(topic, timeout=REQUEST_WAIT).topics[topic].partitions
    ends: dict[int, int] = {}
    for p in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), REQUEST_WAIT)
        if high > low:
            ends[p] = high
    if not ends:
        return None
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    found: int | None = None
    deadline = time.monotonic() + READ_WAIT
    while ends:
        if time.monotonic() > deadline:
            raise SinkUnavailableError(
                f"the offsets topic {topic!r} was not readable to its end within "
                f"{READ_WAIT:.0f}s (an open transaction of another producer?)"
            )
        msg = consumer.poll(0.2)
        error = msg.error() if msg is not None else None
        if error is not None and error.code() != KafkaError._PARTITION_EOF:
            raise KafkaException(error)
        if msg is not None and error is None and msg.key() == key:
            found = int(json.loads(msg.value())["lsn"])
        # the end may be a transaction marker, which a read_committed reader never sees:
        # a partition is read when its position (the next offset to read) reached it
        for tp in consumer.position([TopicPartition(topic, p) for p in ends]):
            if tp.offset >= ends[tp.partition]:
                del ends[tp.partition]
    return found
