#!/usr/bin/env python3
"""Kafka Connect with Debezium's JDBC sink connector: pg2sink's `--format debezium`
topics read by a consumer nobody here wrote, into a PostgreSQL database.

    python scripts/kafka_connect.py fetch
    python scripts/kafka_connect.py jdbc-sink --bootstrap-servers 127.0.0.1:9092 \\
        --topics-regex 'app\\..*' --target postgresql://postgres@127.0.0.1:5432/copy

`fetch` brings, once, into the services cache (`~/.cache/pg2sink-services`, never the
repository): Kafka Connect's worker (Apache Kafka's connect-runtime and JSON converter,
resolved by Maven from scripts/kafka_connect/pom.xml at the broker's version of
scripts/kafka/pom.xml) and the connector's plugin archive
(`io.debezium:debezium-connector-jdbc:<version>:plugin.tar.gz` from Maven Central,
checked against its SHA-1; it holds the PostgreSQL driver). `jdbc-sink` runs a
standalone worker in the foreground (Ctrl-C stops it) with one JDBC sink connector.

The worker reads keys and values with JsonConverter and schemas.enable=true, which is
what `pg2sink stream --format debezium --debezium-schemas` writes; with
`--schema-registry-url` the connector reads Avro through the registry instead
(`--debezium-avro`), with Apicurio's AvroConverter (`fetch` puts it in a plugin
directory of its own, from the jars of Debezium Server's distribution: neither
Confluent's converter nor Apicurio's converter artifact is on Maven Central). The connector
upserts by the record key, deletes on `op: d` and truncates on `op: t`; a key change
is Debezium's DELETE then CREATE (pg2sink sends it so with --format debezium).

Debezium's 3.x connectors need Java 17 or newer (Debezium Server 21): the worker runs
on the newest JDK of those scripts/debezium.py looks at (Temurin 25 beside the default
Java 17 on this kind of machine). Tests use the
KafkaConnect class (a services.Daemon: its log and pid file in a directory of its own).
Standard library only, like scripts/services.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import debezium
import services

#: The JDBC sink of the Debezium line that scripts/debezium.py runs (3.6.1.Final is not
#: on Central for this artifact); $DEBEZIUM_JDBC_VERSION picks another.
JDBC_VERSION = os.environ.get("DEBEZIUM_JDBC_VERSION") or "3.6.0.Final"
CONNECT_POM = services.REPO / "scripts" / "kafka_connect" / "pom.xml"
CONNECTOR_CLASS = "io.debezium.connector.jdbc.JdbcSinkConnector"
MIN_JAVA = 17

LOG4J = services.KAFKA_LOG4J + (
    "logger.reflections.name = org.reflections\nlogger.reflections.level = ERROR\n"
)


def kafka_version() -> str:
    """The broker's Kafka version, read from scripts/kafka/pom.xml."""
    found = re.search(r"<kafka.version>([^<]+)</kafka.version>", services.KAFKA_POM.read_text())
    if found is None:
        raise services.ServiceError(f"connect: no <kafka.version> in {services.KAFKA_POM}")
    return found.group(1)


def connect_libs() -> Path:
    """The directory of Kafka Connect's worker jars, resolved by Maven once."""
    version = kafka_version()
    key = hashlib.sha256(CONNECT_POM.read_bytes() + version.encode()).hexdigest()[:12]
    dest = services.CACHE_DIR / f"kafka-connect-{key}"
    libs = dest / "libs"
    if (dest / ".complete").exists():
        return libs
    with services._cache_lock("kafka-connect"):
        if (dest / ".complete").exists():
            return libs
        mvn = shutil.which("mvn")
        if not mvn:
            raise services.ServiceError(
                "connect: `mvn` not found; it fetches Kafka Connect's jars from Maven Central "
                "(Debian: maven, `make setup`)"
            )
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        services._say(f"connect: resolving Kafka Connect {version} into {dest} (first run only)")
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(CONNECT_POM),
            f"-Dkafka.version={version}",
            f"-Dmaven.repo.local={services.CACHE_DIR / 'm2'}",
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={dest / 'libs.tmp'}",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0 or not list((dest / "libs.tmp").glob("connect-runtime-*.jar")):
            out = "\n".join((res.stdout + res.stderr).splitlines()[-30:])
            raise services.ServiceError(f"connect: Maven could not resolve Kafka Connect:\n{out}")
        (dest / "libs.tmp").rename(libs)
        (dest / ".complete").touch()
    return libs


