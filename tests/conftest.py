"""Shared fixtures: a real PostgreSQL per test session, a database per test.

The session starts its own throwaway PostgreSQL (initdb into a temporary
directory, wal_level=logical, free port) with the same helper `make
services` uses (scripts/services.py): the major $PG2SINK_TEST_PG_VERSION
names (14 to 18, default 15; `make test-compat PG_VERSION=N`). Each test gets
a fresh database and its own slot and publication names, all dropped
afterwards. `start_postgres` starts another server of any major for a test
that needs one of its own (a primary and a standby, a restart).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import services  # noqa: E402

# Tests keep no Spark class archive (imports/class_archive.py), in this process or the
# pg2sink processes they start: in a fresh clone each would record one, spending ~9 s of
# CPU at its exit beside the tests that follow (and a stopped process would wait for it).
# tests/imports/test_class_archive.py tests the archive in directories of its own.
os.environ.setdefault("PG2SINK_SPARK_CLASS_CACHE", "off")


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, alive or not yet reaped."""
    children, out, todo = _children(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _stop_spark_gateway() -> None:
    """pyspark keeps one gateway JVM per Python process (`SparkContext._gateway`) past
    every SparkSession.stop(), for the next session; it exits when its stdin closes,
    which would otherwise happen only as Python exits."""
    context = sys.modules.get("pyspark.context")
    gateway = getattr(getattr(context, "SparkContext", None), "_gateway", None)
    proc = getattr(gateway, "proc", None)
    if isinstance(proc, subprocess.Popen):
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Name each process the tests started and left behind (every test stops its own;
    the session's servers are stopped by now, the in-process Spark tests' gateway JVM
    here): Python would only say, at its exit, "subprocess N is still running", without
    what N is."""
    _stop_spark_gateway()
    left = []
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            # a zombie (exited, never waited for) has an empty command line: its name
            # and state come from /proc/PID/stat
            name, _, rest = Path(f"/proc/{pid}/stat").read_text().partition(") ")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            command = b" ".join(argv).decode(errors="replace").strip()[:300]
            left.append(f"{pid} {name.partition('(')[2]} [{rest[:1]}]: {command}")
    if left:
        print(
            f"\n{len(left)} processes the tests left behind (Z: exited, never waited for):",
            *left,
            sep="\n  ",
        )


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


#: The PostgreSQL major the session's server runs (PG2SINK_TEST_PG_VERSION, default 15).
PG_VERSION = services.postgres_version(os.environ.get("PG2SINK_TEST_PG_VERSION"))


#: Fixtures of servers other than PostgreSQL, the session's or a test's own (a broker,
#: nats-server, kinesalite, local-bigquery, a Spark cluster, Kafka Connect, Prometheus, a
#: primary and its standby) or of a wheel built into a virtualenv with Spark: a test that
#: takes one, directly or through another fixture, is not in `make test-fast`.
SERVER_FIXTURES = frozenset(
    {
        "kafka_stack",
        "nats_url",
        "kinesis_endpoint",
        "bigquery_endpoint",
        "spark_cluster",
        "own_kafka",
        "own_nats",
        "own_kinesalite",
        "own_bigquery",
        "own_cluster",
        "password_nats",
        "tls_nats",
        "debezium_server",
        "worker",
        "prometheus",
        "pair",
        "image_wheel",
    }
)

#: Tests left out of `make test-fast` although they take none of those fixtures and are
#: not marked `slow` (a folder, a module, or one test with its parameters): they start
#: Spark (an import with PG2SINK_NO_IMPORTS=0, pyspark, a JVM recording a class archive)
#: or servers of their own in the test's body (PostgreSQL pairs, every service), or took
#: over a minute of the fast tier's time (`make test-fast ARGS=--durations=20`).
FULL_ONLY = frozenset(
    {
        "tests/ha",
        "tests/test_services.py",
        "tests/imports/test_class_archive.py",
        "tests/imports/test_spark_daemon.py",
        "tests/imports/test_jobs.py::test_a_failing_job_records_its_error_and_backs_off",
        "tests/test_managed_role.py",
        "tests/test_versions.py::test_a_replica_identity_full_table_is_imported_then_streamed",
        "tests/imports/test_cli_import.py::test_reimport_on_demand_and_list",
        "tests/sinks/file/test_file_arrow_lines.py::test_every_code_point_is_escaped_as_orjson_does",
        "tests/sinks/nats/test_nats_config.py::test_bad_files_are_one_line_exit_2_without_their_secrets",
    }
)


def _fast(item: pytest.Item) -> bool:
    """Whether the test is in `make test-fast`: PostgreSQL only, no Spark, quick (not
    marked `slow`)."""
    if item.get_closest_marker("slow") is not None:
        return False
    if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return False
    node = item.nodeid
    return not any(
        node == prefix or node.startswith((f"{prefix}/", f"{prefix}::", f"{prefix}["))
        for prefix in FULL_ONLY
    )


#: PG2SINK_IMPL chooses the Avro encoder and the new-row reader (changelog/_cmodule.py).
#: Every test of these folders reaches the choice: the encoders and readers themselves,
#: the golden bytes, and the Kafka sink, whose Avro path encodes in process too.
IMPL_FOLDERS = ("tests/changelog/", "tests/logical/", "tests/golden/", "tests/sinks/kafka/")

#: Elsewhere, a test reaches it when it reads changes from PostgreSQL (a pg2sink process
#: or a pipeline in process): its rows go through the reader. A sink driven with records
#: built in the test (NATS, Kinesis, DuckDB, BigQuery, file, null) never calls either.
POSTGRES_FIXTURES = frozenset({"db", "pg_server", "pg_conn"})


def _reaches_impl(item: pytest.Item) -> bool:
    """Whether PG2SINK_IMPL can change what the test sees (`-m impl`, the Python-reference
    pass of `make test`)."""
    return item.nodeid.startswith(IMPL_FOLDERS) or bool(
        POSTGRES_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of the fast tier `fast` (`make test-fast` runs `-m fast`) and those
    PG2SINK_IMPL reaches `impl` (the Python-reference pass runs `-m impl`), and
    deselect the tests of a server feature the session's major lacks (`pg_since(N)`,
    e.g. column lists on 14): they cannot run there, and are not reported as skipped."""
    for item in items:
        if _fast(item):
            item.add_marker(pytest.mark.fast)
        if _reaches_impl(item):
            item.add_marker(pytest.mark.impl)
    lacking = [
        item
        for item in items
        if (mark := item.get_closest_marker("pg_since")) is not None and mark.args[0] > PG_VERSION
    ]
    if lacking:
        config.hook.pytest_deselected(items=lacking)
        items[:] = [item for item in items if item not in lacking]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Say which major the session runs on (with -q too: the matrix runs several)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"PostgreSQL {PG_VERSION} (PG2SINK_TEST_PG_VERSION) from "
            f"{services.postgres_bindir(PG_VERSION)}"
        )


