"""--streaming end to end: a real PostgreSQL streams in-progress transactions to pg2sink.

Each test's database gets `logical_decoding_work_mem = 64kB` (the default is 64MB), so the
server streams any transaction past a few hundred rows; pg_stat_replication_slots proves it
did. Records must be exactly those of the same transactions sent whole at commit.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.catalog.catalog import Catalog
from pg2sink.errors import DecodeError, ServerConfigError
from pg2sink.imports.gate import GateHeld, ImportGate
from pg2sink.logical.decoder import decode
from pg2sink.logical.messages import StreamAbort
from pg2sink.sinks.file import FileSink
from pg2sink.subscription.handlers import ChangelogHandler
from pg2sink.subscription.in_progress import StreamingHandler, check_streaming_server
from tests.conftest import Database, KafkaStack, Pg2Sink, read_jsonl, run_cli, wait_for
from tests.logical import golden as g
from tests.support import FAST, Proc, modifications
from tests.support import start as start_file_sink

Conn = psycopg.Connection[TupleRow]
PAYLOAD = "repeat('p', 100)"


@pytest.fixture
def conn(db: Database) -> Iterator[Conn]:
    """The test database, set up so that the server streams small transactions."""
    c = db.connect()
    c.execute(
        sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(
            sql.Identifier(db.name)
        )
    )
    c.execute("CREATE TABLE big (id int PRIMARY KEY, payload text)")
    yield c


def start(proc: Proc, out: Path, spill: Path, *extra: str) -> Pg2Sink:
    return start_file_sink(proc, out, "--streaming", "--spill-dir", str(spill), *extra)


def streamed_transactions(db: Database, slot: str | None = None) -> int:
    """Transactions the server streamed on the slot (0 when it has no statistics yet)."""
    with psycopg.connect(db.dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s",
            (slot or db.slot,),
        ).fetchone()
    return int(row[0]) if row else 0


def insert(conn: Conn, first: int, last: int, table: str = "big") -> None:
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, {} FROM generate_series(%s::int, %s::int) g").format(
            sql.Identifier(table), sql.SQL(PAYLOAD)
        ),
        (first, last),
    )


def ids(mods: list[dict[str, Any]], table: str = "big") -> list[int]:
    return [m["after"]["id"] for m in mods if m["name"] == table and m["operation"] == "INSERT"]


def wait_confirmed(
    db: Database, p: Pg2Sink, lsn: int, slot: str | None = None, timeout: float = 60
) -> None:
    """Wait until the slot confirms `lsn`; on a timeout, show pg2sink's stderr."""
    try:
        wait_for(lambda: (db.slot_confirmed_lsn(slot) or 0) >= lsn, timeout, "confirmation")
    except AssertionError as e:
        raise AssertionError(f"{e}; pg2sink's stderr:\n{p.stderr()[-4000:]}") from None


def spill_files(spill: Path) -> list[Path]:
    return sorted(spill.glob("*.spill")) if spill.exists() else []


def assert_one_transaction(mods: list[dict[str, Any]]) -> None:
    """One ordinary transaction: one xid and commit time, sequence 0..n-1, LSNs in order."""
    assert len({m["xid"] for m in mods}) == 1
    assert len({m["timestamp"] for m in mods}) == 1
    assert [m["sequence"] for m in mods] == list(range(len(mods)))
    lsns = [m["lsn"] for m in mods]
    assert lsns == sorted(lsns)


