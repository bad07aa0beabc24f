"""--wal-retain: the confirmed LSN stays a window of commit time behind what the sink
acknowledged (subscription/retention.py), through the real Streamer and ChangelogHandler
on the fake clock of test_loop.py."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import pytest

from pg2sink.changelog.records import Modification, Operation
from pg2sink.commands.replay import Point, parse_point
from pg2sink.errors import ConfigError
from pg2sink.logical import Commit, decode
from pg2sink.logical.lsn import format_lsn
from pg2sink.subscription.handlers import ChangelogHandler
from pg2sink.subscription.loop import Streamer
from pg2sink.subscription.retention import Retention, commit_time
from tests.conftest import Database, run_cli, wait_for
from tests.logical import golden as g
from tests.subscription.test_loop import (
    _COMMIT,
    T0,
    Events,
    FakeClock,
    RecordingSink,
    ScriptedSource,
    SixCatalog,
    begin,
    keepalive,
    stop_flag,
    xlogdata,
)
from tests.support import Proc, modifications, start

SECOND: Final = 1_000_000
#: the server time of the first commit (PG-epoch microseconds)
START: Final = 800_000_000 * SECOND


def test_commit_time_is_the_commits() -> None:
    captured = decode(g.COMMIT)
    assert isinstance(captured, Commit)
    assert commit_time(g.COMMIT) == captured.commit_time
    assert commit_time(g.BEGIN) is None and commit_time(b"") is None


def test_retention_confirms_only_what_is_the_window_older() -> None:
    r = Retention(30.0)
    for i in range(10):  # a checkpoint every 10 s, at LSN 100, 200 ...
        r.note(100 * (i + 1), START + 10 * i * SECOND)
    assert r.hold(50) == 0  # nothing acknowledged yet
    assert r.hold(300) == 0  # the newest acknowledged is 20 s after the first
    assert r.hold(400) == 100  # 30 s after the first
    assert r.hold(1000) == 700  # newest at 90 s: up to the one at 60 s
    assert r.hold(400) == 700  # never back


def test_one_checkpoint_per_second_is_kept() -> None:
    r = Retention(1.0)
    for i in range(1000):  # a thousand commits within one second
        r.note(i + 1, START + i * 100)
    r.note(2000, START + 2 * SECOND)
    # the second's latest stands for all of it: confirmed a little later, never earlier
    assert r.hold(2000) == 1000


def transactions(count: int, apart_s: int) -> tuple[list[tuple[float, bytes]], list[int]]:
    """`count` transactions of the captured insert, arriving 1 s apart on the fake clock,
    committed `apart_s` seconds of server time apart; the frames and commit end LSNs."""
    _, flags, _, _, _ = _COMMIT.unpack(g.COMMIT)
    frames: list[tuple[float, bytes]] = []
    ends = []
    lsn = 0x1_0000
    for i in range(count):
        at = T0 + i
        frames.append((at, xlogdata(begin(lsn + 0x100), lsn)))
        if i == 0:
            frames.append((at, xlogdata(g.RELATION_SIX, 0)))
        frames.append((at, xlogdata(g.INSERT_SIX, lsn + 0x10)))
        end = lsn + 0x130
        when = START + i * apart_s * SECOND
        payload = _COMMIT.pack(b"C", flags, lsn + 0x100, end, when)
        frames.append((at, xlogdata(payload, lsn + 0x100)))
        ends.append(end)
        lsn = end + 0x10
    return frames, ends


def run(frames: list[tuple[float, bytes]], wal_retain: float) -> ScriptedSource:
    """The loop over `frames` with a sink that acknowledges at once; what it sent."""
    clock = FakeClock()
    events: Events = []
    sink = RecordingSink(clock, events)
    with stop_flag() as stop:
        source = ScriptedSource(clock, frames, stop, frames[-1][0] + 5, events)
        Streamer(
            source,
            ChangelogHandler(SixCatalog(), sink),
            heartbeat_interval=100.0,
            flush_interval=0.5,
            stop=stop,
            clock=clock,
            wal_retain=wal_retain,
        ).run()
    return source


def test_the_confirmed_lsn_stays_the_window_behind() -> None:
    frames, ends = transactions(10, apart_s=10)
    statuses = run(frames, wal_retain=30.0).statuses
    flushes = [s.flush for s in statuses]
    assert flushes == sorted(flushes)
    # the last commit (90 s) is acknowledged: confirmed up to the one at 60 s, not later
    assert flushes[-1] == ends[6]
    for s in statuses:  # never a commit less than 30 s older than one already seen
        assert s.flush in (0, *ends[:7])
    # without it, everything acknowledged is confirmed
    assert run(frames, wal_retain=0.0).statuses[-1].flush == ends[-1]


def test_idle_keepalives_move_the_window_on() -> None:
    frames, ends = transactions(3, apart_s=10)
    # the server's clock goes on while nothing commits: 40 s after the last commit
    idle = keepalive(ends[-1] + 0x100, send_time=START + 60 * SECOND)
    statuses = run([*frames, (T0 + 10, idle)], wal_retain=30.0).statuses
    assert statuses[-1].flush == ends[-1]


def test_a_restart_sends_the_retained_window_again(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    """Against the server: with --wal-retain the slot stays before the changes the file
    holds, and a restart (without it) writes them again, then confirms them."""
    conn = db.connect()
    conn.execute("CREATE TABLE kept (id int PRIMARY KEY)")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out, "--wal-retain", "1h")
    before = db.slot_confirmed_lsn() or 0
    conn.execute("INSERT INTO kept SELECT generate_series(1, 3)")
    wait_for(lambda: len(modifications(out)) == 3, 30, "the rows in the file")
    time.sleep(1.0)  # ten flush intervals: without --wal-retain they would be confirmed
    assert (db.slot_confirmed_lsn() or 0) == before
    assert p.stop() == 0
    p = start(pg2sink_proc, out)
    wait_for(lambda: len(modifications(out)) == 6, 30, "the window sent again")
    target = db.current_lsn()
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= target, 30, "the rows confirmed")
    assert p.stop() == 0
    assert [m["after"]["id"] for m in modifications(out)] == [1, 2, 3, 1, 2, 3]


def test_replay_writes_only_the_changes_after_the_point(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    """`pg2sink replay --since LSN` after a stream with --wal-retain: the window's changes
    from the point on are written again, those before it are not."""
    conn = db.connect()
    conn.execute("CREATE TABLE kept (id int PRIMARY KEY)")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out, "--wal-retain", "1h")
    conn.execute("INSERT INTO kept SELECT generate_series(1, 3)")
    point = format_lsn(db.current_lsn())
    conn.execute("INSERT INTO kept SELECT generate_series(4, 6)")
    wait_for(lambda: len(modifications(out)) == 6, 30, "the rows in the file")
    assert p.stop() == 0
    p.args = ["replay", "--since", point, *p.args]
    p.start().wait_streaming()
    wait_for(lambda: len(modifications(out)) == 9, 30, "the rows after the point again")
    assert p.stop() == 0
    assert [m["after"]["id"] for m in modifications(out)] == [1, 2, 3, 4, 5, 6, 4, 5, 6]
    assert "replay: 3 records before LSN" in p.stderr()


def test_a_replay_leaves_the_slot_so_the_window_can_be_replayed_again(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    """`pg2sink replay` (here without --wal-retain) confirms nothing: a second replay
    writes the window again; --advance-slot confirms as the stream does."""
    conn = db.connect()
    conn.execute("CREATE TABLE kept (id int PRIMARY KEY)")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out, "--wal-retain", "1h")
    conn.execute("INSERT INTO kept SELECT generate_series(1, 3)")
    wait_for(lambda: len(modifications(out)) == 3, 30, "the rows in the file")
    assert p.stop() == 0
    kept = db.slot_confirmed_lsn()
    stream_args = [a for a in p.args if a not in ("--wal-retain", "1h")]
    for written in (6, 9):
        p.args = ["replay", "--since", "1h", *stream_args]
        p.start().wait_streaming()
        wait_for(lambda: len(modifications(out)) == written, 30, "the window replayed")  # noqa: B023
        time.sleep(1.0)  # ten flush intervals: the stream would have confirmed by now
        assert p.stop() == 0
        assert db.slot_confirmed_lsn() == kept
    p.args = ["replay", "--since", "1h", "--advance-slot", *stream_args]
    p.start().wait_streaming()
    wait_for(lambda: len(modifications(out)) == 12, 30, "the window replayed")
    target = db.current_lsn()
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= target, 30, "the replay confirmed")
    assert p.stop() == 0
    assert [m["after"]["id"] for m in modifications(out)] == [1, 2, 3] * 4


def test_a_point_in_time_keeps_later_commits() -> None:
    now = datetime(2026, 11, 24, 5, 0, tzinfo=UTC)
    point = parse_point("10m", now)
    assert point == Point(time=datetime(2026, 11, 24, 4, 50, tzinfo=UTC))
    change = Modification(now, 0, 5, 1, Operation.INSERT, "public", "t", None, {})
    assert point.keeps(change)
    old = Modification(now - timedelta(hours=1), 0, 9, 1, Operation.INSERT, "public", "t", None, {})
    assert not point.keeps(old)
    assert parse_point("0/10") == Point(lsn=16) and not Point(lsn=16).keeps(old)
    with pytest.raises(ConfigError, match="--since 'soon'"):
        parse_point("soon")


def test_status_shows_the_retained_window(db: Database, pg2sink_proc: Proc, tmp_path: Path) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE kept (id int PRIMARY KEY, pad text)")
    p = start(pg2sink_proc, tmp_path / "out.jsonl", "--wal-retain", "1h")
    conn.execute("INSERT INTO kept SELECT i, repeat('x', 1000) FROM generate_series(1, 100) i")
    wait_for(lambda: len(modifications(tmp_path / "out.jsonl")) == 100, 30, "the rows")
    assert p.stop() == 0
    env = {"PG2SINK_SOURCE": db.dsn, "PG2SINK_SLOT": db.slot}
    done = run_cli("status", env={**env, "PG2SINK_PUBLICATION": db.publication})
    assert done.returncode == 0, done.stderr
    confirmed = format_lsn(db.slot_confirmed_lsn() or 0)
    (line,) = [x for x in done.stdout.splitlines() if "replay window" in x]
    assert line.startswith(f"  replay window: from {confirmed}, ")
    # the 100 rows' WAL (100 kB of text at least) is retained after the confirmed LSN
    assert " kB of WAL" in line or " MB of WAL" in line