def jdbc_plugin() -> Path:
    """A plugin.path directory holding Debezium's JDBC sink connector, fetched once."""
    dest = services.CACHE_DIR / f"debezium-connector-jdbc-{JDBC_VERSION}"
    if (dest / ".complete").exists():
        return dest
    with services._cache_lock("debezium-jdbc"):
        if (dest / ".complete").exists():
            return dest
        v = JDBC_VERSION
        url = f"{services.MAVEN_CENTRAL.rstrip('/')}/io/debezium/debezium-connector-jdbc/{v}"
        url += f"/debezium-connector-jdbc-{v}-plugin.tar.gz"
        services._say(f"connect: downloading {url} into {dest} (first run only)")
        shutil.rmtree(dest, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=services.CACHE_DIR) as tmp:
            archive = Path(tmp) / "plugin.tar.gz"
            services._download(url, archive, "connect")
            # the archive holds one directory, debezium-connector-jdbc/: the plugin
            with tarfile.open(archive) as tar:
                tar.extractall(Path(tmp) / "plugins", filter="data")
            (Path(tmp) / "plugins").rename(dest)
        (dest / ".complete").touch()
    return dest


#: the jars of Debezium Server's distribution that Apicurio's AvroConverter needs (by
#: name prefix): the converter and its registry client, Apache Avro's (avro_jar), and
#: what they use; Kafka's own classes come from the worker
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
_CONVERTER_JARS = (
    "apicurio-", "jackson-", "kiota-", "microsoft-kiota-", "std-uritemplate", "opentelemetry-",
    "commons-", "vertx-", "netty-",
)  # fmt: skip


def avro_converter_plugin() -> Path:
    """A plugin.path directory holding Apicurio's AvroConverter (Kafka Connect's Avro
    through a registry: Confluent's is not on Maven Central, nor is Apicurio's converter
    artifact), made once from Debezium Server's distribution (scripts/debezium.py)."""
    dest = services.CACHE_DIR / f"apicurio-converter-{debezium.VERSION}"
    if (dest / ".complete").exists():
        return dest
    lib = debezium.server_dist() / "lib"
    jars = [j for j in sorted(lib.glob("*.jar")) if j.name.startswith(_CONVERTER_JARS)]
    jars.append(debezium.avro_jar())
    with services._cache_lock("apicurio-converter"):
        if (dest / ".complete").exists():
            return dest
        shutil.rmtree(dest, ignore_errors=True)
        (dest / "apicurio-converter").mkdir(parents=True)
        for jar in jars:
            (dest / "apicurio-converter" / jar.name).symlink_to(jar)
        (dest / ".complete").touch()
    return dest


def avro_converters(registry_url: str) -> dict[str, str]:
    """A connector's key and value converters for Avro through the registry at
    `registry_url` (Confluent's API, /apis/ccompat/v7, or Apicurio's v3): the wire
    format's 4-byte id is the registry's content id, which its Confluent API answers."""
    url = registry_url.replace("/apis/ccompat/v7", "/apis/registry/v3")
    out: dict[str, str] = {}
    for part in ("key", "value"):
        out[f"{part}.converter"] = AVRO_CONVERTER
        out[f"{part}.converter.apicurio.registry.url"] = url
    return out


def java_home() -> Path:
    """The JDK the worker runs on (see the module docstring)."""
    return debezium.java_home(MIN_JAVA, f"Debezium's JDBC sink {JDBC_VERSION}")


def jdbc_url(dsn: str) -> tuple[str, str, str]:
    """A postgresql:// URL as the connector's (JDBC URL, user, password)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        raise ValueError("--target must be a postgresql://user@host:port/database URL")
    port = parts.port or 5432
    url = f"jdbc:postgresql://{parts.hostname}:{port}{parts.path or '/postgres'}"
    return url, parts.username or "postgres", parts.password or ""


def jdbc_sink_config(
    target: str, topics_regex: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The JDBC sink connector's settings: rows upserted by the record key into
    `<table>` of the target's default schema (the event's source.table), deletes and
    truncates applied, tables created and widened by the connector when missing."""
    url, user, password = jdbc_url(target)
    return {
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": "1",
        "topics.regex": topics_regex,
        "connection.url": url,
        "connection.username": user,
        "connection.password": password,
        "insert.mode": "upsert",
        "primary.key.mode": "record_key",
        "delete.enabled": "true",
        "truncate.enabled": "true",
        "schema.evolution": "basic",
        "collection.name.format": "${source.table}",
        # one batch per poll: the test's workload is small and latency matters more
        "batch.size": "500",
        **(extra or {}),
    }


