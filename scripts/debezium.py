#!/usr/bin/env python3
"""Debezium Server for `make bench-peers`: its distribution and a Java that runs it.

`python scripts/debezium.py` fetches `io.debezium:debezium-server-dist` (a tar.gz
holding the PostgreSQL connector and the Kafka sink) from Maven Central once into
the services cache (`~/.cache/pg2sink-services/debezium-server-<version>`, beside
Kafka's jars; never into the repository), checked against Central's SHA-1, and
prints the directory and the `java` it will run on.

Debezium 3.x is compiled for Java 21. The machine's default `java` is 17; a newer
JDK sits beside it (Debian's /usr/lib/jvm, e.g. temurin-25-jdk-amd64), so the
newest JDK there with a major version >= 21 is chosen explicitly ($DEBEZIUM_JAVA_HOME
first, then $JAVA_HOME when it is new enough). None: a one-line error.

DebeziumServer runs it as a services.Daemon in a directory of its own (its
config/application.properties, log and pid file), for tests.

Standard library only, like scripts/services.py, whose cache, lock and download
helpers it uses.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
import services

#: The newest debezium-server-dist that Maven Central lists in its metadata and serves
#: with a .sha1 here (3.6.1.Final's archive has no checksum file); $DEBEZIUM_VERSION
#: picks another.
VERSION = os.environ.get("DEBEZIUM_VERSION") or "3.6.0.Final"
MIN_JAVA = 21
#: The distribution ships Apicurio's Avro converter without Apache Avro itself
#: (NoClassDefFoundError: org/apache/avro/io/Encoder); the version Apicurio 3.1 is built on.
AVRO_VERSION = "1.12.0"
JVM_DIRS = (Path("/usr/lib/jvm"), Path("/usr/java"), Path("/opt/java"))


def java_major(java: Path) -> int | None:
    """The major version `java -version` reports (25 for "25.0.3"), or None."""
    try:
        res = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, check=False, timeout=30
        )
    except OSError:
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', res.stderr + res.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    # Java 8 and older say "1.8.0"
    return int(found.group(2) or 0) if major == 1 else major


def java_home(minimum: int = MIN_JAVA, what: str = f"Debezium Server {VERSION}") -> Path:
    """The newest JDK home whose bin/java is Java >= `minimum` among $DEBEZIUM_JAVA_HOME,
    $JAVA_HOME and those under /usr/lib/jvm (the default `java` is 17 on this kind of
    machine); `what` names who needs it in the error."""
    candidates: list[Path] = []
    for var in ("DEBEZIUM_JAVA_HOME", "JAVA_HOME"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]))
    for d in JVM_DIRS:
        if d.is_dir():
            candidates.extend(sorted(p for p in d.iterdir() if (p / "bin" / "java").exists()))
    best: tuple[int, Path] | None = None
    for home in candidates:
        major = java_major(home / "bin" / "java")
        if major is not None and major >= minimum and (best is None or major > best[0]):
            best = (major, home.resolve())
    if best is None:
        looked = ", ".join(str(c) for c in candidates) or "nothing"
        raise services.ServiceError(
            f"debezium: {what} needs Java {minimum}+; no such JDK found "
            f"(looked at {looked}); install one (e.g. temurin-25-jdk) or set DEBEZIUM_JAVA_HOME"
        )
    return best[1]


def server_dist() -> Path:
    """Debezium Server's unpacked distribution (its run.sh, lib/, conf/), fetched once."""
    dest = services.CACHE_DIR / f"debezium-server-{VERSION}"
    if (dest / ".complete").exists():
        return dest
    with services._cache_lock("debezium"):
        if (dest / ".complete").exists():
            return dest
        url = f"{services.MAVEN_CENTRAL.rstrip('/')}/io/debezium/debezium-server-dist/{VERSION}"
        url += f"/debezium-server-dist-{VERSION}.tar.gz"
        services._say(f"debezium: downloading {url} into {dest} (first run only)")
        with tempfile.TemporaryDirectory(dir=services.CACHE_DIR) as tmp:
            archive = Path(tmp) / "dist.tar.gz"
            services._download(url, archive, "debezium")
            with tarfile.open(archive) as tar:
                tar.extractall(Path(tmp) / "dist", filter="data")
            # the archive holds one top directory, debezium-server/
            (top,) = (Path(tmp) / "dist").iterdir()
            top.rename(dest)
        (dest / ".complete").touch()
    return dest


def avro_jar() -> Path:
    """org.apache.avro:avro's jar, fetched once beside the distribution (for the Avro
    converter: put it on the classpath with the distribution's lib/)."""
    dest = services.CACHE_DIR / f"avro-{AVRO_VERSION}.jar"
    if dest.exists():
        return dest
    with services._cache_lock("debezium"):
        if dest.exists():
            return dest
        url = f"{services.MAVEN_CENTRAL.rstrip('/')}/org/apache/avro/avro/{AVRO_VERSION}"
        url += f"/avro-{AVRO_VERSION}.jar"
        services._say(f"debezium: downloading {url} (first run only)")
        part = dest.with_suffix(".part")
        services._download(url, part, "debezium")
        part.rename(dest)
    return dest


@dataclass
class HttpServer(services.OnePortServer):
    """A Java server that runs when GET `ready_path` answers 200 (its readiness check)."""

    ready_path: ClassVar[str] = "/"

    def responds(self) -> bool:
        return services.answers_200(f"{self.url}{self.ready_path}")

    def running(self) -> bool:
        return super().running() and self.responds()


@dataclass
class DebeziumServer(HttpServer):
    """Debezium Server in `base` (its config/application.properties, log and pid file
    there), Quarkus's HTTP port on 127.0.0.1:`port`; `properties` are the
    application.properties beside the port (debezium.source.*, debezium.sink.*...)."""

    name: ClassVar[str] = "debezium"
    variable: ClassVar[str] = "DEBEZIUM_SERVER_URL"
    ready_timeout: ClassVar[float] = 180.0
    #: Quarkus's readiness check: UP once the connector has started
    ready_path: ClassVar[str] = "/q/health/ready"

    properties: dict[str, str] = field(default_factory=dict)
    avro: bool = False
    """Put Apache Avro on the class path (for Apicurio's Avro converter)."""

    def start(self) -> DebeziumServer:
        """What run.sh runs, from `base` (Quarkus reads config/ in the working directory)."""
        if self.running():
            return self
        self._stop_stale()
        dist, home = server_dist(), java_home()
        (self.base / "config").mkdir(parents=True, exist_ok=True)
        props = {**self.properties, "quarkus.http.port": str(self.port)}
        props.setdefault("quarkus.http.host", self.host)
        services._write_properties(self.base / "config" / "application.properties", props)
        runner = next(dist.glob("debezium-server-*runner.jar"))
        path = [str(runner), str(dist / "config" / "lib"), f"{dist / 'lib'}/*"]
        if self.avro:
            path.append(str(avro_jar()))
        cmd = [
            str(home / "bin" / "java"),
            f"-Dpg2sink.run.dir={self.base}{os.sep}",  # names `base`: Daemon.pid() checks
            "-cp",
            os.pathsep.join(path),
            "io.debezium.server.Main",
        ]
        self._spawn(cmd, self.responds)
        return self


def main() -> int:
    try:
        dist, home = server_dist(), java_home()
    except services.ServiceError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"debezium-server {VERSION}: {dist}")
    print(f"java {java_major(home / 'bin' / 'java')}: {home}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
