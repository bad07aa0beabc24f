"""Instructions per change of the file-sink (or Kafka-sink) hot path, under callgrind.

Wall-clock benchmarks (bench/stream.py) move with the machine's load; the number
of instructions pg2sink executes for a fixed input does not (it repeats to within
a fraction of a percent). This harness measures it for the bench-stream workload.

1. `capture DIR`: start a throwaway PostgreSQL (scripts/services.py), create the
   bench table (bench/stream.py's schema and row expressions), and for each size
   run bench/stream.py's workload scaled down (5/8 of the changes in one INSERT
   transaction, 5/16 in one UPDATE transaction, 1/16 as single-row transactions,
   the proportions of bench-stream) on a fresh table and slot, then read every
   CopyData message of it from the slot with pg2sink's ReplicationStream. Saved
   in DIR/frames_<changes>.pickle: the raw frames (XLogData and keepalives, as
   the server sent them) and the answers of the catalog (pg_type rows, primary
   key) the changelog asked while they were replayed once against the live
   server. Sizes: 2,000 and 12,000 changes by default.
2. `replay FILE OUT`: feed the frames through the real Streamer ->
   ChangelogHandler -> ChangelogBuilder -> FileSink path, writing OUT (a JSON-lines
   file, as `pg2sink --sink file` would), with no server: the stream object hands
   out the captured frames, the catalog answers from the recording.
3. `measure DIR`: run `replay` under `valgrind --tool=callgrind` for both sizes
   and print (Ir(large) - Ir(small)) / (large - small): instructions per change,
   with interpreter start-up, imports and the Relation message cancelled out.
   Also prints the SHA-256 of each output file, so a change that must not alter
   the records can be checked byte for byte against the figure before it.
   `--sink kafka`: the same replays through the Kafka sink (Avro) into the broker
   and registry of .services/env (`make services`), topics of a fresh prefix,
   PG2SINK_KAFKA_CONFIG as KEY=VALUE,... for --kafka-config; callgrind counts
   every thread (the main thread's count printed apart: librdkafka's threads'
   share moves a little with timing, ~1% between runs). `--sink nats`: the
   same into the nats-server of .services/env (JSON, a stream of a fresh prefix,
   deleted after; the main thread's count is the sink's side, the loop thread's
   moves with timing). `--sink null`: the source side alone (decoding and the
   changelog), every record discarded.

    .venv/bin/python bench/callgrind_stream.py capture /tmp/cg
    .venv/bin/python bench/callgrind_stream.py measure /tmp/cg
    .venv/bin/python bench/callgrind_stream.py measure /tmp/cg --sink kafka
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from pg2sink.catalog.types import PgType  # noqa: E402
from pg2sink.subscription.handlers import ChangelogHandler  # noqa: E402
from pg2sink.subscription.loop import StopRequested, Streamer  # noqa: E402

DEFAULT_SIZES = (2000, 12000)
#: --sink: the file sink, or the Kafka sink (Avro) on the services of .services/env
SINKS = ("file", "kafka", "nats", "null")


def _sizes_for(changes: int) -> tuple[int, int, int]:
    """(insert rows, update rows, single-row transactions) in bench-stream's 10:5:1."""
    small = changes // 16
    update = changes * 5 // 16
    return changes - update - small, update, small