@dataclass
class KafkaConnect(debezium.HttpServer):
    """A standalone Kafka Connect worker in `base`, its REST API on 127.0.0.1:`port`;
    connectors are added with `add` (POST /connectors)."""

    name: ClassVar[str] = "connect"
    variable: ClassVar[str] = "KAFKA_CONNECT_URL"
    ready_timeout: ClassVar[float] = 120.0
    ready_path: ClassVar[str] = "/connectors"

    bootstrap_servers: str = ""
    heap: str = "512m"
    settings: dict[str, str] = field(default_factory=dict)
    avro: bool = False
    """Also Apicurio's AvroConverter on the plugin path (avro_converter_plugin)."""

    def worker_config(self, plugins: str) -> dict[str, str]:
        """worker.properties: JSON with schemas (what --debezium-schemas writes), offsets
        in a file of `base`, the REST API on loopback only."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
            "offset.storage.file.filename": str(self.base / "offsets"),
            "offset.flush.interval.ms": "1000",
            "plugin.path": plugins,
            "plugin.discovery": "only_scan",
            "listeners": f"http://{self.host}:{self.port}",
            # a fresh consumer group reads each topic from its start
            "consumer.auto.offset.reset": "earliest",
            **self.settings,
        }

    def start(self) -> KafkaConnect:
        """Fetch what is missing, start the worker and wait until its REST API answers."""
        if self.running():
            return self
        self._stop_stale()
        libs, plugins, home = connect_libs(), [jdbc_plugin()], java_home()
        if self.avro:
            plugins.append(avro_converter_plugin())
        self.base.mkdir(parents=True, exist_ok=True)
        props = self.base / "worker.properties"
        services._write_properties(props, self.worker_config(",".join(map(str, plugins))))
        (self.base / "log4j2.properties").write_text(LOG4J)
        cmd = [
            str(home / "bin" / "java"),
            f"-Xmx{self.heap}",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:TieredStopAtLevel=1",  # starts faster; the test's load is small
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.base / 'log4j2.properties'}",
            "-cp",
            f"{libs}/*",
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(props),
        ]
        self._spawn(cmd, self.responds)
        return self

    def _request(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            e.close()
            raise services.ServiceError(f"connect: {method} {path}: {e.code} {detail}") from e
        return json.loads(text) if text else None

    def add(self, name: str, config: Mapping[str, str]) -> None:
        """Create connector `name` with `config`."""
        self._request("POST", "/connectors", {"name": name, "config": dict(config)})

    def status(self, name: str) -> dict[str, Any]:
        """GET /connectors/<name>/status: the connector's and its tasks' states."""
        out: dict[str, Any] = self._request("GET", f"/connectors/{name}/status")
        return out

    def failure(self, name: str) -> str | None:
        """The trace of a failed connector or task, None while none failed."""
        try:
            st = self.status(name)
        except services.ServiceError:
            return None  # not created yet
        for part in [st.get("connector", {}), *st.get("tasks", [])]:
            if part.get("state") == "FAILED":
                return str(part.get("trace") or part)
        return None


def _fetch() -> int:
    libs, plugin, home = connect_libs(), jdbc_plugin(), java_home()
    print(f"kafka connect {kafka_version()}: {libs}")
    print(f"debezium-connector-jdbc {JDBC_VERSION}: {plugin}")
    print(f"apicurio avro converter: {avro_converter_plugin()}")
    print(f"java {debezium.java_major(home / 'bin' / 'java')}: {home}")
    return 0


def _jdbc_sink(args: argparse.Namespace) -> int:
    try:
        extra = avro_converters(args.schema_registry_url) if args.schema_registry_url else {}
        config = jdbc_sink_config(args.target, args.topics_regex, extra)
    except ValueError as e:
        print(f"connect: {e}", file=sys.stderr)
        return 2
    base = Path(args.dir).resolve()
    worker = KafkaConnect(
        base=base,
        port=args.port or services.free_port(),
        bootstrap_servers=args.bootstrap_servers,
        avro=bool(args.schema_registry_url),
    )
    worker.start()
    worker.add(args.name, config)
    print(f"kafka connect: {worker.url}, connector {args.name}; log {worker.log}", flush=True)
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop and worker.running():
            trace = worker.failure(args.name)
            if trace:
                print(f"connect: connector {args.name} failed:\n{trace}", file=sys.stderr)
                return 1
            time.sleep(1)
    finally:
        worker.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="fetch the worker and the connector into the services cache")
    run = sub.add_parser("jdbc-sink", help="run a worker with the JDBC sink connector")
    run.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    run.add_argument("--topics-regex", required=True, help="the topics to read (a regex)")
    run.add_argument("--target", required=True, help="postgresql://user@host:port/database")
    run.add_argument(
        "--schema-registry-url",
        help="Avro topics (--format debezium --debezium-avro): the registry's URL "
        "(default: JSON with schemas, --debezium-schemas)",
    )
    run.add_argument("--name", default="pg2sink-jdbc-sink", help="the connector's name")
    run.add_argument("--dir", default=".connect", help="the worker's directory (log, offsets)")
    run.add_argument("--port", type=int, default=0, help="the REST API's port (default: free)")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            return _fetch()
        if not args.bootstrap_servers:
            parser.error("--bootstrap-servers (or KAFKA_BOOTSTRAP_SERVERS) is needed")
        return _jdbc_sink(args)
    except services.ServiceError as e:
        print(e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
