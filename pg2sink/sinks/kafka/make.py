"""Which Kafka sink --sink=kafka makes: the plain one, or with --exactly-once
(transactional.py) and --transaction-topic (txtopic.py), alone or together."""

from __future__ import annotations

from pg2sink.formats.debezium_keys import with_key_changes
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.sink import KafkaSink
from pg2sink.sinks.kafka.transactional import ExactlyOnceKafkaSink
from pg2sink.sinks.kafka.txtopic import TransactionTopicKafkaSink

__all__ = ["ExactlyOnceTransactionTopicKafkaSink", "kafka_sink"]


class ExactlyOnceTransactionTopicKafkaSink(TransactionTopicKafkaSink, ExactlyOnceKafkaSink):
    """Both: BEGIN and END records inside the Kafka transaction of their changes."""


def kafka_sink(cfg: KafkaConfig) -> KafkaSink:
    """The sink `cfg` asks for (not opened); with --format debezium, one that sends a key
    change as Debezium does (debezium.py)."""
    cls = _sink_class(cfg)
    return (with_key_changes(cls) if cfg.format == "debezium" else cls)(cfg)


def _sink_class(cfg: KafkaConfig) -> type[KafkaSink]:
    if cfg.exactly_once and cfg.transaction_topic:
        return ExactlyOnceTransactionTopicKafkaSink
    if cfg.exactly_once:
        return ExactlyOnceKafkaSink
    if cfg.transaction_topic:
        return TransactionTopicKafkaSink
    return KafkaSink