class RecordingCatalog:
    """A live catalog whose answers are kept, so a replay needs no server."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.types: dict[int, PgType] = {}
        self.keys: dict[int, tuple[str, ...]] = {}
        self.partitions: dict[int, bool] = {}

    def pg_type(self, oid: int) -> PgType:
        t: PgType = self.inner.pg_type(oid)
        self.types[oid] = t
        return t

    def invalidate_type(self, oid: int) -> None:
        self.inner.invalidate_type(oid)

    def primary_key(self, relid: int) -> tuple[str, ...]:
        k: tuple[str, ...] = self.inner.primary_key(relid)
        self.keys[relid] = k
        return k

    def is_partition(self, relid: int) -> bool:
        p: bool = self.inner.is_partition(relid)
        self.partitions[relid] = p
        return p


class RecordedCatalog:
    """The answers a RecordingCatalog kept (CatalogLookup)."""

    def __init__(self, recorded: dict[str, Any]) -> None:
        self.types: dict[int, PgType] = recorded["types"]
        self.keys: dict[int, tuple[str, ...]] = recorded["keys"]
        self.partitions: dict[int, bool] = recorded["partitions"]

    def pg_type(self, oid: int) -> PgType:
        return self.types[oid]

    def invalidate_type(self, oid: int) -> None:
        pass

    def primary_key(self, relid: int) -> tuple[str, ...]:
        return self.keys[relid]

    def is_partition(self, relid: int) -> bool:
        return self.partitions.get(relid, False)


class ReplayStream:
    """The Streamer's FrameSource, serving captured frames."""

    def __init__(self, frames: Sequence[Any], stop: StopRequested) -> None:
        self._frames: Iterator[Any] = iter(frames)
        self._stop = stop
        self.sent = 0

    def get_copy_data(self, _async: int) -> tuple[int, Any]:
        frame = next(self._frames, None)
        if frame is None:  # all replayed: stop as after SIGTERM (final flush, status)
            self._stop.requested = True
            return 0, b""
        return len(frame), frame

    def ended(self) -> NoReturn:
        raise AssertionError("a replay never ends the copy")

    def wait(self, timeout: float, extra_fds: Sequence[int] = ()) -> None:
        pass

    def send(self, payload: bytes) -> None:
        self.sent += 1


def replay_frames(frames: Sequence[memoryview], catalog: Any, sink: Any) -> None:
    """Feed `frames` through the real Streamer -> ChangelogHandler -> `sink` (opened)
    with `catalog` answering, then close the handler (which flushes the sink)."""
    handler = ChangelogHandler(catalog, sink)
    stop = StopRequested()
    Streamer(
        ReplayStream(frames, stop),
        handler,
        heartbeat_interval=10.0,
        flush_interval=1.0,
        stop=stop,
    ).run()
    handler.close()


def replay(frames_file: Path, out: Path, sink_name: str = "file") -> None:
    with frames_file.open("rb") as f:
        saved = pickle.load(f)
    # as the C libpq wrapper hands them out (memoryview), made before the run
    frames = [memoryview(b) for b in saved["frames"]]
    sink: Any
    if sink_name == "kafka":
        # the services of .services/env (make services)
        sink = kafka_sink(
            os.environ["KAFKA_BOOTSTRAP_SERVERS"], os.environ["SCHEMA_REGISTRY_URL"], "cg"
        )
    elif sink_name == "nats":
        # the nats-server of .services/env, a stream of a fresh prefix (deleted after)
        sink = nats_sink(os.environ["NATS_URL"], "cg")
    elif sink_name == "null":
        # the source side alone: decoding and the changelog, every record discarded
        from pg2sink.sinks.null import NullSink

        sink = NullSink()
    else:
        from pg2sink.sinks.file import FileSink

        sink = FileSink(str(out))
    sink.open()
    replay_frames(frames, RecordedCatalog(saved["catalog"]), sink)
    if sink_name == "nats":
        asyncio.run(_delete_nats_stream(os.environ["NATS_URL"], sink.cfg.stream))


def kafka_sink(bootstrap: str, registry: str, prefix: str) -> Any:
    """A Kafka sink (Avro) into topics of a fresh prefix `prefix_<random>`, --kafka-config
    from PG2SINK_KAFKA_CONFIG (KEY=VALUE,...); not opened."""
    import uuid

    from pg2sink.sensitive import Settings
    from pg2sink.sinks.kafka.config import KafkaConfig
    from pg2sink.sinks.kafka.sink import KafkaSink

    extra = os.environ.get("PG2SINK_KAFKA_CONFIG", "")
    cfg = KafkaConfig(
        bootstrap,
        producer=Settings.parse([s for s in extra.split(",") if s], "PG2SINK_KAFKA_CONFIG"),
        topic_prefix=f"{prefix}_{uuid.uuid4().hex[:8]}",
        schema_registry_url=registry,
    )
    return KafkaSink(cfg)


