"""The Kafka sink's producer settings: the user's --kafka-config checked against what
pg2sink's guarantees rest on; librdkafka's log, its errors by what they mean, their text."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError

from pg2sink.errors import ConfigError, SinkError, SinkUnavailableError
from pg2sink.sinks.kafka.config import KafkaConfig

__all__ = [
    "HOW_TO_RAISE_LIMITS",
    "PRODUCER_DEFAULTS",
    "REQUIRED_SETTINGS",
    "TERMINAL",
    "TOO_LARGE",
    "TROUBLE",
    "LibrdkafkaLog",
    "delivery_error",
    "producer_settings",
    "reason",
]

#: Producer settings pg2sink's guarantees rest on: no duplicates from librdkafka's own
#: retries, no reordering, and an ack only once every in-sync replica has the message;
#: reports of failed deliveries only (acks.py: successes are seen by draining).
REQUIRED_SETTINGS = {
    "enable.idempotence": "true",
    "acks": "all",
    "delivery.report.only.error": "true",
}
_SETTING_ALIASES = {"request.required.acks": "acks"}
#: Producer settings of the stream and of imports unless --kafka-config sets them (under
#: either of librdkafka's names, _DEFAULT_ALIASES). lz4: less CPU for the broker, the
#: same for the producer, a faster run and a topic a third of the size; zstd costs the
#: producer more for the same; a longer linger.ms gains nothing (`make bench-stream
#: ARGS="--sink kafka"` and `make bench-import ARGS="--sink kafka"`, with this default
#: and with compression.type=none).
PRODUCER_DEFAULTS = {"compression.type": "lz4"}
_DEFAULT_ALIASES = {"compression.type": ("compression.codec",)}
#: Producer settings pg2sink cannot work with, and why (named without their value).
_UNSUPPORTED = {
    # a transactional producer refuses produce() outside a transaction ("Erroneous
    # state"): pg2sink opens transactions only with --exactly-once (transactional.py)
    "transactional.id": "pg2sink does not use Kafka transactions but with "
    "--exactly-once, whose id is --transactional-id; remove it",
}
_ACKS_ALL = frozenset(("all", "-1"))


class LibrdkafkaLog:
    """librdkafka's own log lines, at DEBUG: error_cb reports what users need to know,
    once per change of state, instead of a line per failed connection attempt."""

    def __init__(self) -> None:
        self._log = logging.getLogger("pg2sink.sinks.kafka.sink.librdkafka")

    def log(self, level: int, msg: str, *args: Any) -> None:
        self._log.debug(msg, *args)


def producer_settings(cfg: KafkaConfig) -> dict[str, str]:
    """The librdkafka settings: PRODUCER_DEFAULTS for what the user's leave unset, the
    user's, then the ones pg2sink requires (and --exactly-once's transactional.id)."""
    settings = {"client.id": "pg2sink"}
    if cfg.bootstrap_servers:
        settings["bootstrap.servers"] = cfg.bootstrap_servers
    given = cfg.producer.reveal()
    for name, value in PRODUCER_DEFAULTS.items():
        if not any(n in given for n in (name, *_DEFAULT_ALIASES.get(name, ()))):
            settings[name] = value
    for key, value in given.items():
        name = _SETTING_ALIASES.get(key, key)
        if name in _UNSUPPORTED:
            raise ConfigError(f"--kafka-config {key} is not supported: {_UNSUPPORTED[name]}")
        required = REQUIRED_SETTINGS.get(name)
        if required is not None and not _same_setting(name, value, required):
            raise ConfigError(
                f"--kafka-config {key}={value} is not supported: pg2sink needs "
                f"{name}={required} to confirm only what Kafka holds durably, in order"
            )
        settings[key] = value
    settings.update(REQUIRED_SETTINGS)
    if cfg.exactly_once and cfg.transactional_id:
        # the stream's transactional producer (transactional.py); imports produce with
        # a config without --exactly-once (imports.py)
        settings["transactional.id"] = cfg.transactional_id
    return settings


def _same_setting(name: str, value: str, required: str) -> bool:
    value = value.strip().lower()
    if name == "acks":
        return value in _ACKS_ALL
    return value == required


def delivery_error(error: KafkaError, topic: str, size: int) -> SinkError:
    """The error of a message of `size` key and value bytes Kafka did not accept:
    SinkError when sending it again cannot help, else SinkUnavailableError (a replay)."""
    text = f"Kafka did not accept a message for topic {topic!r}: {error.str()}"
    if error.code() in TOO_LARGE:
        return SinkError(f"{text} ({size:,} bytes): {HOW_TO_RAISE_LIMITS}")
    if error.code() in TERMINAL:
        return SinkError(text)
    return SinkUnavailableError(
        f"{text}; resending from the last confirmed position (at-least-once)"
    )


def reason(e: BaseException) -> str:
    """The text of a confluent-kafka exception (a KafkaError inside) or any other."""
    arg = e.args[0] if e.args else None
    if isinstance(arg, KafkaError):
        return str(arg.str())
    return str(e)


# librdkafka errors (error_cb) that may mean "Kafka is unreachable": health.BrokerHealth
# looks before it concludes, and logs each change of state once.
TROUBLE = frozenset(
    (
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TRANSPORT,
        KafkaError._RESOLVE,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
    )
)

# Delivery errors that the same message would hit again after a reconnect.
TERMINAL = frozenset(
    (
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError._INVALID_ARG,
    )
)

TOO_LARGE = frozenset((KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE))

#: Both limits a large message meets: the producer's own check, then the broker's.
HOW_TO_RAISE_LIMITS = (
    "raise the producer's limit with --kafka-config message.max.bytes=BYTES (default "
    "1000000) and the broker's, the topic setting max.message.bytes (default: the "
    "broker's message.max.bytes, 1048588), above the message's size; the change stays "
    "unconfirmed and is sent again after a restart"
)
