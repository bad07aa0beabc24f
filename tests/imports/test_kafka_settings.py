"""The Kafka import's producer settings: lz4 unless --kafka-config chose a compression."""

from __future__ import annotations

from pg2sink.sensitive import Settings
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.imports import import_settings
from pg2sink.sinks.kafka.producer import producer_settings


def _settings(**given: str) -> dict[str, str]:
    cfg = KafkaConfig("127.0.0.1:9092", producer=Settings(given))
    return producer_settings(KafkaConfig("127.0.0.1:9092", producer=import_settings(cfg)))


def test_lz4_by_default_and_the_users_choice_kept() -> None:
    default = _settings(**{"linger.ms": "7"})
    assert default["compression.type"] == "lz4"
    assert default["linger.ms"] == "7"
    assert default["acks"] == "all" and default["enable.idempotence"] == "true"
    assert _settings(**{"compression.type": "none"})["compression.type"] == "none"
    # librdkafka's other name for it: no second, conflicting setting
    chosen = _settings(**{"compression.codec": "zstd"})
    assert chosen["compression.codec"] == "zstd" and "compression.type" not in chosen