def nats_sink(url: str, prefix: str) -> Any:
    """A NATS sink (JSON) into the stream of a fresh subject prefix; not opened."""
    import uuid

    from pg2sink.sinks.nats.config import NatsConfig
    from pg2sink.sinks.nats.sink import NatsSink

    return NatsSink(
        NatsConfig(nats_url=url, nats_subject_prefix=f"{prefix}_{uuid.uuid4().hex[:8]}")
    )


async def _delete_nats_stream(url: str, stream: str) -> None:
    import nats

    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        await nc.jetstream(timeout=5).delete_stream(stream)
    finally:
        await nc.close()


def capture(directory: Path, sizes: Sequence[int]) -> None:
    import psycopg
    import stream  # bench/stream.py: the same table, rows and workload
    from psycopg import sql

    from pg2sink.catalog.catalog import Catalog
    from pg2sink.subscription.connection import ReplicationStream

    directory.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO / "scripts"))
    import services  # scripts/services.py

    table: str = stream.TABLE  # type: ignore[attr-defined]
    publication: str = stream.PUBLICATION
    with tempfile.TemporaryDirectory(prefix="pg2sink-cg-") as tmp:
        os.chmod(tmp, 0o755)  # the server runs as its own user when we are root
        server = services.Postgres(base=Path(tmp) / "pg", port=services.free_port())
        server.start()
        try:
            conn = psycopg.connect(server.dsn(), autocommit=True)
            for changes in sizes:
                slot = f"cg_{changes}"
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
                conn.execute(
                    sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication))
                )
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE {} (id int8 PRIMARY KEY, name text, amount numeric(12,2),"
                        " at timestamptz, flag bool, doc jsonb)"
                    ).format(sql.Identifier(table))
                )
                conn.execute(
                    sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                        sql.Identifier(publication), sql.Identifier(table)
                    )
                )
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
                stream.run_workload(conn, stream.Sizes(*_sizes_for(changes)))
                frames = _read_slot(server.dsn(), slot, publication, changes, ReplicationStream)
                recording = RecordingCatalog(Catalog(conn))
                # one replay against the live catalog records its answers
                target = directory / f"frames_{changes}.pickle"
                with target.open("wb") as f:
                    pickle.dump({"frames": frames, "catalog": {}}, f)
                _replay_live(target, recording)
                saved_catalog: dict[str, Any] = {
                    "types": recording.types,
                    "keys": recording.keys,
                    "partitions": recording.partitions,
                }
                with target.open("wb") as f:
                    pickle.dump({"frames": frames, "catalog": saved_catalog}, f)
                xlog = sum(1 for b in frames if b[0] == ord("w"))
                print(f"{target}: {len(frames)} frames ({xlog} XLogData), {changes} changes")
            conn.close()
        finally:
            server.destroy()


def _replay_live(frames_file: Path, catalog: RecordingCatalog) -> None:
    from pg2sink.sinks.file import FileSink

    with frames_file.open("rb") as f:
        frames = [memoryview(b) for b in pickle.load(f)["frames"]]  # as libpq hands them out
    with tempfile.TemporaryDirectory() as tmp:
        sink = FileSink(os.path.join(tmp, "out.jsonl"))
        sink.open()
        replay_frames(frames, catalog, sink)


