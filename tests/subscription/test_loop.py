"""The replication loop's schedule, without a server: a scripted FrameSource on a fake clock.

The frames are captured pgoutput bytes (tests/logical/golden.py) in the replication
protocol's XLogData and keepalive framing
(https://www.postgresql.org/docs/current/protocol-replication.html); only the LSNs of
Begin, Commit and keepalives are re-packed so that a script can hold many transactions.
They go through the real Streamer and ChangelogHandler into a recording sink whose
acknowledgements arrive when the test says, on the same fake clock.
"""

from __future__ import annotations

import itertools
import logging
import random
import struct
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, NoReturn

import pytest

from pg2sink.catalog.types import PgType
from pg2sink.changelog.records import Modification, Record
from pg2sink.logical import Begin, Commit, PrimaryKeepalive, XLogData, decode, parse_copy_data
from pg2sink.logical.copydata import XLOG_DATA_HEADER, CopyDataTag
from pg2sink.subscription.handlers import ChangelogHandler
from pg2sink.subscription.loop import StopRequested, Streamer
from tests.logical import golden as g

T0: Final = 1000.0
#: Begin: Byte1('B'), Int64 final LSN, Int64 commit time, Int32 xid
_BEGIN: Final = struct.Struct(">cQqI")
#: Commit: Byte1('C'), Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit time
_COMMIT: Final = struct.Struct(">cBQQq")
#: Primary keepalive: Byte1('k'), Int64 WAL end, Int64 send time, Byte1 reply requested
_KEEPALIVE: Final = struct.Struct(">BQqB")
#: Standby status update: Byte1('r'), Int64 write, flush, apply, Int64 send time, Byte1 reply
_STATUS: Final = struct.Struct(">BQQQqB")


def xlogdata(payload: bytes, lsn: int, send_time: int = 0) -> bytes:
    """An XLogData frame around a pgoutput message that starts at `lsn`."""
    return XLOG_DATA_HEADER.pack(CopyDataTag.XLOG_DATA, lsn, lsn, send_time) + payload


def keepalive(wal_end: int, reply: bool = False, send_time: int = 0) -> bytes:
    """A Primary keepalive frame."""
    return _KEEPALIVE.pack(CopyDataTag.PRIMARY_KEEPALIVE, wal_end, send_time, int(reply))


def begin(final_lsn: int) -> bytes:
    """The captured Begin with another final LSN."""
    _, _, commit_time, xid = _BEGIN.unpack(g.BEGIN)
    return _BEGIN.pack(b"B", final_lsn, commit_time, xid)


def commit(lsn: int, end_lsn: int) -> bytes:
    """The captured Commit with other commit and end LSNs."""
    _, flags, _, _, commit_time = _COMMIT.unpack(g.COMMIT)
    return _COMMIT.pack(b"C", flags, lsn, end_lsn, commit_time)


def test_frame_builders_give_the_captured_bytes() -> None:
    """The builders above re-pack fields of captured frames, and nothing else."""
    xlog = parse_copy_data(g.XLOGDATA_BEGIN)
    assert isinstance(xlog, XLogData)
    assert xlogdata(g.BEGIN, xlog.data_start, xlog.send_time) == g.XLOGDATA_BEGIN
    for frame in (g.KEEPALIVE, g.KEEPALIVE_REPLY_REQUESTED):
        ka = parse_copy_data(frame)
        assert isinstance(ka, PrimaryKeepalive)
        assert keepalive(ka.wal_end, ka.reply_requested, ka.send_time) == frame
    captured_begin = decode(g.BEGIN)
    captured_commit = decode(g.COMMIT)
    assert isinstance(captured_begin, Begin) and isinstance(captured_commit, Commit)
    assert begin(captured_begin.final_lsn) == g.BEGIN
    assert commit(captured_commit.commit_lsn, captured_commit.end_lsn) == g.COMMIT
    assert decode(commit(0x2000, 0x2030)) == Commit(0, 0x2000, 0x2030, captured_commit.commit_time)
    assert _STATUS.unpack(g.STANDBY_STATUS_UPDATE)[0] == CopyDataTag.STANDBY_STATUS_UPDATE


