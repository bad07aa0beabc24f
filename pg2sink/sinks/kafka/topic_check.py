"""Whether a topic can take the sink's messages: checked once per topic, before its
first message, so that a missing or colliding topic is a clear error, not a delivery
failure per message."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.sinks.kafka.health import BrokerHealth
from pg2sink.sinks.kafka.producer import reason
from pg2sink.sinks.kafka.topics import kafka_identity

__all__ = ["METADATA_TIMEOUT", "TOPIC_CREATE_WAIT", "TopicCheck"]

#: How long a topic may take to appear when the broker creates topics on first use.
TOPIC_CREATE_WAIT = 5.0
#: Timeout of one metadata request, in seconds.
METADATA_TIMEOUT = 10.0

_HOW_TO_CREATE = (
    "create it (kafka-topics.sh --bootstrap-server ... --create --topic {topic}), "
    "enable auto.create.topics.enable on the broker, or route the table elsewhere with "
    "--topic-map/--fallback-topic"
)


class TopicCheck:
    """The topics a producer has found usable; each checked on first use."""

    def __init__(self, servers: str, health: BrokerHealth) -> None:
        """`servers` names Kafka in errors; `health` hears of each metadata answer."""
        self._servers = servers
        self._health = health
        self._checked: set[str] = set()

    def any_checked(self) -> str | None:
        """A topic known to exist (a small metadata request for a probe), or None."""
        return next(iter(self._checked), None)

    def forget(self) -> None:
        """Check every topic again (a new producer)."""
        self._checked.clear()

    def check(self, producer: Any, topic: str) -> None:
        """Once per topic: it exists (or the broker creates it), else a clear error."""
        if topic in self._checked:
            return
        deadline = time.monotonic() + TOPIC_CREATE_WAIT
        while True:
            error = self._topic_error(producer, topic)
            if error is None:
                break
            # A broker that creates topics on first use answers "unknown" (then "no
            # leader") for a moment after the first metadata request created the topic.
            waiting = error.code() in (
                KafkaError.UNKNOWN_TOPIC_OR_PART,
                KafkaError.LEADER_NOT_AVAILABLE,
            )
            if not waiting or time.monotonic() >= deadline:
                raise self._topic_unusable(producer, topic, error)
            time.sleep(0.2)
        self._checked.add(topic)

    def _topic_error(self, producer: Any, topic: str) -> KafkaError | None:
        try:
            metadata = producer.list_topics(topic, timeout=METADATA_TIMEOUT)
        except KafkaException as e:
            self._health.probe_failed(reason(e))
            raise SinkUnavailableError(
                f"cannot reach Kafka at {self._servers} to look up topic {topic!r}: {reason(e)}"
            ) from None
        self._health.reached()
        found = metadata.topics.get(topic)
        if found is None:
            return KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
        if found.error is None and not found.partitions:
            return KafkaError(KafkaError.LEADER_NOT_AVAILABLE)
        error: KafkaError | None = found.error
        return error

    def _topic_unusable(self, producer: Any, topic: str, error: KafkaError) -> SinkError:
        clash = self._colliding_topic(producer, topic)
        if clash is not None:
            return SinkError(
                f"Kafka topic {topic!r} cannot be created: it collides with the existing "
                f"topic {clash!r} (Kafka treats '.' and '_' alike in topic names); route "
                "the table elsewhere with --topic-map"
            )
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return SinkError(
                f"Kafka topic {topic!r} does not exist and the broker did not create it: "
                + _HOW_TO_CREATE.format(topic=topic)
            )
        if error.code() == KafkaError.LEADER_NOT_AVAILABLE:
            return SinkUnavailableError(f"Kafka topic {topic!r} has no leader yet")
        return SinkError(f"Kafka topic {topic!r} cannot be used: {error.str()}")

    def _colliding_topic(self, producer: Any, topic: str) -> str | None:
        """An existing topic that keeps Kafka from creating `topic` (topics.py), if any:
        the router sees only this process's tables, the broker every topic."""
        try:
            names = producer.list_topics(timeout=METADATA_TIMEOUT).topics
        except KafkaException:
            return None  # the error about the topic itself stands
        identity = kafka_identity(topic)
        return next((n for n in names if n != topic and kafka_identity(n) == identity), None)
