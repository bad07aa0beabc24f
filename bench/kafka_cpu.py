"""CPU seconds per change of the Kafka-sink hot path, on captured frames.

bench/stream.py's wall-clock ratio moves with the machine's load, and callgrind cannot
follow librdkafka's threads and a real broker in useful time. This harness replays the
frames bench/callgrind_stream.py captured (the bench-stream workload, as the server sent
it) through the real Streamer -> ChangelogHandler -> ChangelogBuilder -> KafkaSink path,
against a real Kafka broker and schema registry started in a temporary directory, and
prints the CPU time it took per change: the whole process (main thread plus librdkafka's
threads) and the main thread alone. CPU time, unlike wall time, barely moves when other
programs share the machine, so two versions of the code can be compared on a busy one.

    .venv/bin/python bench/callgrind_stream.py capture /tmp/cgk --sizes 2000 100000
    .venv/bin/python bench/kafka_cpu.py /tmp/cgk/frames_100000.pickle --rounds 3

Each round uses topics of its own (a new --topic-prefix), so the schemas are registered
once per round; the round ends when the broker has acknowledged every message.
PG2SINK_KAFKA_CONFIG (KEY=VALUE,...) gives the sink --kafka-config settings, to compare
producer settings (`PG2SINK_KAFKA_CONFIG=compression.type=none make bench-kafka-cpu`).
"""

from __future__ import annotations

import argparse
import contextlib
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import services  # noqa: E402
from callgrind_stream import RecordedCatalog, kafka_sink, replay_frames  # noqa: E402
from common import cpu_seconds, start_kafka  # noqa: E402


def replay_round(
    saved: dict[str, object], bootstrap: str, registry: str
) -> tuple[float, float, float, int]:
    """(process CPU s, main-thread CPU s, wall s, changes) of one replay into fresh topics."""
    frames = [memoryview(b) for b in saved["frames"]]  # type: ignore[attr-defined]
    changes = sum(1 for b in frames if b[0] == ord("w") and bytes(b[25:26]) in (b"I", b"U"))
    sink = kafka_sink(bootstrap, registry, "cpu")  # PG2SINK_KAFKA_CONFIG: --kafka-config
    sink.open()
    process, thread, wall = time.process_time(), time.thread_time(), time.monotonic()
    # closing the handler flushes: every message acknowledged
    replay_frames(frames, RecordedCatalog(saved["catalog"]), sink)  # type: ignore[arg-type]
    return (
        time.process_time() - process,
        time.thread_time() - thread,
        time.monotonic() - wall,
        changes,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("frames", type=Path, help="a frames_N.pickle of callgrind_stream capture")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with args.frames.open("rb") as f:
        saved = pickle.load(f)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pg2sink-kcpu-")))
        target = start_kafka(services, tmp, stack)
        replay_round(saved, target.bootstrap_servers, target.registry_url)  # warm-up
        process: list[float] = []
        thread: list[float] = []
        broker: list[float] = []
        pid = target.broker_pid
        for _ in range(args.rounds):
            before = cpu_seconds(pid) if pid is not None else None
            p, t, w, changes = replay_round(saved, target.bootstrap_servers, target.registry_url)
            after = cpu_seconds(pid) if pid is not None else None
            process.append(p * 1e6 / changes)
            thread.append(t * 1e6 / changes)
            if before is not None and after is not None:
                broker.append((after - before) * 1e6 / changes)
            print(
                f"round: {p:.2f} s process, {t:.2f} s main thread, {w:.2f} s wall"
                f" (load-dependent), {changes:,} changes"
            )
    print(
        f"us of CPU per change (median of {args.rounds}): process "
        f"{statistics.median(process):.2f}, main thread {statistics.median(thread):.2f}"
        + (f"; the broker's {statistics.median(broker):.2f}" if broker else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