class FakeClock:
    """Monotonic seconds that move only when the scripted source waits."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


TEXT: Final = PgType(oid=25, name="text", namespace="pg_catalog", kind="b", category="S")


class SixCatalog:
    """CatalogLookup for the captured table `six` (six text columns, no primary key)."""

    def pg_type(self, oid: int) -> PgType:
        assert oid == TEXT.oid, oid
        return TEXT

    def invalidate_type(self, oid: int) -> None:
        pass

    def primary_key(self, relid: int) -> tuple[str, ...]:
        return ()

    def is_partition(self, relid: int) -> bool:
        return False


#: what happened, in order: ("ack", lsn) when the sink returns an acknowledgement,
#: ("status", flush LSN) when the loop sends a Standby status update
Events = list[tuple[str, int]]


class RecordingSink:
    """A Sink that keeps its records and acknowledges each flush `delay()` seconds of
    the fake clock after it started (in order, as files and Kafka do).

    `flush()` waits for everything, unless `gives_up` (Kafka's bound on waiting
    passed): then it returns only what was acknowledged by then."""

    def __init__(
        self,
        clock: FakeClock,
        events: Events,
        delay: Callable[[], float] = lambda: 0.0,
        gives_up: bool = False,
    ) -> None:
        self.clock = clock
        self.events = events
        self.delay = delay
        self.gives_up = gives_up
        self.records: list[Record] = []
        self.checkpointed = 0
        #: (time, checkpoint) of each start_flush
        self.flush_starts: list[tuple[float, int]] = []
        self._in_flight: deque[tuple[float, int]] = deque()
        self._acked = 0

    def open(self) -> None:
        pass

    def write(self, record: Record) -> None:
        self.records.append(record)

    def checkpoint(self, lsn: int) -> None:
        assert lsn > self.checkpointed, "checkpoints only move forward"
        self.checkpointed = lsn

    def start_flush(self) -> None:
        now = self.clock.now
        self.flush_starts.append((now, self.checkpointed))
        last = self._in_flight[-1][0] if self._in_flight else now
        self._in_flight.append((max(now + self.delay(), last), self.checkpointed))

    def acknowledged(self) -> int | None:
        while self._in_flight and self._in_flight[0][0] <= self.clock.now:
            self._ack(self._in_flight.popleft()[1])
        return self._acked or None

    def _ack(self, lsn: int) -> None:
        if lsn > self._acked:
            self._acked = lsn
            self.events.append(("ack", lsn))

    def pending_bytes(self) -> int:
        return 0

    def flush(self) -> int | None:
        if not self.gives_up:
            self._in_flight.clear()
            self._ack(self.checkpointed)
        return self.acknowledged()

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Status:
    """A Standby status update the loop sent."""

    time: float
    write: int
    flush: int


class ScriptedSource:
    """A FrameSource playing (arrival time, frame) pairs on the fake clock.

    A frame is readable once the clock has reached its arrival time; `wait` moves the
    clock to the next arrival or the loop's timeout, whichever comes first. After the
    last frame, at `stop_at`, it asks the loop to stop (as SIGTERM does)."""

    def __init__(
        self,
        clock: FakeClock,
        script: list[tuple[float, bytes]],
        stop: StopRequested,
        stop_at: float,
        events: Events,
    ) -> None:
        assert [t for t, _ in script] == sorted(t for t, _ in script)
        self.clock = clock
        self.frames = deque(script)
        self.stop = stop
        self.stop_at = max(stop_at, script[-1][0] if script else T0)
        self.events = events
        self.statuses: list[Status] = []
        self._waits = 0

    def get_copy_data(self, async_: int, /) -> tuple[int, memoryview]:
        if self.frames and self.frames[0][0] <= self.clock.now:
            frame = self.frames.popleft()[1]
            return len(frame), memoryview(frame)
        return 0, memoryview(b"")

    def ended(self) -> NoReturn:
        raise AssertionError("the script never ends the copy")

    def wait(self, timeout: float, extra_fds: object = ()) -> None:
        self._waits += 1
        assert self._waits < 1_000_000, "the loop keeps waiting without getting anywhere"
        until = self.clock.now + max(timeout, 0.0)
        next_event = self.frames[0][0] if self.frames else self.stop_at
        self.clock.now = max(self.clock.now, min(until, next_event))
        if not self.frames and self.clock.now >= self.stop_at:
            self.stop.requested = True

    def send(self, payload: bytes) -> None:
        tag, write, flush, apply, _, reply = _STATUS.unpack(payload)
        assert (tag, apply, reply) == (CopyDataTag.STANDBY_STATUS_UPDATE, flush, 0)
        self.statuses.append(Status(self.clock.now, write, flush))
        self.events.append(("status", flush))


class Script:
    """Builds a timed script of frames: transactions of the captured `six` insert, and
    keepalives, at LSNs that only grow."""

    def __init__(self) -> None:
        self.frames: list[tuple[float, bytes]] = []
        self.lsn = 0x1_0000
        self._relation_sent = False
        #: inserts sent, committed or not (the builder writes each as it comes)
        self.inserts = 0
        #: (arrival time of the Commit, end LSN) of each transaction
        self.commits: list[tuple[float, int]] = []
        self._open = False
        #: the positions a restart may resume from: commit ends, and keepalive
        #: positions while no transaction was open
        self.boundaries: set[int] = set()

    def open_transaction(self, at: float) -> None:
        """Begin and one insert (with the Relation before the first)."""
        self._open = True
        self.frames.append((at, xlogdata(begin(self.lsn + 0x100), self.lsn)))
        if not self._relation_sent:
            self._relation_sent = True
            self.frames.append((at, xlogdata(g.RELATION_SIX, 0)))
        self.frames.append((at, xlogdata(g.INSERT_SIX, self.lsn + 0x10)))
        self.inserts += 1

    def commit(self, at: float) -> int:
        """The open transaction's Commit; its end LSN."""
        end = self.lsn + 0x130
        self.frames.append((at, xlogdata(commit(self.lsn + 0x100, end), self.lsn + 0x100)))
        self.commits.append((at, end))
        self.boundaries.add(end)
        self._open = False
        self.lsn = end + 0x10
        return end

    def transaction(self, at: float) -> int:
        self.open_transaction(at)
        return self.commit(at)

    def keepalive(self, at: float, reply: bool = False) -> int:
        """A keepalive at the server's current position (past every commit so far)."""
        self.lsn += 0x8
        self.frames.append((at, keepalive(self.lsn, reply)))
        if not self._open:
            self.boundaries.add(self.lsn)
        return self.lsn