def test_large_streamed_transaction_arrives_whole_and_in_order(
    db: Database, conn: Conn, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    out, spill = tmp_path / "out.jsonl", tmp_path / "spill"
    p = start(pg2sink_proc, out, spill)
    with conn.transaction():
        insert(conn, 1, 20_000)
        conn.execute("UPDATE big SET payload = 'u' WHERE id <= 10")
        conn.execute("DELETE FROM big WHERE id > 19990")
    end = db.current_lsn()
    wait_confirmed(db, p, end)
    assert p.stop() == 0
    mods = modifications(out)
    assert len(mods) == 20_000 + 10 + 10
    assert_one_transaction(mods)
    assert ids(mods) == list(range(1, 20_001))
    assert [m["after"] for m in mods[20_000:20_010]] == [
        {"id": i, "payload": "u"} for i in range(1, 11)
    ]
    assert [m["before"] for m in mods[20_010:]] == [{"id": i} for i in range(19_991, 20_001)]
    schemas = [r for r in read_jsonl(out) if r["kind"] == "schema"]
    assert [s["name"] for s in schemas] == ["big"]
    assert streamed_transactions(db) >= 1
    assert spill_files(spill) == []


def test_rolled_back_savepoints_lose_exactly_their_rows(
    db: Database, conn: Conn, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE other (id int PRIMARY KEY, payload text)")
    out, spill = tmp_path / "out.jsonl", tmp_path / "spill"
    p = start(pg2sink_proc, out, spill)
    with conn.transaction():
        insert(conn, 1, 3000)
        conn.execute("SAVEPOINT s1")
        insert(conn, 3001, 6000)  # streamed before the rollback (well past 64kB)
        insert(conn, 1, 100, "other")  # other's Relation may first be sent inside s1
        insert(conn, 6001, 6500)
        conn.execute("ROLLBACK TO SAVEPOINT s1")
        insert(conn, 6501, 9000)
        conn.execute("SAVEPOINT kept")
        insert(conn, 9001, 10_000)
        conn.execute("RELEASE SAVEPOINT kept")
        conn.execute("SAVEPOINT outer_sp")
        insert(conn, 10_001, 11_000)
        conn.execute("SAVEPOINT inner_sp")
        insert(conn, 11_001, 12_000)
        conn.execute("RELEASE SAVEPOINT inner_sp")
        conn.execute("ROLLBACK TO SAVEPOINT outer_sp")  # takes inner_sp's rows too
        insert(conn, 200, 300, "other")  # after s1's rollback: no Relation sent again
        insert(conn, 12_001, 13_000)
    end = db.current_lsn()
    wait_confirmed(db, p, end)
    assert p.stop() == 0
    mods = modifications(out)
    expected = [*range(1, 3001), *range(6501, 10_001), *range(12_001, 13_001)]
    assert ids(mods) == expected
    assert ids(mods, "other") == list(range(200, 301))
    assert len(mods) == len(expected) + 101
    assert_one_transaction(mods)
    assert streamed_transactions(db) >= 1
    assert spill_files(spill) == []


def test_rolled_back_streamed_transaction_emits_nothing(
    db: Database, conn: Conn, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    out, spill = tmp_path / "out.jsonl", tmp_path / "spill"
    p = start(pg2sink_proc, out, spill)
    conn.execute("BEGIN")
    insert(conn, 1, 10_000)
    # the server streams it while it runs: pg2sink holds it on disk, the sink has nothing
    wait_for(lambda: spill_files(spill), 30, "a spill file")
    insert(conn, 10_001, 20_000)
    conn.execute("ROLLBACK")
    conn.execute("INSERT INTO big VALUES (-1, 'after')")
    end = db.current_lsn()
    wait_confirmed(db, p, end)
    assert p.stop() == 0
    mods = modifications(out)
    assert ids(mods) == [-1]
    assert streamed_transactions(db) >= 1
    assert spill_files(spill) == []


def test_interleaved_streamed_transactions_come_out_whole_in_commit_order(
    db: Database, conn: Conn, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    out, spill = tmp_path / "out.jsonl", tmp_path / "spill"
    # --streaming from the environment this time
    p = pg2sink_proc(
        "--file-path",
        str(out),
        *FAST,
        env={"PG2SINK_STREAMING": "true", "PG2SINK_SPILL_DIR": str(spill)},
    )
    p.start().wait_streaming()
    a, b = db.connect(), db.connect()
    a.execute("BEGIN")
    b.execute("BEGIN")
    for chunk in range(5):  # a: 1..10000, b: 100001..110000, in alternating chunks
        insert(a, 1 + chunk * 2000, (chunk + 1) * 2000)
        insert(b, 100_001 + chunk * 2000, 100_000 + (chunk + 1) * 2000)
    conn.execute("INSERT INTO big VALUES (-1, 'small, in between')")
    b.execute("COMMIT")
    a.execute("COMMIT")
    end = db.current_lsn()
    wait_confirmed(db, p, end)
    assert p.stop() == 0
    mods = modifications(out)
    assert len(mods) == 20_001
    assert ids(mods[:1]) == [-1]
    assert ids(mods[1:10_001]) == list(range(100_001, 110_001))
    assert ids(mods[10_001:]) == list(range(1, 10_001))
    assert_one_transaction(mods[1:10_001])
    assert_one_transaction(mods[10_001:])
    assert mods[1]["xid"] != mods[10_001]["xid"]
    assert streamed_transactions(db) >= 2
    assert spill_files(spill) == []


def test_kill_during_streamed_transaction_then_restart_matches_unstreamed_run(
    db: Database, conn: Conn, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    out, spill = tmp_path / "streamed.jsonl", tmp_path / "spill"
    p = start(pg2sink_proc, out, spill)
    # A second slot, created before any change, decodes the same WAL without streaming.
    plain_slot = f"{db.slot}_plain"
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (plain_slot,))
    conn.execute("INSERT INTO big VALUES (-1, 'before')")
    end = db.current_lsn()
    wait_confirmed(db, p, end)

    big, aborted = db.connect(), db.connect()
    big.execute("BEGIN")
    aborted.execute("BEGIN")
    insert(big, 1, 10_000)
    insert(aborted, 500_001, 510_000)
    big.execute("SAVEPOINT s")
    insert(big, 10_001, 12_000)
    big.execute("ROLLBACK TO SAVEPOINT s")
    wait_for(lambda: len(spill_files(spill)) == 2, 30, "two spill files")
    conn.execute("INSERT INTO big VALUES (-2, 'committed while the big ones run')")
    end = db.current_lsn()
    # a position past the start of both streamed transactions gets confirmed
    wait_confirmed(db, p, end)
    p.stop(signal.SIGKILL)
    assert spill_files(spill)  # left behind by the killed process

    insert(big, 12_001, 20_000)
    aborted.execute("ROLLBACK")
    big.execute("COMMIT")
    conn.execute("INSERT INTO big VALUES (-3, 'after')")
    end = db.current_lsn()

    p = start(pg2sink_proc, out, spill)
    wait_confirmed(db, p, end)
    assert p.stop() == 0
    assert "deleted 2 spill files of a previous run" in p.stderr()
    assert spill_files(spill) == []
    assert streamed_transactions(db) >= 2

    plain_out = tmp_path / "plain.jsonl"
    plain = pg2sink_proc("--file-path", str(plain_out), *FAST, env={"PG2SINK_SLOT": plain_slot})
    plain.start().wait_streaming()
    wait_confirmed(db, plain, end, plain_slot)
    assert plain.stop() == 0
    assert streamed_transactions(db, plain_slot) == 0

    streamed = modifications(out)
    # at-least-once: what came after the last confirmed position before the kill may repeat
    unique = list({(m["lsn"], m["xid"], m["sequence"]): m for m in streamed}.values())
    expected = modifications(plain_out)
    assert unique == expected
    assert ids(expected) == [-1, -2, *range(1, 10_001), *range(12_001, 20_001), -3]
    assert_one_transaction(expected[2:-1])
    schema = [r["schema"] for r in read_jsonl(out) if r["kind"] == "schema"]
    plain_schema = [r["schema"] for r in read_jsonl(plain_out) if r["kind"] == "schema"]
    assert plain_schema and all(s == plain_schema[0] for s in schema)


@pytest.mark.slow
def test_streamed_transactions_through_the_kafka_sink(
    db: Database,
    conn: Conn,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    tmp_path: Path,
) -> None:
    from tests.sinks.kafka.test_kafka import Reader, kafka_args

    spill = tmp_path / "spill"
    p = pg2sink_proc(
        *kafka_args(kafka_stack, topic_prefix), "--streaming", "--spill-dir", str(spill)
    )
    p.start().wait_streaming()
    rolled_back = db.connect()
    rolled_back.execute("BEGIN")
    insert(rolled_back, 100_001, 105_000)
    with conn.transaction():
        insert(conn, 1, 4000)
        conn.execute("SAVEPOINT s")
        insert(conn, 4001, 6000)
        conn.execute("ROLLBACK TO SAVEPOINT s")
        insert(conn, 6001, 8000)
    rolled_back.execute("ROLLBACK")
    conn.execute("INSERT INTO big VALUES (-1, 'after')")
    wait_confirmed(db, p, db.current_lsn())
    assert p.stop() == 0
    reader = Reader(
        kafka_stack.bootstrap_servers, [f"{topic_prefix}.public.big"], kafka_stack.registry_url
    )
    try:
        reader.read(6001, timeout=60)
        values = [m.value for m in reader.read_for(1.0)]  # and nothing more arrives
    finally:
        reader.close()
    assert len(values) == 6001
    # one partition per table by default: the topic keeps the order of the changes
    ids_read = [v["after"]["id"] for v in values]
    assert ids_read == [*range(1, 4001), *range(6001, 8001), -1]
    assert [v["sequence"] for v in values[:6000]] == list(range(6000))
    assert len({v["xid"] for v in values[:6000]}) == 1
    # PostgreSQL 18 no longer streams a transaction that has already aborted when the
    # walsender decodes it (ReorderBufferCheckAndTruncateAbortedTXN): the rolled-back one
    # is streamed only when pg2sink kept up with it, the committed one always
    assert streamed_transactions(db) >= (2 if conn.info.server_version < 180000 else 1)
    assert spill_files(spill) == []


def test_decode_only_prints_stream_messages(
    db: Database, conn: Conn, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    out = tmp_path / "decoded.txt"
    p = pg2sink_proc("--decode-only", "--streaming", "--file-path", str(out), *FAST).start()
    p.wait_streaming()
    with conn.transaction():
        insert(conn, 1, 3000)
    wait_for(lambda: out.exists() and "STREAM COMMIT" in out.read_text(), 30, "a stream commit")
    assert p.stop() == 0
    lines = out.read_text().splitlines()
    starts = [line for line in lines if " STREAM START " in line]
    assert starts and starts[0].endswith("first_segment")
    xid = starts[0].split("xid=")[1].split()[0]
    inserts = [line for line in lines if " INSERT public.big " in line]
    assert len(inserts) == 3000
    assert all(line.endswith(f" xid={xid}") for line in inserts)
    assert any(" STREAM STOP" in line for line in lines)


def peek_streamed(conn: Conn, slot: str, publication: str) -> list[tuple[int, bytes]]:
    """(LSN, pgoutput message) of what the slot holds, read with streaming 'on'."""
    conn.execute("SET logical_decoding_work_mem = '64kB'")
    rows = conn.execute(
        "SELECT lsn - '0/0', data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
        " 'proto_version', '2', 'publication_names', %s, 'streaming', 'on')",
        (slot, publication),
    ).fetchall()
    return [(int(lsn), bytes(data)) for lsn, data in rows]


def replay(
    conn: Conn, messages: list[tuple[int, bytes]], out: Path, spill: Path, gate: ImportGate | None
) -> int:
    """Feed `messages` to a StreamingHandler over a file sink, in process; return how
    often the import gate held the stream. A held message is fed again after the gate
    opens, as the replication loop does."""
    sink = FileSink(str(out))
    sink.open()
    changelog = ChangelogHandler(Catalog(conn), sink)
    if gate is not None:
        changelog.put_in_front(gate.stage(changelog.builder))
    handler = StreamingHandler(changelog, str(spill))
    held = 0
    for lsn, data in messages:
        try:
            handler.feed(data, lsn)
        except GateHeld:
            held += 1
            assert gate is not None
            gate.release("public", "big")
            handler.feed(data, lsn)
    sink.flush()
    sink.close()
    return held


def test_replay_held_by_the_import_gate_resumes_where_it_stopped(
    db: Database, conn: Conn, tmp_path: Path
) -> None:
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE big").format(sql.Identifier(db.publication))
    )
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot,))
    # the SQL functions decode only flushed WAL; the test server commits asynchronously
    conn.execute("SET synchronous_commit = on")
    with conn.transaction():
        insert(conn, 1, 3000)
    messages = peek_streamed(conn, db.slot, db.publication)
    assert any(data[:1] == b"c" for _, data in messages)  # a Stream Commit: it was streamed

    plain, gated = tmp_path / "plain.jsonl", tmp_path / "gated.jsonl"
    assert replay(conn, messages, plain, tmp_path / "spill1", None) == 0
    gate = ImportGate()
    # an import of `big` is starting: its snapshot is not known yet, every change waits
    gate.hold("public", "big", keyless=False)
    assert replay(conn, messages, gated, tmp_path / "spill2", gate) == 1
    expected = modifications(plain)
    assert ids(expected) == list(range(1, 3001))
    assert_one_transaction(expected)
    assert modifications(gated) == expected
    assert spill_files(tmp_path / "spill2") == []


def test_streamed_changes_of_a_rolled_back_savepoint_are_dropped(
    db: Database, conn: Conn, tmp_path: Path
) -> None:
    """In process, on the server's own messages: the rolled-back subtransaction's
    changes were streamed (so pg2sink held them) and none of them reaches the sink."""
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE big").format(sql.Identifier(db.publication))
    )
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot,))
    conn.execute("SET synchronous_commit = on")
    with conn.transaction():
        insert(conn, 1, 1000)
        conn.execute("SAVEPOINT s1")
        insert(conn, 1001, 2000)
        conn.execute("ROLLBACK TO SAVEPOINT s1")
        insert(conn, 2001, 2500)
    messages = peek_streamed(conn, db.slot, db.publication)
    aborts = [decode(data) for _, data in messages if data[:1] == b"A"]
    assert len(aborts) == 1 and isinstance(aborts[0], StreamAbort)
    subxid = aborts[0].subxid
    assert subxid != aborts[0].xid
    streamed_in_subxact = [
        data for _, data in messages if data[:1] == b"I" and int.from_bytes(data[1:5]) == subxid
    ]
    assert len(streamed_in_subxact) > 100  # the server did stream them before the rollback

    out, spill = tmp_path / "out.jsonl", tmp_path / "spill"
    replay(conn, messages, out, spill, None)
    mods = modifications(out)
    assert ids(mods) == [*range(1, 1001), *range(2001, 2501)]
    assert_one_transaction(mods)
    assert spill_files(spill) == []


