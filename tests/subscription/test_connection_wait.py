"""ReplicationStream.wait on a real replication connection: it sleeps COALESCE_SECONDS
first only in a burst (the last wait ended that soon) and only when nothing is already
waiting in the socket, so a first change after a pause is read as soon as it arrives.

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
from pg2sink.subscription.connection import COALESCE_SECONDS, ReplicationStream
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


def test_what_is_already_in_the_socket_is_read_without_sleeping(
    db: Database, stream: ReplicationStream, sleeps: list[float]
) -> None:
    drain(stream)
    db.connect().execute("INSERT INTO t VALUES (1)")
    readable = lambda: bool(select.select([stream.fileno], [], [], 0.5)[0])  # noqa: E731
    wait_for(readable, 30, "the insert's frames in the socket")
    stream._busy = True  # as in a burst: still no sleep while data is there
    stream.wait(1.0)
    assert sleeps == []
    assert drain(stream) >= 1