@contextlib.contextmanager
def start_postgres(
    version: int = PG_VERSION, data: Path | None = None, **settings: str
) -> Iterator[services.Postgres]:
    """A PostgreSQL `version` server of its own on a free port, destroyed afterwards:
    initdb'ed, or started from the data directory `data` (moved in: a base backup,
    with standby.signal for a standby). `settings` are its postgresql.conf settings
    (as -c options) on top of services.POSTGRES_SETTINGS."""
    base = Path(tempfile.mkdtemp(prefix="pg2sink-test-"))
    base.chmod(0o755)  # the server may run as the postgres user (see services.py)
    server = services.Postgres(
        base=base / "pg", port=services.free_port(), settings=settings, version=version
    )
    try:
        if data is not None:
            server.base.mkdir()
            shutil.move(data, server.data)
        server.start()
        yield server
    finally:
        server.destroy()
        subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[services.Postgres]:
    with start_postgres() as server:
        yield server


@dataclass
class Database:
    """A fresh database with names reserved for one test."""

    server: services.Postgres
    name: str
    slot: str
    publication: str
    dsn: str
    conns: list[psycopg.Connection[TupleRow]] = field(default_factory=list)

    def connect(self, **kwargs: Any) -> psycopg.Connection[TupleRow]:
        conn = psycopg.connect(self.dsn, autocommit=True, **kwargs)
        self.conns.append(conn)
        return conn

    def slot_confirmed_lsn(self, slot: str | None = None) -> int | None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            row = c.execute(
                "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
                (slot or self.slot,),
            ).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def current_lsn(self) -> int:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            # insert, not write, position: with synchronous_commit=off the write
            # position can lag behind the last commit
            row = c.execute("SELECT pg_current_wal_insert_lsn() - '0/0'").fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
def db(pg_server: services.Postgres) -> Iterator[Database]:
    with fresh_database(pg_server) as testdb:
        yield testdb