@dataclass
class Run:
    """One run of the loop over a script: what the sink and the server saw."""

    sink: RecordingSink
    source: ScriptedSource
    events: Events


@contextmanager
def stop_flag() -> Iterator[StopRequested]:
    stop = StopRequested()
    try:
        yield stop
    finally:
        stop.close()


def run(
    script: Script,
    *,
    stop_at: float,
    flush_interval: float = 10.0,
    heartbeat_interval: float = 100.0,
    delay: Callable[[], float] = lambda: 0.0,
    gives_up: bool = False,
) -> Run:
    """Run the real Streamer and ChangelogHandler over `script` until `stop_at`."""
    clock = FakeClock()
    events: Events = []
    sink = RecordingSink(clock, events, delay, gives_up)
    with stop_flag() as stop:
        source = ScriptedSource(clock, script.frames, stop, stop_at, events)
        Streamer(
            source,
            ChangelogHandler(SixCatalog(), sink),
            heartbeat_interval=heartbeat_interval,
            flush_interval=flush_interval,
            stop=stop,
            clock=clock,
        ).run()
    assert not source.frames, "the loop stopped before the end of the script"
    return Run(sink, source, events)


def confirmed_at(r: Run, lsn: int) -> float:
    """When a status first confirmed `lsn` (or past it)."""
    return next(s.time for s in r.source.statuses if s.flush >= lsn)


