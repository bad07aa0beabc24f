"""The import gate against real pgoutput bytes (PostgreSQL 15) and the real builder.

The gate is a stage in front of the builder: its feed passes, leaves out or holds (raises
GateHeld, a pipeline.Held) each message; the builder's own state is never changed by it.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.catalog.catalog import Catalog
from pg2sink.changelog.builder import ChangelogBuilder
from pg2sink.changelog.records import Modification, Record
from pg2sink.imports import gate as gate_module
from pg2sink.imports.gate import GateHeld, GateStage, ImportGate
from pg2sink.imports.snapshot import Visibility, current_snapshot
from pg2sink.pipeline import Held
from tests.conftest import Database


def _changes(
    conn: psycopg.Connection[TupleRow], db: Database, statements: list[str]
) -> tuple[list[tuple[int, bytes]], Visibility, int]:
    """pgoutput messages of `statements` (one transaction each); the snapshot and WAL
    position taken after the first one, as an import would."""
    conn.execute("SET synchronous_commit = on")  # decoding reads flushed WAL only
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(db.publication))
    )
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot,))
    conn.execute(statements[0])
    vis = current_snapshot(conn)
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'").fetchone()
    assert row is not None
    for statement in statements[1:]:
        conn.execute(statement)
    rows = conn.execute(
        "SELECT lsn - '0/0', data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
        " 'proto_version', '1', 'publication_names', %s)",
        (db.slot, db.publication),
    ).fetchall()
    return [(int(r[0]), bytes(r[1])) for r in rows], vis, int(row[0])


def _builder(conn: psycopg.Connection[TupleRow]) -> tuple[ChangelogBuilder, list[Record]]:
    out: list[Record] = []
    return ChangelogBuilder(Catalog(conn), out.append), out


def _feed_until_held(stage: GateStage, messages: list[tuple[int, bytes]]) -> int:
    """Feed messages in order until the gate holds one; its index."""
    for i, (at, data) in enumerate(messages):
        try:
            stage.feed(data, at)
        except GateHeld as e:
            assert isinstance(e, Held)  # what the replication loop catches
            assert e.table == "public.t"
            return i
    raise AssertionError("the gate held no message")


def _ops(out: list[Record]) -> list[tuple[str, object]]:
    return [(r.operation, r.after) for r in out if isinstance(r, Modification)]


def test_changes_the_snapshot_does_not_see_wait_for_the_import(db: Database) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    messages, vis, lsn = _changes(
        conn,
        db,
        ["INSERT INTO t VALUES (1, 'seen')", "UPDATE t SET v = 'newer' WHERE id = 1"],
    )
    builder, out = _builder(conn)
    gate = ImportGate()
    stage = gate.stage(builder)
    gate.hold("public", "t", keyless=False)
    gate.open_snapshot("public", "t", vis, lsn)
    held_at = _feed_until_held(stage, messages)
    # the change the snapshot sees went through
    assert _ops(out) == [("INSERT", {"id": 1, "v": "seen"})]
    emitted = len(out)
    with pytest.raises(GateHeld) as held:  # still held: nothing of it written
        stage.feed(messages[held_at][1], messages[held_at][0])
    assert len(out) == emitted
    # the loop waits on the gate: finish() wakes it
    finish = threading.Timer(0.2, gate.finish, ("public", "t"))
    finish.start()
    started = time.monotonic()
    held.value.wait(60)
    assert time.monotonic() - started < 30
    finish.join()
    for at, data in messages[held_at:]:
        stage.feed(data, at)
    assert _ops(out)[-1] == ("UPDATE", {"id": 1, "v": "newer"})
    # past the snapshot's position: the table left the gate
    assert gate.tables() == []
    assert builder.tag_counts[ord("U")] == 1  # counted once, though fed twice


def test_a_keyless_tables_changes_the_import_carries_are_left_out(db: Database) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE k (x int, y text)")
    messages, vis, lsn = _changes(
        conn,
        db,
        [
            "INSERT INTO k VALUES (1, 'in the import')",
            "TRUNCATE k",
            "INSERT INTO k VALUES (2, 'after')",
        ],
    )
    builder, out = _builder(conn)
    gate = ImportGate()
    stage = gate.stage(builder)
    gate.pending("public", "k")  # job created, not started: everything is in its snapshot
    start = messages[0]
    stage.feed(start[1], start[0])  # Begin
    gate.hold("public", "k", keyless=True)
    gate.open_snapshot("public", "k", vis, lsn)
    gate.finish("public", "k")  # the import ran; the stream lagged behind
    for at, data in messages[1:]:
        stage.feed(data, at)
    # the visible INSERT is left out (it is an import row); what follows passes
    assert _ops(out) == [("TRUNCATE", None), ("INSERT", {"x": 2, "y": "after"})]


def test_a_gated_tables_changes_bypass_the_raw_writer_until_it_leaves(db: Database) -> None:
    """A sink's raw writer (the Kafka sink's C encoder) would bypass admit(): the stage
    decides a gated table's changes itself and hands the builder only what passes (its
    slow path); once the table leaves, its changes take the raw writer again. The
    builder's relation keeps its raw writer throughout: the gate changes nothing of it."""
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    messages, vis, lsn = _changes(
        conn,
        db,
        [
            "INSERT INTO t VALUES (1, 'seen')",
            "UPDATE t SET v = 'newer' WHERE id = 1",
            "INSERT INTO t VALUES (2, 'later')",
        ],
    )
    out: list[Record] = []
    raw: list[bytes] = []

    def write_raw(data: bytes, *_: object) -> bool:
        raw.append(data)
        return True

    builder = ChangelogBuilder(Catalog(conn), out.append, row_writer=lambda table: write_raw)
    gate = ImportGate()
    stage = gate.stage(builder)
    gate.hold("public", "t", keyless=False)
    gate.open_snapshot("public", "t", vis, lsn)
    held_at = _feed_until_held(stage, messages)
    (rel,) = builder.relations.values()
    assert rel.write_row is write_raw and raw == []  # the INSERT went through admit()
    assert _ops(out) == [("INSERT", {"id": 1, "v": "seen"})]
    gate.finish("public", "t")
    for at, data in messages[held_at:]:
        stage.feed(data, at)
    assert gate.tables() == []
    assert rel.write_row is write_raw
    # the UPDATE took the slow path (it left the gate); the last INSERT the raw writer
    assert _ops(out)[-1] == ("UPDATE", {"id": 1, "v": "newer"})
    assert len(raw) == 1 and raw[0][0] == ord("I")


def test_a_held_stream_says_why_in_one_warning_per_interval(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(gate_module, "HELD_WARNING_INTERVAL", 0.3)
    gate = ImportGate()
    held = GateHeld(gate, "public.t", ("public", "t"))
    waits = 0
    with caplog.at_level(logging.WARNING, logger="pg2sink.imports.gate"):
        deadline = time.monotonic() + 0.4
        while time.monotonic() < deadline:
            held.wait(0.02)
            waits += 1
        gate.note("public", "t", "its import goes on in a new Spark session after: X")
        deadline = time.monotonic() + 0.4
        while time.monotonic() < deadline:
            held.wait(0.02)
            waits += 1
    said = [r.getMessage() for r in caplog.records if "still paused" in r.getMessage()]
    assert 2 <= len(said) <= 3 and waits > 2 * len(said), (said, waits)
    assert said[0].endswith(": its import is running")
    assert said[-1].endswith(": its import goes on in a new Spark session after: X")
    assert said[0].startswith("stream still paused at a change of public.t after ")
