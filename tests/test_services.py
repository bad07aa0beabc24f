"""scripts/services.py starts a real Kafka broker and a real schema registry.

The slow tests start both (jars fetched from Maven Central into a cache on
the first run) in a temporary directory, talk to the registry's
Confluent-compatible API with the standard library and round-trip a message
through the broker with confluent_kafka.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
import services

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def test_kafka_config_is_a_single_kraft_node() -> None:
    kafka = services.Kafka(base=Path("/nonexistent"), port=19092, controller_port=19093)
    config = kafka.config()
    assert config["process.roles"] == "broker,controller"
    assert config["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert config["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert config["offsets.topic.replication.factor"] == "1"
    assert config["transaction.state.log.min.isr"] == "1"
    assert kafka.env() == {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:19092"}


def test_free_ports_are_distinct() -> None:
    ports = services.free_ports(5)
    assert len(set(ports)) == 5


def _request(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": CONTENT_TYPE})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        return json.loads(r.read())


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[services.Kafka, services.SchemaRegistry]]:
    base = Path(tempfile.mkdtemp(prefix="pg2sink-services-"))
    kafka_port, controller_port, registry_port = services.free_ports(3)
    kafka = services.Kafka(base=base / "kafka", port=kafka_port, controller_port=controller_port)
    registry = services.SchemaRegistry(base=base / "registry", port=registry_port)
    try:
        kafka.start()
        registry.start()
        yield kafka, registry
    finally:
        registry.stop()
        kafka.stop()
        assert not kafka.running() and not registry.running()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_registry_registers_avro_schema(
    stack: tuple[services.Kafka, services.SchemaRegistry],
) -> None:
    _, registry = stack
    assert registry.url.endswith("/apis/ccompat/v7")
    schema = json.dumps({"type": "string"})
    got = _request(f"{registry.url}/subjects/t-value/versions", {"schema": schema})
    assert isinstance(got["id"], int)
    assert json.loads(_request(f"{registry.url}/schemas/ids/{got['id']}")["schema"]) == {
        "type": "string"
    }
    assert "t-value" in _request(f"{registry.url}/subjects")


@pytest.mark.slow
def test_kafka_round_trip(stack: tuple[services.Kafka, services.SchemaRegistry]) -> None:
    kafka, _ = stack
    topic = f"t-{uuid.uuid4().hex[:8]}"
    producer = ck.Producer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.produce(topic, key=b"k", value=b"hello")
    assert producer.flush(30) == 0
    consumer = ck.Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        msg = None
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None, msg and msg.error()
        assert (msg.key(), msg.value()) == (b"k", b"hello")
    finally:
        consumer.close()


@pytest.mark.slow
def test_cli_start_is_idempotent_and_stop_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "state"
    try:
        assert services.main(["start", "kafka", "registry", "--dir", str(directory)]) == 0
        env = services.read_env(directory / "env")
        assert env["KAFKA_BOOTSTRAP_SERVERS"].startswith("127.0.0.1:")
        assert env["SCHEMA_REGISTRY_URL"].endswith("/apis/ccompat/v7")
        assert "PGHOST" not in env
        assert services.main(["start", "kafka", "registry", "--dir", str(directory)]) == 0
        out = capsys.readouterr().out
        assert "kafka: already running" in out and "registry: already running" in out
    finally:
        assert services.main(["stop", "--dir", str(directory)]) == 0
    for name in ("kafka", "registry"):
        svc = services.service_in(directory, name)
        assert not svc.running(), name