def test_early_flushes_follow_commits_at_most_ten_per_flush_interval() -> None:
    script = Script()
    for i in range(20):  # a commit every 0.25 s, the stream caught up after each
        script.transaction(T0 + 0.1 + 0.25 * i)
    r = run(script, stop_at=T0 + 6, flush_interval=10.0)

    starts = [t for t, _ in r.sink.flush_starts]
    assert len(r.sink.records) == 21  # a Schema, then one Modification per transaction
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps and min(gaps) >= 1.0 - 1e-9  # flush_interval / 10 apart at the closest
    assert len(starts) == 6  # one per second after the first commit, none at the deadline
    for arrived, end in script.commits:
        # each commit is flushed and confirmed within the spacing, not at the 10 s deadline
        flushed = next(t for t, lsn in r.sink.flush_starts if lsn >= end)
        assert arrived <= flushed <= arrived + 1.0 + 1e-9
        assert confirmed_at(r, end) == flushed


def test_no_early_flush_while_frames_keep_arriving() -> None:
    script = Script()
    ends = [script.transaction(T0 + 1) for _ in range(3)]  # one burst: never caught up
    script.transaction(T0 + 1.5)
    r = run(script, stop_at=T0 + 5, flush_interval=10.0)

    # one flush after the burst, covering all three; the next waits for the spacing
    assert r.sink.flush_starts[0] == (T0 + 1, ends[-1])
    assert r.sink.flush_starts[1][0] == T0 + 2


def test_flush_deadline_without_early_flushes() -> None:
    script = Script()
    script.open_transaction(T0 + 1)
    r = run(script, stop_at=T0 + 25, flush_interval=10.0)

    # nothing confirmable (a transaction is open): only the deadline flushes
    assert [t for t, _ in r.sink.flush_starts] == [T0 + 10, T0 + 20]


def test_idle_stream_confirms_keepalive_positions() -> None:
    script = Script()
    positions = [script.keepalive(T0 + s) for s in (1, 2, 3)]
    r = run(script, stop_at=T0 + 4)

    # no transaction: each keepalive position is flushed and confirmed as it arrives
    for s, lsn in zip((1, 2, 3), positions, strict=True):
        assert confirmed_at(r, lsn) == T0 + s
    assert r.sink.records == []


def test_keepalive_inside_a_transaction_is_not_confirmed() -> None:
    script = Script()
    first = script.transaction(T0 + 1)
    script.open_transaction(T0 + 3)
    inside = script.keepalive(T0 + 4)
    end = script.commit(T0 + 6)
    r = run(script, stop_at=T0 + 8)

    assert confirmed_at(r, first) == T0 + 1
    # the keepalive's position is past the open transaction's changes: confirming it
    # would skip them after a restart
    assert [s.flush for s in r.source.statuses if T0 + 4 <= s.time < T0 + 6] == []
    assert inside < end and confirmed_at(r, inside) == confirmed_at(r, end) == T0 + 6


def test_keepalive_asking_for_a_reply_is_answered_at_once() -> None:
    script = Script()
    done = script.transaction(T0 + 1)
    script.open_transaction(T0 + 2)
    script.keepalive(T0 + 3)
    asked = script.keepalive(T0 + 4, reply=True)
    end = script.commit(T0 + 4)  # already buffered behind the keepalive
    r = run(script, stop_at=T0 + 6, heartbeat_interval=100.0)

    # the plain keepalive gets no status (none due: the heartbeat interval is 100 s)
    assert [s for s in r.source.statuses if T0 + 2 <= s.time < T0 + 4] == []
    # the one asking gets one before the next frame is read: it confirms the last
    # commit, not the one buffered behind it
    [reply] = [s for s in r.source.statuses if s.time == T0 + 4]
    assert (reply.write, reply.flush) == (asked, done)
    # the reply's flush counts in the early-flush spacing: the commit waits a second
    assert confirmed_at(r, end) == T0 + 5


def test_keepalive_reply_while_the_sink_has_not_acknowledged() -> None:
    script = Script()
    end = script.transaction(T0 + 1)
    asked = script.keepalive(T0 + 2, reply=True)
    r = run(script, stop_at=T0 + 3, delay=lambda: 30.0)

    reply = next(s for s in r.source.statuses if s.time == T0 + 2)
    # the server hears how far the stream has read, and that nothing is durable yet
    assert (reply.write, reply.flush) == (asked, 0)
    assert end < asked


