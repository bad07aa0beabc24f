"""Registering Avro schemas with a schema registry over Confluent's REST API.

`RegistryClient` wraps confluent-kafka's SchemaRegistryClient, which speaks the API that
Confluent Schema Registry serves and Apicurio Registry serves at /apis/ccompat/v7 (tested
against Apicurio 3.0.9). Registering is idempotent on the registry's side: the same schema
under the same subject gets the same id, so after a restart pg2sink registers again and
finds the ids it used before. Ids are cached per (subject, schema fingerprint), so the
registry sees one request per table shape, not per change.

Errors, by what the registry answered:

| answer                              | error                  | the stream         |
|-------------------------------------|------------------------|--------------------|
| 409 incompatible with the subject   | SinkError              | stops, exit 2      |
| 401, 403, 404, 422, other 4xx       | SinkError              | stops, exit 2      |
| 408, 429, 5xx; no answer (network)  | SinkUnavailableError   | retried (backoff)  |
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import orjson
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from pg2sink.errors import ConfigError, SinkError, SinkUnavailableError

log = logging.getLogger(__name__)


def _http_library() -> ModuleType:
    """The HTTP library confluent_kafka's registry client sends with: httpx2 where it is
    installed, else httpx (the client prefers httpx2 the same way). Its TransportError is
    what a refused connection, a timeout or a TLS failure raise; both are public API."""
    try:
        return importlib.import_module("httpx2")
    except ImportError:
        return importlib.import_module("httpx")


_HTTP = _http_library()
_TRANSPORT_ERROR: type[Exception] = _HTTP.TransportError

__all__ = ["RegistryClient", "SchemaRegistry", "redact_url"]

#: Client settings that take numbers (everything arrives from the command line as text).
_NUMERIC_SETTINGS: Mapping[str, type] = {
    "timeout": float,
    "max.retries": int,
    "retries.wait.ms": int,
    "retries.max.wait.ms": int,
    "cache.capacity": int,
    "cache.latest.ttl.sec": float,
}

_RETRYABLE_STATUS = frozenset((408, 429, 500, 502, 503, 504))

# How much of the registry's own explanation an error message keeps.
_REASON_CHARS = 400


class SchemaRegistry(Protocol):
    """What a sink needs from a schema registry."""

    def register(self, subject: str, schema: Mapping[str, Any]) -> int:
        """Register `schema` (Avro, as a dict) under `subject`; return its id."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def redact_url(url: str) -> str:
    """`url` without the password of its user info, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _client_config(url: str, settings: Mapping[str, str]) -> dict[str, Any]:
    conf: dict[str, Any] = {"url": url}
    for key, value in settings.items():
        kind = _NUMERIC_SETTINGS.get(key)
        try:
            conf[key] = kind(value) if kind is not None else value
        except ValueError:
            raise ConfigError(
                f"invalid --schema-registry-config {key}: expected a number, got {value!r}"
            ) from None
    return conf


def fingerprint(schema: Mapping[str, Any]) -> str:
    """A stable digest of a schema dict (key order does not matter)."""
    return hashlib.sha256(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)).hexdigest()


class RegistryClient:
    """SchemaRegistry over the Confluent-compatible REST API; see the module docstring."""

    def __init__(self, url: str, settings: Mapping[str, str] | None = None) -> None:
        self.url = redact_url(url)
        if not log.isEnabledFor(logging.DEBUG):
            # the HTTP library logs every request at INFO; register() logs what matters
            logging.getLogger(_HTTP.__name__).setLevel(logging.WARNING)
        try:
            self._client = SchemaRegistryClient(_client_config(url, settings or {}))
        except (ValueError, TypeError) as e:
            # unknown settings, malformed basic.auth.user.info, a URL with no scheme...
            raise ConfigError(f"invalid schema registry settings: {e}") from None
        self._ids: dict[tuple[str, str], int] = {}

    def register(self, subject: str, schema: Mapping[str, Any]) -> int:
        key = (subject, fingerprint(schema))
        schema_id = self._ids.get(key)
        if schema_id is not None:
            return schema_id
        text = orjson.dumps(schema).decode()
        try:
            schema_id = int(self._client.register_schema(subject, Schema(text, "AVRO")))
        except SchemaRegistryError as e:
            raise self._error(subject, e) from None
        except _TRANSPORT_ERROR as e:
            raise SinkUnavailableError(
                f"schema registry at {self.url} unreachable while registering subject "
                f"{subject!r}: {e or type(e).__name__}"
            ) from None
        self._ids[key] = schema_id
        log.info("registered schema id %d under subject %s", schema_id, subject)
        return schema_id

    def close(self) -> None:
        self._client.close()

    def _error(self, subject: str, e: SchemaRegistryError) -> SinkError:
        """The pg2sink error for a registry's refusal (see the module docstring)."""
        status = int(e.http_status_code)
        reason = str(e.error_message or "")[:_REASON_CHARS]
        if status == 409:
            return SinkError(
                f"schema registry rejected a new schema for subject {subject!r} as "
                f"incompatible with its earlier versions: {reason}. The change is not "
                "confirmed: make the registry accept the schema (relax the subject's "
                "compatibility, or delete the subject's versions), then restart pg2sink"
            )
        if status in _RETRYABLE_STATUS:
            return SinkUnavailableError(
                f"schema registry at {self.url} answered {status} for subject {subject!r}: {reason}"
            )
        hint = {
            401: "; check --schema-registry-config basic.auth.user.info",
            403: "; check the registry credentials' permissions",
            404: "; --schema-registry-url must be the Confluent-compatible API "
            "(Apicurio: http://HOST:PORT/apis/ccompat/v7)",
        }.get(status, "")
        return SinkError(
            f"schema registry at {self.url} refused subject {subject!r} ({status}): {reason}{hint}"
        )
