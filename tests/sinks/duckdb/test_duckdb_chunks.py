"""A large transaction goes to DuckDB in chunks, committed beyond the fence every
COMMIT_ROWS rows until the transaction's checkpoint moves the fence past them (sink.py,
CHUNK_RECORDS): memory
holds a chunk, never the transaction, and nothing of it is in the views or acknowledged
before its commit; a transaction started again, already in the file, unfinished at close
or cut by a crash leaves nothing. A real embedded DuckDB, records made here
(CHUNK_RECORDS made small); and pg2sink killed with SIGKILL while it writes large
transactions from a real PostgreSQL."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pg2sink.changelog.records import Modification, Operation
from pg2sink.sinks.duckdb import sink as sink_module
from pg2sink.sinks.duckdb.sink import RECORD_BYTES, DuckDBSink
from tests.conftest import Database
from tests.sinks.duckdb.test_duckdb import caught_up, duck_rows, pg_rows, start
from tests.sinks.duckdb.test_duckdb_layout import INT, NOW, TEXT, insert, opened, query, schema
from tests.sinks.warehouse_support import duck_query
from tests.support import Proc

CHUNK = 5


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_module, "CHUNK_RECORDS", CHUNK)
    monkeypatch.setattr(sink_module, "COMMIT_ROWS", 2 * CHUNK)


def update(sequence: int, id: int, a: str) -> Modification:
    return Modification(
        NOW, sequence, 100, 7, Operation.UPDATE, "public", "t", None, {"id": id, "a": a}
    )


def write_transaction(sink: DuckDBSink, rows: int, first: int = 0) -> None:
    for i in range(rows):
        sink.write(insert("public", "t", i, id=first + i, a=f"r{first + i}"))
        # less than a chunk held (and a batch not committed yet until the first chunk)
        assert sink.pending_bytes() < (CHUNK + 2) * RECORD_BYTES


def test_a_large_transaction_commits_whole_with_its_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "chunks.duckdb"
    sink = opened(path)
    sink.write(schema("public", "t", ("id", INT), ("a", TEXT)))
    sink.write(insert("public", "t", 0, id=0, a="small"))
    sink.checkpoint(100)  # committed on its own before the chunks begin
    write_transaction(sink, 23, first=1)
    sink.write(update(23, 1, "updated in the same transaction"))
    assert sink.acknowledged() == 100  # the batch before, not the open transaction
    sink.checkpoint(200)
    assert sink.flush() == 200
    sink.close()
    rows = query(path, "SELECT _pg2sink_position, id, a FROM public_t_raw ORDER BY 1")
    assert [r[0] for r in rows] == list(range(1, 26))  # every row once, in order
    assert query(path, "SELECT a FROM public_t WHERE id = 1") == [
        ("updated in the same transaction",)
    ]
    assert query(path, "SELECT lsn, position FROM pg2sink_state") == [(200, 25)]


def test_a_transaction_started_again_keeps_nothing_of_its_first_chunks(tmp_path: Path) -> None:
    path = tmp_path / "torn.duckdb"
    sink = opened(path)
    sink.write(schema("public", "t", ("id", INT), ("a", TEXT)))  # in the first chunk
    write_transaction(sink, 12)
    write_transaction(sink, 7, first=100)  # a reconnect sends it again from its start
    sink.checkpoint(300)
    assert sink.flush() == 300
    sink.close()
    assert query(path, "SELECT min(id), count(*) FROM public_t_raw") == [(100, 7)]


def test_chunks_of_a_transaction_the_file_holds_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "held.duckdb"
    sink = opened(path)
    sink.write(schema("public", "t", ("id", INT), ("a", TEXT)))
    write_transaction(sink, 12)
    sink.checkpoint(300)
    sink.close()
    again = opened(path)  # the stream replays from the slot's older position
    again.write(schema("public", "t", ("id", INT), ("a", TEXT)))
    write_transaction(again, 12)
    again.checkpoint(300)
    assert again.acknowledged() == 300
    write_transaction(again, 8, first=50)  # not committed before the close: dropped
    again.close()
    assert query(path, "SELECT count(*), max(id) FROM public_t_raw") == [(12, 11)]
    assert query(path, "SELECT lsn FROM pg2sink_state") == [(300,)]


def write_mixed(sink: DuckDBSink, rows: int) -> None:
    """A transaction of rows of a keyed table and of a keyless one, interleaved."""
    for i in range(rows):
        sink.write(insert("public", "t", 2 * i, id=i + 1, a=f"r{i + 1}"))
        sink.write(insert("public", "bag", 2 * i + 1, n=i % 3))


def test_chunks_cut_by_a_crash_stay_out_of_the_views_and_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "crash.duckdb"
    pid = os.fork()
    if pid == 0:  # the writer, which ends without closing anything (as kill -9 would)
        code = 1
        try:
            sink = opened(path)
            sink.write(schema("public", "t", ("id", INT), ("a", TEXT)))
            sink.write(schema("public", "bag", ("n", INT), key=""))
            sink.write(insert("public", "t", 0, id=0, a="committed"))
            sink.write(insert("public", "bag", 1, n=7))
            sink.checkpoint(100)
            sink.flush()
            write_mixed(sink, 16)  # 32 records: chunks 1 to 4 committed, 5 maybe
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    beyond = "SELECT count(*) FROM {} WHERE _pg2sink_position > 2"
    left = [query(path, beyond.format(t))[0][0] for t in ("public_t_raw", "public_bag_raw")]
    assert sum(left) >= 4 * CHUNK  # committed, but beyond the fence:
    assert query(path, "SELECT * FROM public_t") == [(0, "committed")]
    assert query(path, "SELECT * FROM public_bag") == [(7,)]
    assert query(path, "SELECT lsn, position FROM pg2sink_state") == [(100, 2)]
    again = opened(path)  # removes them; the stream sends the transaction again
    again.write(schema("public", "t", ("id", INT), ("a", TEXT)))
    again.write(schema("public", "bag", ("n", INT), key=""))
    write_mixed(again, 16)
    again.checkpoint(200)
    assert again.flush() == 200
    again.close()
    rows = query(
        path,
        "SELECT _pg2sink_position FROM public_t_raw UNION ALL "
        "SELECT _pg2sink_position FROM public_bag_raw ORDER BY 1",
    )
    assert [r[0] for r in rows] == list(range(1, 35))  # every row once
    assert query(path, "SELECT count(*), max(id) FROM public_t") == [(17, 16)]
    assert query(path, "SELECT n, count(*) FROM public_bag GROUP BY n ORDER BY n") == [
        (0, 6),
        (1, 5),
        (2, 5),
        (7, 1),
    ]
    assert query(path, "SELECT lsn, position FROM pg2sink_state") == [(200, 34)]


@pytest.mark.slow
def test_kill_9_during_large_transactions_is_exactly_once(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE big (id int PRIMARY KEY, s text)")
    path = tmp_path / "big.duckdb"
    # --retry-initial: the killed process's walsender may hold the slot for a moment
    p = start(pg2sink_proc, path, "--retry-initial")
    changes = 0
    for round in range(3):
        # 8 and 5 chunks of the real CHUNK_RECORDS (5,000): killed at different moments
        # of their writing (or of the restart's)
        first = round * 40_000
        inserted = conn.execute(
            "INSERT INTO big SELECT g, 'r' || g FROM generate_series(%s, %s) g",
            (first, first + 39_999),
        )
        updated = conn.execute("UPDATE big SET s = s || '!' WHERE id % 9 < 2")
        changes += inserted.rowcount + updated.rowcount
        time.sleep(0.3 + 0.4 * round)
        p.stop(signal.SIGKILL)
        p.start().wait_streaming()
    caught_up(db, 120)
    assert p.stop() == 0
    assert duck_rows(path, "public_big", "id") == pg_rows(conn, "big", "id")
    assert duck_query(path, "SELECT count(*) FROM public_big_raw") == [(changes,)]
    twice = duck_query(
        path,
        "SELECT _pg2sink_xid, _pg2sink_lsn, _pg2sink_sequence FROM public_big_raw "
        "GROUP BY ALL HAVING count(*) > 1",
    )
    assert twice == []