def test_out_of_order_stream_messages_are_one_clear_error(conn: Conn, tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path / "out.jsonl"))
    sink.open()
    handler = StreamingHandler(ChangelogHandler(Catalog(conn), sink), str(tmp_path / "spill"))
    with pytest.raises(DecodeError, match="transaction 747 without its first segment"):
        handler.feed(g.STREAM_START_NEXT, 1)
    with pytest.raises(DecodeError, match="stream commit of transaction 747 that was never"):
        handler.feed(g.STREAM_COMMIT, 1)
    handler.feed(g.STREAM_START_FIRST, 1)
    with pytest.raises(DecodeError, match=r"unexpected pgoutput message 'B' \(0x42\) inside"):
        handler.feed(g.BEGIN, 2)
    with pytest.raises(DecodeError, match="streamed pgoutput message of 3 bytes"):
        handler.feed(g.STREAM_INSERT_BIG[:3], 2)
    handler.discard_spills()
    assert spill_files(tmp_path / "spill") == []
    sink.close()


def test_unusable_spill_dir_stops_with_one_line(db: Database, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    res = run_cli(
        *("--source", db.dsn, "--slot", db.slot, "--publication", db.publication),
        *("--file-path", str(tmp_path / "out.jsonl"), "--streaming"),
        *("--spill-dir", str(not_a_dir / "spill")),
    )
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert (
        last == f"pg2sink: error: cannot use --spill-dir '{not_a_dir / 'spill'}': Not a directory"
    )


def test_older_server_is_refused_in_one_line() -> None:
    check_streaming_server(140000)
    with pytest.raises(ServerConfigError, match=r"^--streaming needs PostgreSQL 14 or newer"):
        check_streaming_server(130012)
