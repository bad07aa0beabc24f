"""Which Kafka sink --sink=kafka makes: the plain one, or with --exactly-once
(transactional.py) and --transaction-topic (txtopic.py), alone or together."""

from __future__ import annotations

from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.sink import KafkaSink
from pg2sink.sinks.kafka.transactional import ExactlyOnceKafkaSink
from pg2sink.sinks.kafka.txtopic import TransactionTopicKafkaSink

__all__ = ["ExactlyOnceTransactionTopicKafkaSink", "kafka_sink"]


class ExactlyOnceTransactionTopicKafkaSink(TransactionTopicKafkaSink, ExactlyOnceKafkaSink):
    """Both: BEGIN and END records inside the Kafka transaction of their changes."""


def kafka_sink(cfg: KafkaConfig) -> KafkaSink:
    """The sink `cfg` asks for (not opened)."""
    if cfg.exactly_once and cfg.transaction_topic:
        return ExactlyOnceTransactionTopicKafkaSink(cfg)
    if cfg.exactly_once:
        return ExactlyOnceKafkaSink(cfg)
    if cfg.transaction_topic:
        return TransactionTopicKafkaSink(cfg)
    return KafkaSink(cfg)
