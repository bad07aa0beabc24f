"""Where the relay finds Schema records: the registry (Avro), the schema topic (JSON).

Avro:
A wire-format message names its writer schema by id (decode.schema_id); the registry
gives the schema the producing pg2sink registered under that id (GET /schemas/ids/ID,
Confluent's API, which Apicurio serves at /apis/ccompat/v7 too). Ids never change their
schema, so each is fetched once.

JSON: `read_schema_topic` reads the producing pg2sink's --schema-topic from its start to
its end (a consumer of its own, no group, nothing committed): the latest Schema record of
each table.
"""

from __future__ import annotations

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.common._httpx_compat import httpx
from confluent_kafka.schema_registry.error import SchemaRegistryError

from pg2sink.changelog.records import Schema
from pg2sink.errors import ConfigError, SinkError, SinkUnavailableError
from pg2sink.relay.decode import Shape, json_record
from pg2sink.schema_registry.client import redact_url

__all__ = ["Shapes", "read_schema_topic"]

#: longest wait for the schema topic's metadata and each read, in seconds
_READ_WAIT = 10.0


class Shapes:
    """The Shape of each writer schema id, fetched from the registry once."""

    def __init__(self, url: str, settings: dict[str, str]) -> None:
        self.url = redact_url(url)
        try:
            self._client = SchemaRegistryClient({"url": url, **settings})
        except (ValueError, TypeError) as e:
            raise ConfigError(f"invalid schema registry settings: {e}") from None
        self._shapes: dict[int, Shape] = {}

    def get(self, schema_id: int) -> Shape:
        """The Shape of writer schema `schema_id`."""
        shape = self._shapes.get(schema_id)
        if shape is None:
            shape = self._shapes[schema_id] = Shape(orjson.loads(self._fetch(schema_id)))
        return shape

    def _fetch(self, schema_id: int) -> str:
        try:
            text = self._client.get_schema(schema_id).schema_str
        except SchemaRegistryError as e:
            raise SinkError(
                f"schema registry at {self.url} has no schema id {schema_id} "
                f"({e.http_status_code}): is --schema-registry-url the producer's registry?"
            ) from None
        except httpx.TransportError as e:
            raise SinkUnavailableError(
                f"schema registry at {self.url} unreachable: {e or type(e).__name__}"
            ) from None
        if not text:
            raise SinkError(f"schema id {schema_id} at {self.url} is empty")
        return str(text)

    def close(self) -> None:
        self._client.close()


def read_schema_topic(settings: dict[str, str], topic: str) -> dict[tuple[str, str], Schema]:
    """The latest Schema record of each table in `topic` (partition 0, the Kafka sink's
    only one: it creates no other), read to its end; SinkUnavailableError when the
    broker does not answer."""
    conf = {k: v for k, v in settings.items() if not k.startswith("enable.auto")}
    consumer = Consumer(
        {**conf, "group.id": "pg2sink-relay-schemas", "enable.auto.commit": "false"}
    )
    found: dict[tuple[str, str], Schema] = {}
    try:
        part = TopicPartition(topic, 0)
        _, high = consumer.get_watermark_offsets(part, timeout=_READ_WAIT)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        position = 0
        while position < high:
            msg = consumer.poll(_READ_WAIT)
            if msg is None:
                raise SinkUnavailableError(f"schema topic {topic!r} not read to its end")
            if msg.error() is not None:
                continue
            position = (msg.offset() or 0) + 1
            value = msg.value()
            record = None if value is None else json_record(value)
            if isinstance(record, Schema):
                found[record.namespace, record.name] = record
    except KafkaException as e:
        raise SinkUnavailableError(f"cannot read schema topic {topic!r}: {e}") from None
    finally:
        consumer.close()
    return found
