"""RegistryClient against a real registry (Apicurio's Confluent-compatible API)."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pg2sink.errors import ConfigError, SinkError, SinkUnavailableError
from pg2sink.schema_registry import RegistryClient, key_subject, value_subject, wire_header
from pg2sink.schema_registry.client import fingerprint, redact_url
from tests.conftest import KafkaStack

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def record(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "value",
        "namespace": "public.t",
        "fields": [{"name": n, "type": ["null", t], "default": None} for n, t in fields],
        "pg.table": "t",
    }


@pytest.fixture
def registry_client(kafka_stack: KafkaStack) -> Iterator[Callable[..., RegistryClient]]:
    """Factory of clients, closed at teardown."""
    made: list[RegistryClient] = []

    def make(url: str | None = None, settings: dict[str, str] | None = None) -> RegistryClient:
        client = RegistryClient(url or kafka_stack.registry_url, settings)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def put_compatibility(url: str, subject: str, level: str) -> None:
    body = json.dumps({"compatibility": level}).encode()
    req = urllib.request.Request(
        f"{url}/config/{subject}", data=body, method="PUT", headers={"Content-Type": CONTENT_TYPE}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def test_subjects_and_wire_header() -> None:
    assert key_subject("pg2sink.public.t") == "pg2sink.public.t-key"
    assert value_subject("pg2sink.public.t") == "pg2sink.public.t-value"
    assert wire_header(1) == b"\x00\x00\x00\x00\x01"
    assert wire_header(0x01020304) == b"\x00\x01\x02\x03\x04"


def test_fingerprint_ignores_key_order() -> None:
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_redact_url_hides_the_password() -> None:
    assert redact_url("http://u:s3cret@h:8081/x") == "http://u:***@h:8081/x"
    assert redact_url("http://h:8081/x") == "http://h:8081/x"


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"no\.such"):
        RegistryClient("http://127.0.0.1:1", {"no.such": "1"})
    with pytest.raises(ConfigError, match="timeout: expected a number"):
        RegistryClient("http://127.0.0.1:1", {"timeout": "soon"})


@pytest.mark.slow
def test_register_returns_ids_cached_per_subject_and_shape(
    registry_client: Callable[..., RegistryClient],
) -> None:
    client = registry_client()
    subject = f"t{uuid.uuid4().hex[:8]}-value"
    v1 = record(("id", "int"))
    first = client.register(subject, v1)
    assert client.register(subject, json.loads(json.dumps(v1))) == first
    assert len(client._ids) == 1  # the second call did not ask the registry
    # a compatible new shape (a nullable field with a default) is a new version
    second = client.register(subject, record(("id", "int"), ("name", "string")))
    assert second != first
    # a new client (a restarted pg2sink) gets the same id back from the registry
    assert registry_client().register(subject, v1) == first


@pytest.mark.slow
def test_incompatible_schema_is_a_terminal_error_naming_the_subject(
    kafka_stack: KafkaStack, registry_client: Callable[..., RegistryClient]
) -> None:
    client = registry_client()
    subject = f"t{uuid.uuid4().hex[:8]}-value"
    client.register(subject, record(("id", "int")))
    put_compatibility(kafka_stack.registry_url, subject, "FULL")
    with pytest.raises(SinkError) as e:
        client.register(subject, record(("id", "string")))
    assert not e.value.retryable
    assert subject in str(e.value) and "incompatible" in str(e.value)


@pytest.mark.slow
def test_unreachable_registry_is_retryable(registry_client: Callable[..., RegistryClient]) -> None:
    client = registry_client("http://127.0.0.1:1/apis/ccompat/v7", {"max.retries": "0"})
    with pytest.raises(SinkUnavailableError, match="unreachable"):
        client.register("x-value", record(("id", "int")))


@pytest.mark.slow
def test_wrong_api_path_is_a_terminal_error_with_a_hint(
    kafka_stack: KafkaStack, registry_client: Callable[..., RegistryClient]
) -> None:
    root = kafka_stack.registry_url.removesuffix("/apis/ccompat/v7")
    client = registry_client(root + "/nope")
    with pytest.raises(SinkError) as e:
        client.register("x-value", record(("id", "int")))
    assert not e.value.retryable and "ccompat" in str(e.value)
