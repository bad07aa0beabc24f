"""docker-compose.yml, checked without Docker: structure, mounts, flags, ports, names.

No Docker engine runs in CI, so this test reads the file and the configuration
it mounts and checks that the pieces agree with each other and with pg2sink:
every mounted file exists, every PG2SINK_* variable is a real flag, the
metrics address, the Prometheus scrape target and the Grafana data source
point at the right service and port, and the images are the versions the
test suite runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import cache
from pathlib import PurePosixPath
from typing import Any

import services
import yaml

from pg2sink.observability.http import parse_address
from tests.observability.support import DASHBOARDS, REPO, binary, load_dashboard

COMPOSE = REPO / "docker-compose.yml"

#: Flags the compose file sets before cli.py has them (the wiring of the metrics
#: listener is pending). Remove an entry once `pg2sink stream --help` lists it.


@cache
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def service(name: str) -> dict[str, Any]:
    svc: dict[str, Any] = compose()["services"][name]
    return svc


def env(name: str) -> dict[str, str]:
    return {k: str(v) for k, v in (service(name).get("environment") or {}).items()}


def mounts(name: str) -> dict[str, str]:
    """Container path → repository path of a service's bind mounts."""
    out = {}
    for volume in service(name).get("volumes", []):
        source, target = volume.split(":")[:2]
        out[target] = source
    return out


def published(name: str) -> dict[int, tuple[str, int]]:
    """Container port → (host address, host port) of a service."""
    out = {}
    for spec in service(name).get("ports", []):
        host, host_port, container = str(spec).rsplit(":", 2)
        out[int(container)] = (host, int(host_port))
    return out


def load_mounted(name: str, container_path: str) -> Any:
    return yaml.safe_load((REPO / mounts(name)[container_path]).read_text())


@cache
def stream_env_names() -> set[str]:
    """PG2SINK_* variables `pg2sink stream --help` documents ([env: ...] after each flag)."""
    res = subprocess.run(
        [sys.executable, "-m", "pg2sink", "stream", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert res.returncode == 0, res.stderr
    return set(re.findall(r"\[env:\s+(PG2SINK_[A-Z0-9_]+)\]", res.stdout))


def test_the_stack_is_there() -> None:
    assert set(compose()["services"]) == {
        "postgres",
        "kafka",
        "registry",
        "pg2sink",
        "prometheus",
        "grafana",
    }
    for name, svc in compose()["services"].items():
        for dep in svc.get("depends_on", []):
            assert dep in compose()["services"], (name, dep)


def test_every_mounted_file_exists_in_the_repository() -> None:
    count = 0
    for name in compose()["services"]:
        for target, source in mounts(name).items():
            assert source.startswith("./"), f"{name}: mount {source} is not a repository file"
            assert (REPO / source).is_file(), f"{name}: {source} (for {target}) does not exist"
            count += 1
    assert count >= 5
    build = service("pg2sink")["build"]
    assert (REPO / build / "Dockerfile").is_file()


def test_ports_are_published_on_loopback_only() -> None:
    for name in compose()["services"]:
        for container, (host, _) in published(name).items():
            assert host == "127.0.0.1", f"{name}: port {container} is published on {host}"


def test_pg2sink_environment_names_real_flags() -> None:
    known = stream_env_names()
    assert "PG2SINK_SOURCE" in known  # the help parser works
    for var in env("pg2sink"):
        if var.startswith("PG2SINK_"):
            assert var in known, f"{var} is not a flag of `pg2sink stream`"
    assert env("pg2sink")["PG2SINK_SINK"] == "kafka"


def test_pg2sink_reaches_the_other_services() -> None:
    pg = env("pg2sink")
    source = dict(item.split("=", 1) for item in pg["PG2SINK_SOURCE"].split())
    assert source["host"] == "postgres"
    assert source["user"] == env("postgres")["POSTGRES_USER"]
    assert source["dbname"] == env("postgres")["POSTGRES_DB"]
    assert pg["PGPASSWORD"] == env("postgres")["POSTGRES_PASSWORD"]
    assert "wal_level=logical" in service("postgres")["command"]

    assert pg["PG2SINK_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert "PLAINTEXT://kafka:9092" in env("kafka")["KAFKA_ADVERTISED_LISTENERS"]
    assert re.search(r"PLAINTEXT://:9092\b", env("kafka")["KAFKA_LISTENERS"])

    # Apicurio's Confluent-compatible API on its default port
    assert pg["PG2SINK_SCHEMA_REGISTRY_URL"] == "http://registry:8080/apis/ccompat/v7"
    assert 8080 in published("registry")


def test_prometheus_scrapes_the_metrics_address() -> None:
    host, port = parse_address(env("pg2sink")["PG2SINK_METRICS_ADDRESS"])
    assert host == "0.0.0.0", "inside the network pg2sink must listen beyond loopback"
    assert published("pg2sink")[port] == ("127.0.0.1", port)

    config = load_mounted("prometheus", "/etc/prometheus/prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # alerts.yml's Pg2sinkDown expects the job to be called pg2sink
    targets = [t for sc in jobs["pg2sink"]["static_configs"] for t in sc["targets"]]
    assert targets == [f"pg2sink:{port}"]

    # rule files resolve next to the configuration, where alerts.yml is mounted
    config_dir = PurePosixPath("/etc/prometheus")
    for rule_file in config["rule_files"]:
        path = str(config_dir / rule_file)
        assert mounts("prometheus")[path] == "./dashboards/alerts.yml"
    command = service("prometheus")["command"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in command


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    grafana_mounts = mounts("grafana")
    datasources = load_mounted("grafana", "/etc/grafana/provisioning/datasources/pg2sink.yml")
    (prom,) = datasources["datasources"]
    assert prom["type"] == "prometheus"
    assert prom["url"] == "http://prometheus:9090"  # Prometheus's default listen port
    assert 9090 in published("prometheus")
    # the dashboard's datasource variable defaults to this data source
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == prom["uid"]

    providers = load_mounted("grafana", "/etc/grafana/provisioning/dashboards/pg2sink.yml")
    (provider,) = providers["providers"]
    folder = PurePosixPath(provider["options"]["path"])
    dashboard_mount = str(folder / "pg2sink.json")
    assert grafana_mounts[dashboard_mount] == "./dashboards/pg2sink.json"
    home = env("grafana")["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == dashboard_mount


def test_images_are_the_versions_the_tests_run() -> None:
    assert service("registry")["image"] == f"apicurio/apicurio-registry:{services.APICURIO_VERSION}"
    pom = (REPO / "scripts" / "kafka" / "pom.xml").read_text()
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert match is not None
    assert service("kafka")["image"] == f"apache/kafka:{match.group(1)}"
    for name, svc in compose()["services"].items():
        if "image" in svc:
            assert ":" in svc["image"] and not svc["image"].endswith(":latest"), name


def test_the_prometheus_config_is_valid() -> None:
    res = subprocess.run(
        [binary("promtool"), "check", "config", str(DASHBOARDS / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