@contextlib.contextmanager
def fresh_database(pg_server: services.Postgres) -> Iterator[Database]:
    """A new database with its own slot and publication names, dropped (slots too) on exit;
    the `db` fixture, usable by wider-scoped fixtures."""
    tag = uuid.uuid4().hex[:10]
    name = f"t_{tag}"
    admin_dsn = pg_server.dsn("postgres")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    testdb = Database(pg_server, name, f"slot_{tag}", f"pub_{tag}", pg_server.dsn(name))
    try:
        yield testdb
    finally:
        _drop_database(admin_dsn, testdb)


def _drop_database(admin_dsn: str, testdb: Database) -> None:
    name = testdb.name
    for conn in testdb.conns:
        conn.close()
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        for _ in range(50):
            admin.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE database = %s AND active_pid IS NOT NULL",
                (name,),
            )
            try:
                admin.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE database = %s",
                    (name,),
                )
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.1)
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def pg_conn(db: Database) -> psycopg.Connection[TupleRow]:
    """An autocommit connection to the test's own database."""
    return db.connect()


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a pg2sink process: none of the caller's PG*/PG2SINK_*
    variables but PG2SINK_IMPL, and the HTTP listener on a free port (tests run several
    at once).

    Imports are off (PG2SINK_NO_IMPORTS=1): tests that start pg2sink on tables holding
    rows would otherwise see IMPORT records and start Spark. tests/imports/ opts in
    with PG2SINK_NO_IMPORTS=0. The Spark class archive is off, as in this process (the
    note at the top)."""
    # PG2SINK_IMPL passes: the implementation under test (make test runs under each)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PG", "PG2SINK_")) or k == "PG2SINK_IMPL"
    }
    env["PG2SINK_METRICS_ADDRESS"] = "127.0.0.1:0"
    env["PG2SINK_RELAY_METRICS_ADDRESS"] = "127.0.0.1:0"
    env["PG2SINK_NO_IMPORTS"] = "1"
    env["PG2SINK_SPARK_CLASS_CACHE"] = "off"
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m pg2sink ARGS` to completion in clean_env() plus `env`."""
    return subprocess.run(
        [sys.executable, "-m", "pg2sink", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean_env(), **(env or {})},
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Complete JSON lines of a file (a torn last line from a kill is ignored)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n"):
        if not line:
            continue
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return out


@dataclass
class Pg2Sink:
    """A pg2sink process run as users run it: `python -m pg2sink ...`."""

    args: list[str]
    env: dict[str, str]
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    runs: int = 0

    @property
    def stderr_path(self) -> Path:
        return self.workdir / f"stderr.{self.runs}.log"

    def start(self) -> Pg2Sink:
        self.runs += 1
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pg2sink", *self.args],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=self.workdir,
            )
        return self

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_streaming(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"pg2sink exited {self.proc.returncode}:\n{self.stderr()}")
            return "pg2sink is streaming" in self.stderr()

        wait_for(ready, timeout, "pg2sink to start streaming")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def pg2sink_for(
    db: Database, workdir: Path, *extra: str, env: dict[str, str] | None = None
) -> Pg2Sink:
    """A (not started) pg2sink process on `db`'s database, slot and publication."""
    full_env = clean_env()
    full_env.update(
        {
            "PG2SINK_SOURCE": db.dsn,
            "PG2SINK_SLOT": db.slot,
            "PG2SINK_PUBLICATION": db.publication,
        }
    )
    full_env.update(env or {})
    return Pg2Sink(args=list(extra), env=full_env, workdir=workdir)


@pytest.fixture
def pg2sink_proc(db: Database, tmp_path: Path) -> Iterator[Callable[..., Pg2Sink]]:
    """Factory of pg2sink processes bound to the test database, stopped at teardown."""
    made: list[Pg2Sink] = []

    def make(*extra: str, env: dict[str, str] | None = None) -> Pg2Sink:
        p = pg2sink_for(db, tmp_path, *extra, env=env)
        made.append(p)
        return p

    yield make
    for p in made:
        if p.proc is not None and p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait(10)


# --- Kafka and the schema registry --------------------------------------------


@dataclass
class KafkaStack:
    """A Kafka broker (auto-creating topics) and a schema registry for the session."""

    bootstrap_servers: str
    registry_url: str
    kafka: services.Kafka | None = None
    """The broker when this session started it (None when reusing `make services`)."""