@pytest.mark.parametrize("gives_up", [False, True])
def test_final_status_confirms_exactly_what_the_sink_acknowledged(gives_up: bool) -> None:
    script = Script()
    first = script.transaction(T0 + 1)
    last = script.transaction(T0 + 12)
    # the first flush is acknowledged after 5 s, later ones not before the stop
    delays = iter([5.0] + [1000.0] * 10)
    r = run(script, stop_at=T0 + 15, delay=lambda: next(delays), gives_up=gives_up)

    final = r.source.statuses[-1]
    assert final.time == T0 + 15
    # a sink that waited for everything acknowledged the last commit; one that gave up
    # only the first: the final status says exactly that, never more
    assert final.flush == (first if gives_up else last)
    assert [lsn for kind, lsn in r.events if kind == "ack"][-1] == final.flush
    assert final.write >= last


def _random_script(rng: random.Random) -> tuple[Script, float]:
    """Transactions, keepalives (some asking for a reply) and idle gaps in random order."""
    script = Script()
    now = T0
    open_ = False
    for _ in range(rng.randrange(1, 25)):
        now += rng.choice((0.0, 0.0, 0.01, 0.3, 1.5, 12.0))
        kind = rng.random()
        if kind < 0.4:
            if open_:
                script.commit(now)
            else:
                script.open_transaction(now)
            open_ = not open_
        elif kind < 0.6:
            script.transaction(now)
        else:
            script.keepalive(now, reply=rng.random() < 0.3)
    return script, now + rng.choice((0.0, 0.5, 30.0))


@pytest.mark.parametrize("seed", range(200))
def test_never_confirms_past_what_the_sink_acknowledged(seed: int) -> None:
    rng = random.Random(seed)
    script, stop_at = _random_script(rng)
    r = run(
        script,
        stop_at=stop_at,
        flush_interval=rng.choice((0.2, 1.0, 10.0)),
        heartbeat_interval=rng.choice((0.5, 10.0)),
        delay=lambda: rng.choice((0.0, 0.0, 0.003, 0.5, 4.0, 100.0)),
        gives_up=rng.random() < 0.5,
    )

    acked = 0
    confirmed = 0
    for kind, lsn in r.events:
        if kind == "ack":
            acked = lsn
        else:
            assert confirmed <= lsn <= acked  # never back, never past an acknowledgement
            assert lsn == 0 or lsn in script.boundaries  # never inside a transaction
            confirmed = lsn
    statuses = r.source.statuses
    assert all(s.write >= s.flush for s in statuses)
    # the last status, sent on stop, confirms all the sink acknowledged, exactly
    assert statuses[-1].time == r.source.stop_at
    assert statuses[-1].flush == acked
    if not r.sink.gives_up:
        assert acked == r.sink.checkpointed
    modifications = [rec for rec in r.sink.records if isinstance(rec, Modification)]
    assert len(modifications) == script.inserts


# -- the import gate's stage: bound at housekeeping steps, free while nothing is gated --


def _inserts(records: list[Record]) -> int:
    return sum(isinstance(rec, Modification) for rec in records)


def test_with_nothing_gated_the_loop_feeds_the_builder_itself() -> None:
    """The stage in front of the builder hands out the builder's own feed while no table
    is gated (nothing of it runs per change), and its own once one is."""
    from pg2sink.imports.gate import ImportGate

    handler = ChangelogHandler(SixCatalog(), RecordingSink(FakeClock(), []))
    builder_feed = handler.feed  # no stage yet
    assert getattr(builder_feed, "__self__", None) is handler.builder
    gate = ImportGate()
    stage = gate.stage(handler.builder)
    handler.put_in_front(stage)
    feed = handler.feed
    assert feed == builder_feed and getattr(feed, "__self__", None) is handler.builder
    gate.hold("public", "six", keyless=True)  # returns: this thread binds the feeds
    assert handler.feed == stage.feed
    gate.release("public", "six")
    assert handler.feed == builder_feed


