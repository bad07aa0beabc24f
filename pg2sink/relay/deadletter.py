"""--relay-dead-letter-topic: the messages the relay cannot read, set aside in a topic of
the cluster it reads, so that one bad message does not stop the others (docs/relay.md).

Each dead letter keeps the message's key, value and headers, and adds headers naming
where it came from and why: `pg2sink.dead_letter.topic`, `.partition`, `.offset` and
`.error`. The relay commits a batch's offsets only after the dead-letter topic
acknowledged the batch's dead letters (`flush`): a message is either relayed, or a dead
letter, or read again after a restart; never skipped.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import Message as KafkaMessage

from pg2sink.errors import ConfigError, SinkUnavailableError

__all__ = ["DeadLetters"]

#: the header names a dead letter gets
PREFIX = "pg2sink.dead_letter."


class DeadLetters:
    """The producer of the dead-letter topic."""

    def __init__(self, settings: dict[str, str], topic: str) -> None:
        self.topic = topic
        self.sent = 0
        self._failure: str | None = None
        try:
            # acks=all and idempotence: a dead letter is as durable as the message was
            self._producer = Producer(
                {**settings, "acks": "all", "enable.idempotence": "true", "linger.ms": "0"}
            )
        except (KafkaException, TypeError, ValueError) as e:
            raise ConfigError(f"invalid --relay-kafka-config for the dead letters: {e}") from None

    def put(self, msg: KafkaMessage, error: str) -> None:
        """Send `msg` (the consumer's) to the dead-letter topic, with `error`."""
        headers: list[tuple[str, str | bytes | None]] = [
            (str(h[0]), h[1]) for h in msg.headers() or []
        ]
        headers += [
            (PREFIX + "topic", msg.topic() or ""),
            (PREFIX + "partition", str(msg.partition())),
            (PREFIX + "offset", str(msg.offset())),
            (PREFIX + "error", error),
        ]
        self._producer.produce(
            self.topic, msg.value(), msg.key(), headers=headers, on_delivery=self._delivered
        )
        self._producer.poll(0)

    def _delivered(self, error: KafkaError | None, _msg: KafkaMessage) -> None:
        if error is not None:
            self._failure = error.str()
        else:
            self.sent += 1

    def flush(self, timeout: float) -> None:
        """Wait until every dead letter is acknowledged; SinkUnavailableError otherwise
        (the batch's offsets are then not committed)."""
        left = self._producer.flush(timeout)
        if self._failure is not None or left:
            reason = self._failure or f"{left} not acknowledged within {timeout:.0f} s"
            raise SinkUnavailableError(
                f"dead-letter topic {self.topic!r} did not take the batch's unreadable "
                f"messages ({reason}); its offsets are not committed"
            )