@pytest.fixture(scope="session")
def kafka_stack() -> Iterator[KafkaStack]:
    """Reuses KAFKA_BOOTSTRAP_SERVERS and SCHEMA_REGISTRY_URL when both are set (as
    `make services` writes them to .services/env), else starts both in a temp directory."""
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    url = os.environ.get("SCHEMA_REGISTRY_URL")
    if servers and url:
        yield KafkaStack(servers, url)
        return
    base = Path(tempfile.mkdtemp(prefix="pg2sink-kafka-"))
    kafka_port, controller_port, registry_port = services.free_ports(3)
    kafka = services.Kafka(base=base / "kafka", port=kafka_port, controller_port=controller_port)
    registry = services.SchemaRegistry(base=base / "registry", port=registry_port)
    try:
        kafka.start()
        registry.start()
        yield KafkaStack(kafka.bootstrap_servers, registry.url, kafka)
    finally:
        registry.stop()
        kafka.stop()
        subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture
def topic_prefix() -> str:
    """A topic prefix no other test uses (topics and subjects outlive a test)."""
    return f"t{uuid.uuid4().hex[:10]}"


# --- NATS with JetStream, and the Kinesis API (kinesalite) --------------------------------


@contextlib.contextmanager
def _env_or_own_server(
    variable: str,
    make: Callable[[Path, int], services.NatsServer | services.Kinesalite | services.LocalBigQuery],
) -> Iterator[str]:
    """The address in `variable` when set (`make services` writes it to .services/env),
    else that of a server `make(base, port)` started in a temp directory until exit."""
    address = os.environ.get(variable)
    if address:
        yield address
        return
    base = Path(tempfile.mkdtemp(prefix="pg2sink-services-"))
    server = make(base, services.free_port())
    try:
        server.start()
        yield server.address
    finally:
        server.stop()
        subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """`nats://127.0.0.1:PORT` of a nats-server with JetStream (file storage): NATS_URL
    when set, else one started for the session. Streams outlive a test: name them and
    their subjects after `topic_prefix`. A test that stops the server mid-stream starts
    its own services.NatsServer (its store survives a restart on the same port)."""
    with _env_or_own_server(
        "NATS_URL", lambda base, port: services.NatsServer(base=base / "nats", port=port)
    ) as url:
        yield url


@pytest.fixture(scope="session")
def kinesis_endpoint() -> Iterator[str]:
    """`http://127.0.0.1:PORT` of kinesalite, a Kinesis API server: KINESIS_ENDPOINT when
    set, else one started for the session. Clients sign with any credentials and region
    (services.KINESIS_CLIENT_ENV); a new stream is CREATING briefly before ACTIVE. Streams
    outlive a test: name them after `topic_prefix`."""
    with _env_or_own_server(
        "KINESIS_ENDPOINT",
        lambda base, port: services.Kinesalite(base=base / "kinesis", port=port),
    ) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def bigquery_endpoint() -> Iterator[str]:
    """`http://127.0.0.1:PORT` of local-bigquery, a BigQuery REST API server: BIGQUERY_ENDPOINT
    when set, else one started for the session. It takes anonymous credentials and any
    project; datasets outlive a test: name them after `topic_prefix`."""
    with _env_or_own_server(
        "BIGQUERY_ENDPOINT",
        lambda base, port: services.LocalBigQuery(base=base / "bigquery", port=port),
    ) as endpoint:
        yield endpoint


# --- A Spark standalone cluster -------------------------------------------------------


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[services.SparkCluster]:
    """A Spark standalone cluster on loopback (a master, two workers of one core each):
    `make services`' own (.services/spark) when SPARK_MASTER_URL names it, else one
    started for the session. Its `url` is the --spark-master of an import; tests reach
    its processes (`workers[i].pid()`) and web UIs (`master.state()`). A test that kills
    a worker starts it again before it ends."""
    url = os.environ.get("SPARK_MASTER_URL")
    if url and (services.DEFAULT_DIR / "spark.port").exists():
        shared = services.service_in(services.DEFAULT_DIR, "spark")
        if isinstance(shared, services.SparkCluster) and shared.url == url:
            yield shared
            return
    base = Path(tempfile.mkdtemp(prefix="pg2sink-spark-"))
    cluster = services.SparkCluster(base / "spark", services.free_ports(services.SERVICES["spark"]))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
        subprocess.run(["rm", "-rf", str(base)], check=False)
