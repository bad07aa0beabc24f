"""The Kafka sink (--sink=kafka): Avro with a schema registry, or JSON.

    sink.py     KafkaSink: producing, delivery reports, failures
    acks.py     which checkpoints are durable (acknowledged by draining the producer)
    health.py   whether Kafka is reachable: evidence, hysteresis, one log line per change
    formats.py  message keys and values (Avro wire format or JSON) per table
    topics.py   table → topic routing (injective default names)

Imported only for --sink=kafka: confluent-kafka and fastavro are the [kafka] extra.
"""

from __future__ import annotations

from pg2sink.sinks.kafka.sink import KafkaSink

__all__ = ["KafkaSink"]