def test_after_hold_returns_the_next_change_of_its_table_is_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """hold() is called by the import thread while the loop streams with the builder's
    feed bound. It returns only once the loop has taken the stage's feed (a housekeeping
    step): the change that arrives after that is held, and nothing of the table reaches
    the sink after hold() returned. Changes fed before the binding go through (they
    committed before hold() returned: the engine's wait puts them in the snapshot)."""
    import threading
    import time

    from pg2sink.imports.gate import ImportGate

    caplog.set_level(logging.INFO, logger="pg2sink.subscription.loop")
    script = Script()
    script.transaction(T0)
    second_end = script.transaction(T0)  # arrives with the first: no housekeeping between
    script.transaction(T0 + 5)  # after the loop ran out of frames and took its feed anew
    clock = FakeClock()
    events: Events = []
    gate = ImportGate(hold_timeout=30.0)
    returned: list[int] = []  # inserts the sink had when hold() returned

    class HoldingSink(RecordingSink):
        """At its first insert, has another thread hold `six` and waits until the gate
        published it: the loop goes on with the builder's feed, bound before."""

        holder: threading.Thread | None = None

        def write(self, record: Record) -> None:
            super().write(record)
            if isinstance(record, Modification) and self.holder is None:
                self.holder = threading.Thread(target=hold_then_stop)
                self.holder.start()
                deadline = time.monotonic() + 10
                while ("public", "six") not in gate.gated:
                    assert time.monotonic() < deadline
                    time.sleep(0.001)

    sink = HoldingSink(clock, events)

    def hold_then_stop() -> None:
        gate.hold("public", "six", keyless=True)
        returned.append(_inserts(sink.records))
        # once the loop paused at the third transaction's insert, stop it
        deadline = time.monotonic() + 10
        while not any("stream paused" in m for m in caplog.messages):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        stop.requested = True

    handler = ChangelogHandler(SixCatalog(), sink)
    handler.put_in_front(gate.stage(handler.builder))
    with stop_flag() as stop:
        source = ScriptedSource(clock, script.frames, stop, T0 + 10, events)
        Streamer(
            source, handler, heartbeat_interval=100.0, flush_interval=10.0, stop=stop, clock=clock
        ).run()
    assert sink.holder is not None
    sink.holder.join(10)
    # the second transaction was fed before the loop bound the stage: hold() had not
    # returned; the third's insert, after it did, was held and never written
    assert returned == [2]
    assert _inserts(sink.records) == 2
    assert "stream paused at a change of public.six until its import is done" in caplog.messages
    assert sink.checkpointed == second_end
    assert [t for t, _ in source.frames] == [T0 + 5]  # the held transaction's Commit


def test_hold_waits_for_the_streams_binding_or_the_end_of_its_session() -> None:
    """hold() from the import thread returns once the stream thread takes the stage's
    feed, or once the session ends (the next one binds from the map it finds); without
    either within its timeout it raises, and the import does not start."""
    import threading

    from pg2sink.imports.gate import GateTimeoutError, ImportGate

    handler = ChangelogHandler(SixCatalog(), RecordingSink(FakeClock(), []))
    builder_feed = handler.feed
    gate = ImportGate(hold_timeout=0.05)
    stage = gate.stage(handler.builder)
    handler.put_in_front(stage)

    def in_the_stream_thread(action: Callable[[], object], after: float = 0.0) -> threading.Timer:
        timer = threading.Timer(after, action)
        timer.start()
        return timer

    in_the_stream_thread(lambda: handler.feed).join()  # binds the builder's feed
    with pytest.raises(GateTimeoutError):
        gate.hold("public", "six", keyless=True)  # no housekeeping step came
    gate.release("public", "six")  # as the engine's finish() after the failed attempt
    gate.hold_timeout = 10.0
    binding = in_the_stream_thread(lambda: handler.feed, after=0.05)
    gate.hold("public", "six", keyless=True)
    binding.join()
    assert handler.feed == stage.feed
    gate.release("public", "six")
    bound: list[object] = []
    in_the_stream_thread(lambda: bound.append(handler.feed)).join()
    assert bound == [builder_feed]
    ending = in_the_stream_thread(stage.detach, after=0.05)
    gate.hold("public", "six", keyless=True)  # returns: no session feeds
    ending.join()
