"""Which Kafka sink --sink=kafka makes: the plain one or, with --exactly-once, the
transactional one (transactional.py); --transaction-topic is a part either holds
(txtopic.py)."""

from __future__ import annotations

from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.debezium import with_key_changes
from pg2sink.sinks.kafka.sink import KafkaSink
from pg2sink.sinks.kafka.transactional import ExactlyOnceKafkaSink

__all__ = ["kafka_sink"]


def kafka_sink(cfg: KafkaConfig) -> KafkaSink:
    """The sink `cfg` asks for (not opened); with --format debezium, one that sends a key
    change as Debezium does (debezium.py)."""
    cls = ExactlyOnceKafkaSink if cfg.exactly_once else KafkaSink
    return (with_key_changes(cls) if cfg.format == "debezium" else cls)(cfg)