def _read_slot(dsn: str, slot: str, publication: str, changes: int, stream_cls: Any) -> list[bytes]:
    """Every CopyData message from the slot up to the Commit after its `changes`-th change."""
    import psycopg

    from pg2sink.logical.copydata import (
        XLOG_DATA_HEADER,
        PrimaryKeepalive,
        parse_copy_data,
        standby_status_update,
    )
    from pg2sink.logical.fastpath import commit_end_lsn
    from pg2sink.logical.lsn import now_pg_timestamp

    stream = stream_cls(psycopg.connect(dsn, autocommit=True, replication="database"))
    stream.start(slot, publication)
    frames: list[bytes] = []
    seen = 0
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            buf = stream.read()
            if buf is None:
                stream.wait(1.0)
                continue
            data = bytes(buf)
            frames.append(data)
            if data[0] != ord("w"):
                ka = parse_copy_data(data)
                if isinstance(ka, PrimaryKeepalive) and ka.reply_requested:
                    stream.send(standby_status_update(ka.wal_end, 0, 0, now_pg_timestamp()))
                continue
            payload = data[XLOG_DATA_HEADER.size :]
            if payload[:1] in (b"I", b"U", b"D"):
                seen += 1
            elif seen >= changes and commit_end_lsn(payload) is not None:
                return frames
        raise RuntimeError(f"slot {slot}: {changes} changes did not arrive in 300 s")
    finally:
        stream.close()


def _callgrind_ir(frames_file: Path, out: Path, work: Path, sink: str) -> tuple[int, int]:
    """(Ir of the whole process, Ir of its main thread) of one replay under callgrind."""
    cg_out = work / f"callgrind.{frames_file.stem}.out"
    for old in work.glob(f"{cg_out.name}*"):
        old.unlink()
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            # one file per thread: the main thread's count apart from librdkafka's
            "--separate-threads=yes",
            f"--callgrind-out-file={cg_out}",
            sys.executable,
            __file__,
            "replay",
            str(frames_file),
            str(out),
            "--sink",
            sink,
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    totals: dict[int, int] = {}
    for path in work.glob(f"{cg_out.name}*"):
        thread = re.search(r"-(\d+)$", path.name)
        with path.open() as f:
            for line in f:
                m = re.match(r"(?:summary|totals): (\d+)", line)
                if m:
                    totals[int(thread.group(1)) if thread else 1] = int(m.group(1))
                    break
    if 1 not in totals:
        raise RuntimeError(f"no totals in {cg_out}*")
    return sum(totals.values()), totals[1]


def measure(directory: Path, sizes: Sequence[int], sink: str = "file") -> None:
    small, large = sorted(sizes)
    irs: dict[int, tuple[int, int]] = {}
    for n in (small, large):
        frames_file = directory / f"frames_{n}.pickle"
        out = directory / f"out_{n}.jsonl"
        out.unlink(missing_ok=True)
        irs[n] = _callgrind_ir(frames_file, out, directory, sink)
        if sink == "file":
            digest = hashlib.sha256(out.read_bytes()).hexdigest()[:16]
            lines = out.read_bytes().count(b"\n")
            print(f"{n:>6} changes: Ir {irs[n][0]:,}  output {lines} lines sha256 {digest}")
        else:
            print(f"{n:>6} changes: Ir {irs[n][0]:,} (main thread {irs[n][1]:,})")
    per_change = (irs[large][0] - irs[small][0]) / (large - small)
    main_thread = (irs[large][1] - irs[small][1]) / (large - small)
    print(f"instructions per change: {per_change:,.0f} (main thread {main_thread:,.0f})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("capture", help="capture the frames of both sizes into DIR")
    p.add_argument("dir", type=Path)
    p.add_argument("--sizes", type=int, nargs=2, default=DEFAULT_SIZES)
    p = sub.add_parser("replay", help="feed one capture through the file sink path")
    p.add_argument("frames", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--sink", choices=SINKS, default="file")
    p = sub.add_parser("measure", help="instructions per change under callgrind")
    p.add_argument("dir", type=Path)
    p.add_argument("--sizes", type=int, nargs=2, default=DEFAULT_SIZES)
    p.add_argument("--sink", choices=SINKS, default="file")
    args = parser.parse_args(argv)
    if args.command == "capture":
        capture(args.dir, args.sizes)
    elif args.command == "replay":
        replay(args.frames, args.out, args.sink)
    else:
        measure(args.dir, args.sizes, args.sink)
    return 0


if __name__ == "__main__":
    sys.exit(main())
