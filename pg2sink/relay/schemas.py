"""The writer schemas of consumed messages, by id, from the schema registry.

A wire-format message names its writer schema by id (decode.schema_id); the registry
gives the schema the producing pg2sink registered under that id (GET /schemas/ids/ID,
Confluent's API, which Apicurio serves at /apis/ccompat/v7 too). Ids never change their
schema, so each is fetched once.
"""

from __future__ import annotations

import orjson
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.common._httpx_compat import httpx
from confluent_kafka.schema_registry.error import SchemaRegistryError

from pg2sink.errors import ConfigError, SinkError, SinkUnavailableError
from pg2sink.registry.client import redact_url
from pg2sink.relay.decode import Shape

__all__ = ["Shapes"]


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
