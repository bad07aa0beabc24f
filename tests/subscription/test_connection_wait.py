"""ReplicationStream.wait on a real replication connection: it sleeps first only in a
burst (the last wait ended within COALESCE_SECONDS) and only while less than a read's
worth is waiting in the socket, so a first change after a pause is read as soon as it
arrives; the sleep grows while the burst is fast and starts over after a pause.

Time is not measured here (benchmarks do that, docs/benchmarks.md): the sleeps are
recorded by a stand-in for time.sleep in the module, and what the wait read is checked
by reading it.
"""

from __future__ import annotations

import select
from collections.abc import Iterator

import pytest
from psycopg import sql

from pg2sink.catalog.server import connect
from pg2sink.config import SecretDsn
from pg2sink.subscription.connection import (
    COALESCE_GROW_RATE,
    COALESCE_MAX_SECONDS,
    COALESCE_READ_BYTES,
    COALESCE_SECONDS,
    ReplicationStream,
)
from tests.conftest import Database, wait_for

SLOT = "wait_coalesce"
PUBLICATION = "wait_coalesce"


@pytest.fixture
def stream(db: Database) -> Iterator[ReplicationStream]:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE t").format(sql.Identifier(PUBLICATION)))
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    s = ReplicationStream(connect(SecretDsn(db.dsn), replication=True))
    s.start(SLOT, PUBLICATION)
    try:
        yield s
    finally:
        s.close()
        # the walsender may hold the slot a moment after the connection closes
        active = "SELECT active FROM pg_replication_slots WHERE slot_name = %s"
        wait_for(lambda: conn.execute(active, (SLOT,)).fetchone() == (False,), 30, "released")
        conn.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
        conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(PUBLICATION)))


@pytest.fixture
def sleeps(stream: ReplicationStream) -> list[float]:
    """The durations the stream's wait slept, instead of sleeping."""
    slept: list[float] = []
    stream.sleep = slept.append
    return slept


def drain(s: ReplicationStream) -> int:
    """How many frames libpq holds, read."""
    count = 0
    while s.read() is not None:
        count += 1
    return count


def settle(s: ReplicationStream, quiet: float = 0.1) -> None:
    """Read until the server has sent nothing for `quiet` seconds: the rest of a large
    transaction may still be on its way after the bytes a test waited for."""
    for _ in range(100):
        while s._waiting() or drain(s):
            s.pgconn.consume_input()
        if not select.select([s.fileno], [], [], quiet)[0]:
            return
        s.pgconn.consume_input()
    raise AssertionError("the server kept sending")


def test_a_quiet_stream_waits_without_sleeping(
    stream: ReplicationStream, sleeps: list[float]
) -> None:
    drain(stream)
    stream.wait(0.05)  # not in a burst: never sleeps
    assert sleeps == []
    # a wait that nothing ended (the server may still send a keepalive after the
    # start) leaves the stream out of burst mode: the next change is read at once
    for _ in range(20):
        drain(stream)
        stream.wait(0.05)
        if drain(stream) == 0:
            break
    assert not stream._busy


def test_in_a_burst_an_empty_socket_is_given_time_to_fill(
    stream: ReplicationStream, sleeps: list[float]
) -> None:
    # the server may send a keepalive at any time: then the socket was not empty and
    # the wait rightly read it without sleeping; try again with an empty one
    for _ in range(20):
        drain(stream)
        if select.select([stream.fileno], [], [], 0.0)[0]:
            stream.wait(0.0)
            continue
        stream._busy = True
        stream.wait(0.05)
        if sleeps:
            break
    assert sleeps == [COALESCE_SECONDS]
    stream._busy = True
    stream.wait(COALESCE_SECONDS / 2)  # never sleeps past the caller's timeout
    assert sleeps == [COALESCE_SECONDS]


def insert_and_wait(db: Database, stream: ReplicationStream, rows: int, at_least: int) -> None:
    """Insert `rows` rows in one transaction and wait until `at_least` bytes are waiting."""
    before = stream._waiting()
    new_ids = "INSERT INTO t SELECT (SELECT coalesce(max(id), 0) FROM t) + g"
    db.connect().execute(new_ids + " FROM generate_series(1, %s::int) g", (rows,))
    wait_for(lambda: stream._waiting() - before >= at_least, 30, f"{at_least} bytes in the socket")


def test_out_of_a_burst_what_is_waiting_is_read_without_sleeping(
    db: Database, stream: ReplicationStream, sleeps: list[float]
) -> None:
    drain(stream)
    insert_and_wait(db, stream, 1, 1)
    stream._busy = False  # a first change after a pause
    stream.wait(1.0)
    assert sleeps == []
    assert drain(stream) >= 1


def test_in_a_burst_a_few_waiting_messages_are_given_time_to_gather(
    db: Database, stream: ReplicationStream, sleeps: list[float]
) -> None:
    drain(stream)
    insert_and_wait(db, stream, 1, 1)
    assert 0 < stream._waiting() < COALESCE_READ_BYTES
    stream._busy = True
    stream.wait(1.0)
    assert sleeps == [COALESCE_SECONDS]
    assert drain(stream) >= 1  # and then read


def test_in_a_burst_a_reads_worth_is_read_without_sleeping(
    db: Database, stream: ReplicationStream, sleeps: list[float]
) -> None:
    drain(stream)
    # ~50 bytes per INSERT frame: 2,000 rows leave far more than a read's worth
    insert_and_wait(db, stream, 2000, COALESCE_READ_BYTES)
    stream._busy = True
    stream.wait(1.0)
    assert sleeps == []
    assert drain(stream) >= 1


def test_the_sleep_grows_with_a_fast_burst_and_starts_over_after_a_pause(
    db: Database, stream: ReplicationStream
) -> None:
    slept: list[float] = []

    def fast_burst(seconds: float) -> None:
        # while "asleep", the server sends more than COALESCE_GROW_RATE would in that
        # time: 2,000 rows, ~100 KB, in what counts as `seconds`
        slept.append(seconds)
        insert_and_wait(db, stream, 2000, int(COALESCE_GROW_RATE * seconds) + 1)

    stream.sleep = fast_burst
    for _ in range(4):
        # the whole of the previous burst read: a read's worth left in the socket would
        # (rightly) be read without a sleep
        settle(stream)
        stream._busy = True
        stream.wait(1.0)
    assert slept == [
        COALESCE_SECONDS,
        2 * COALESCE_SECONDS,
        4 * COALESCE_SECONDS,
        8 * COALESCE_SECONDS,
    ]
    assert stream._coalesce == 16 * COALESCE_SECONDS <= COALESCE_MAX_SECONDS

    # a sleep during which little came (one row) halves the next one; the wait then
    # reads that row at once, so the burst goes on
    def trickle(seconds: float) -> None:
        slept.append(seconds)
        insert_and_wait(db, stream, 1, 1)

    slept.clear()
    stream.sleep = trickle
    stream._busy = True
    stream.wait(1.0)
    assert slept == [16 * COALESCE_SECONDS]
    assert stream._busy and stream._coalesce == 8 * COALESCE_SECONDS
    drain(stream)
    # a wait that nothing ends within a burst's gap is a pause: the next burst starts over
    stream.sleep = slept.append
    for _ in range(20):  # unless the server sends something then (a keepalive)
        stream.wait(0.05)
        if not drain(stream):
            break
    assert not stream._busy and stream._coalesce == COALESCE_SECONDS
