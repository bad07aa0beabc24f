"""What the records preserve, end to end against a real PostgreSQL (docs/changes.md).

Replica identity before-images, unchanged TOAST values, DDL while streaming, TRUNCATE
options, partitioned tables and logical decoding messages, each run through pg2sink as a
process with the file sink (and the Kafka sink where its encoding differs).
"""

from __future__ import annotations

import base64
import os
import signal
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import TupleRow

from pg2sink.changelog.records import Operation, Schema, Truncation
from pg2sink.formats.kafka import JsonFormat
from tests.conftest import Database, KafkaStack, read_jsonl, wait_for
from tests.sinks.kafka.test_kafka import Reader, registry_get
from tests.sinks.kafka.test_kafka import start as start_kafka
from tests.support import FAST, Proc, scalar, start

TOAST = {"unchanged_toast": True}


def records(out: Path, kind: str | None = None) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(out) if kind is None or r["kind"] == kind]


def wait_records(out: Path, n: int, kind: str = "modification") -> list[dict[str, Any]]:
    wait_for(lambda: len(records(out, kind)) >= n, what=f"{n} {kind} records")
    return records(out, kind)


# --- 2. replica identity ----------------------------------------------------------


def test_before_images_per_replica_identity(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE dflt (id int primary key, v text)")
    conn.execute("CREATE TABLE full_ (id int primary key, v text)")
    conn.execute("ALTER TABLE full_ REPLICA IDENTITY FULL")
    # USING INDEX beside a different primary key: the index is the identity
    conn.execute("CREATE TABLE idx (id int primary key, code text not null, v text)")
    conn.execute("CREATE UNIQUE INDEX idx_code ON idx (code)")
    conn.execute("ALTER TABLE idx REPLICA IDENTITY USING INDEX idx_code")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    conn.execute("INSERT INTO dflt VALUES (1, 'a')")
    conn.execute("INSERT INTO full_ VALUES (1, 'a')")
    conn.execute("INSERT INTO idx VALUES (1, 'c1', 'a')")
    for table, key in (("dflt", "id"), ("full_", "id"), ("idx", "code")):
        new_key = "2" if key == "id" else "'c2'"
        conn.execute(f"UPDATE {table} SET v = 'b'")  # key unchanged
        conn.execute(f"UPDATE {table} SET {key} = {new_key}")  # key changed
        conn.execute(f"DELETE FROM {table}")
    mods = wait_records(out, 12)
    assert p.stop() == 0
    by_table: dict[str, list[tuple[str, Any, Any]]] = {}
    for m in mods:
        by_table.setdefault(m["name"], []).append((m["operation"], m["before"], m["after"]))
    assert by_table["dflt"] == [
        ("INSERT", None, {"id": 1, "v": "a"}),
        ("UPDATE", None, {"id": 1, "v": "b"}),
        ("UPDATE", {"id": 1}, {"id": 2, "v": "b"}),  # the old key, to delete it
        ("DELETE", {"id": 2}, None),
    ]
    assert by_table["full_"] == [
        ("INSERT", None, {"id": 1, "v": "a"}),
        ("UPDATE", {"id": 1, "v": "a"}, {"id": 1, "v": "b"}),
        ("UPDATE", {"id": 1, "v": "b"}, {"id": 2, "v": "b"}),
        ("DELETE", {"id": 2, "v": "b"}, None),
    ]
    assert by_table["idx"] == [
        ("INSERT", None, {"id": 1, "code": "c1", "v": "a"}),
        ("UPDATE", None, {"id": 1, "code": "c1", "v": "b"}),
        ("UPDATE", {"code": "c1"}, {"id": 1, "code": "c2", "v": "b"}),
        ("DELETE", {"code": "c2"}, None),
    ]
    schemas = {s["name"]: s["schema"] for s in records(out, "schema")}
    # the key a consumer can rely on for every change is the identity's columns
    assert schemas["dflt"]["pg.primary_key"] == ["id"]
    assert schemas["idx"]["pg.primary_key"] == ["code"]
    assert [f["name"] for f in schemas["idx"]["fields"] if f["pg.key"]] == ["code"]


def test_replica_identity_nothing_streams_inserts_and_postgres_refuses_the_rest(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE nothing (id int primary key, v text)")
    conn.execute("ALTER TABLE nothing REPLICA IDENTITY NOTHING")
    conn.execute("CREATE TABLE nokey (id int, v text)")  # DEFAULT without a key
    out = tmp_path / "out.jsonl"
    # published on purpose: by default such tables are left out (tests/test_publication_cli.py)
    p = start(pg2sink_proc, out, "--allow-no-replica-identity")
    for table in ("nothing", "nokey"):
        conn.execute(f"INSERT INTO {table} VALUES (1, 'a')")
        # PostgreSQL refuses to log these: nothing can reach a consumer without a before
        for statement in (f"UPDATE {table} SET v = 'b'", f"DELETE FROM {table}"):
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                conn.execute(statement)
        conn.execute(f"TRUNCATE {table}")
    mods = wait_records(out, 4)
    assert p.stop() == 0
    assert [(m["name"], m["operation"], m["before"]) for m in mods] == [
        ("nothing", "INSERT", None),
        ("nothing", "TRUNCATE", None),
        ("nokey", "INSERT", None),
        ("nokey", "TRUNCATE", None),
    ]
    assert "nokey has no primary key or replica identity" in p.stderr()


# --- 3. unchanged TOAST values ----------------------------------------------------


def big_value(seed: int) -> str:
    """About 16 kB of incompressible text: stored out of line (TOASTed)."""
    return "".join(f"{(seed * 7919 + i) * 2654435761 % 4294967296:08x}" for i in range(2000))


def test_unchanged_toast_values_are_resolved_or_marked(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    for table in ("tdefault", "tfull"):
        conn.execute(f"CREATE TABLE {table} (id int primary key, n int, big text, doc bytea)")
        # EXTERNAL: out of line without compression, so the value is surely TOASTed
        conn.execute(f"ALTER TABLE {table} ALTER big SET STORAGE EXTERNAL")
        conn.execute(f"ALTER TABLE {table} ALTER doc SET STORAGE EXTERNAL")
    conn.execute("ALTER TABLE tfull REPLICA IDENTITY FULL")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    one, two = big_value(1), big_value(2)
    blob = os.urandom(5000)
    for table in ("tdefault", "tfull"):
        conn.execute(f"INSERT INTO {table} VALUES (1, 0, %s, %s)", (one, blob))
        conn.execute(f"UPDATE {table} SET n = 1")  # neither big value touched
        conn.execute(f"UPDATE {table} SET big = %s", (two,))  # big changed, doc not
        conn.execute(f"DELETE FROM {table}")
    mods = wait_records(out, 8)
    assert p.stop() == 0
    assert scalar(conn, "SELECT count(*) FROM pg_class WHERE relname LIKE 'pg_toast_%'") >= 2
    b64 = base64.b64encode(blob).decode()
    rows = {(m["name"], i % 4): (m["before"], m["after"]) for i, m in enumerate(mods)}
    assert rows[("tdefault", 0)] == (None, {"id": 1, "n": 0, "big": one, "doc": b64})
    # DEFAULT: PostgreSQL sent neither value, and the old row is not logged: the marker
    assert rows[("tdefault", 1)] == (None, {"id": 1, "n": 1, "big": TOAST, "doc": TOAST})
    assert rows[("tdefault", 2)] == (None, {"id": 1, "n": 1, "big": two, "doc": TOAST})
    assert rows[("tdefault", 3)] == ({"id": 1}, None)
    # FULL: the old row carries the values (detoasted), so `after` is complete
    full_1 = {"id": 1, "n": 1, "big": one, "doc": b64}
    full_2 = {"id": 1, "n": 1, "big": two, "doc": b64}
    assert rows[("tfull", 1)] == ({"id": 1, "n": 0, "big": one, "doc": b64}, full_1)
    assert rows[("tfull", 2)] == (full_1, full_2)
    assert rows[("tfull", 3)] == (full_2, None)


# --- 4. DDL while streaming -------------------------------------------------------


def fields(schema_record: dict[str, Any]) -> list[tuple[str, str]]:
    """(column, pg.type) of a Schema record."""
    out = []
    for f in schema_record["schema"]["fields"]:
        branch = f["type"][1]
        out.append((f["pg.column"], branch["pg.type"] if isinstance(branch, dict) else ""))
    return out


def test_ddl_while_streaming_gives_schemas_in_wal_order(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key, a int)")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    conn.execute("INSERT INTO t VALUES (1, 1)")
    conn.execute("ALTER TABLE t ADD COLUMN b text")
    conn.execute("INSERT INTO t VALUES (2, 2, 'b')")
    conn.execute("ALTER TABLE t ADD COLUMN c int NOT NULL DEFAULT 7")
    conn.execute("UPDATE t SET a = 10 WHERE id = 1")  # the default fills the old row
    with conn.transaction():  # DDL and DML in one transaction: still in order
        conn.execute("ALTER TABLE t DROP COLUMN a")
        conn.execute("INSERT INTO t VALUES (3, 'c', 3)")
    conn.execute("ALTER TABLE t ALTER COLUMN c TYPE bigint")
    conn.execute("INSERT INTO t VALUES (4, 'd', 4)")
    conn.execute("ALTER TABLE t RENAME COLUMN b TO bb")
    conn.execute("INSERT INTO t VALUES (5, 'e', 5)")
    conn.execute("ALTER TABLE t RENAME TO t2")
    conn.execute("INSERT INTO t2 VALUES (6, 'f', 6)")
    conn.execute("CREATE TABLE u (id int primary key)")
    wait_for(
        lambda: scalar(
            conn,
            f"SELECT count(*) FROM pg_publication_tables WHERE pubname = '{db.publication}'"
            " AND tablename = 'u'",
        ),
        what="u to join the publication",
    )
    conn.execute("INSERT INTO u VALUES (1)")
    conn.execute("DROP TABLE u")  # no record: pgoutput sends nothing for a DROP
    conn.execute("INSERT INTO t2 VALUES (7, 'g', 7)")
    wait_records(out, 9)
    assert p.stop() == 0
    lines = records(out)
    shown = []
    for r in lines:
        if r["kind"] == "schema":
            shown.append(("schema", r["name"], fields(r)))
        else:
            shown.append((r["operation"], r["name"], r["after"]))
    assert shown == [
        ("schema", "t", [("id", "int4"), ("a", "int4")]),
        ("INSERT", "t", {"id": 1, "a": 1}),
        ("schema", "t", [("id", "int4"), ("a", "int4"), ("b", "text")]),
        ("INSERT", "t", {"id": 2, "a": 2, "b": "b"}),
        ("schema", "t", [("id", "int4"), ("a", "int4"), ("b", "text"), ("c", "int4")]),
        ("UPDATE", "t", {"id": 1, "a": 10, "b": None, "c": 7}),
        ("schema", "t", [("id", "int4"), ("b", "text"), ("c", "int4")]),
        ("INSERT", "t", {"id": 3, "b": "c", "c": 3}),
        ("schema", "t", [("id", "int4"), ("b", "text"), ("c", "int8")]),
        ("INSERT", "t", {"id": 4, "b": "d", "c": 4}),
        ("schema", "t", [("id", "int4"), ("bb", "text"), ("c", "int8")]),
        ("INSERT", "t", {"id": 5, "bb": "e", "c": 5}),
        ("schema", "t2", [("id", "int4"), ("bb", "text"), ("c", "int8")]),
        ("INSERT", "t2", {"id": 6, "bb": "f", "c": 6}),
        ("schema", "u", [("id", "int4")]),
        ("INSERT", "u", {"id": 1}),
        ("INSERT", "t2", {"id": 7, "bb": "g", "c": 7}),
    ]
    # WAL order: each Schema is at or before the change that first has its shape
    lsns = [r["lsn"] for r in lines]
    assert lsns == sorted(lsns)


# --- 5. TRUNCATE ------------------------------------------------------------------


def test_truncate_options_in_the_records(db: Database, pg2sink_proc: Proc, tmp_path: Path) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE parent (id int primary key)")
    conn.execute("CREATE TABLE child (id int primary key, parent_id int references parent)")
    conn.execute("CREATE TABLE counter (id serial primary key, v text)")
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    conn.execute("INSERT INTO parent VALUES (1)")
    conn.execute("INSERT INTO child VALUES (1, 1)")
    conn.execute("INSERT INTO counter (v) VALUES ('a')")
    conn.execute("TRUNCATE parent, counter RESTART IDENTITY CASCADE")  # child cascades
    conn.execute("TRUNCATE counter")
    mods = wait_records(out, 7)
    assert p.stop() == 0
    truncates = [m for m in mods if m["operation"] == "TRUNCATE"]
    # the named tables, then the one CASCADE reached, numbered within the transaction
    assert [(m["name"], m["sequence"]) for m in truncates[:3]] == [
        ("parent", 0),
        ("counter", 1),
        ("child", 2),
    ]
    assert len({m["lsn"] for m in truncates[:3]}) == 1  # one statement
    assert len({m["xid"] for m in truncates[:3]}) == 1
    for m in truncates[:3]:
        assert m["truncate"] == {"cascade": True, "restart_identity": True}
        assert m["before"] is None and m["after"] is None
    assert truncates[3]["name"] == "counter"
    assert truncates[3]["truncate"] == {"cascade": False, "restart_identity": False}
    # other operations keep their shape: no `truncate` key
    assert all("truncate" not in m for m in mods if m["operation"] != "TRUNCATE")


def test_truncate_options_in_kafka_json() -> None:
    m = Truncation(
        datetime(2026, 1, 1, tzinfo=UTC), 0, 10, 5, Operation.TRUNCATE, "s", "t", None, None
    )
    m.restart_identity = True
    table = JsonFormat().table(_schema_record(), "topic")
    value = table.value(m)
    assert b'"truncate":{"cascade":false,"restart_identity":true}' in value
    assert b'"operation":"TRUNCATE"' in value


def _schema_record() -> Schema:
    row = {"type": "record", "name": "value", "namespace": "s.t", "fields": []}
    return Schema(datetime(2026, 1, 1, tzinfo=UTC), 1, "s", "t", row)


# --- 6. partitioned tables --------------------------------------------------------


def make_partitioned(conn: psycopg.Connection[TupleRow]) -> None:
    conn.execute(
        "CREATE TABLE m (id int, region text, primary key (id, region)) PARTITION BY LIST (region)"
    )
    conn.execute("CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu')")
    conn.execute("CREATE TABLE m_us PARTITION OF m FOR VALUES IN ('us')")


def pubviaroot(conn: psycopg.Connection[TupleRow], pub: str) -> bool:
    return bool(scalar(conn, "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (pub,)))


def test_partitions_without_and_with_publish_via_partition_root(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    make_partitioned(conn)
    out = tmp_path / "out.jsonl"
    # without the flag: each partition's changes arrive under its own name
    p = start(pg2sink_proc, out)
    assert not pubviaroot(conn, db.publication)
    conn.execute("INSERT INTO m VALUES (1, 'eu'), (2, 'us')")
    conn.execute("CREATE TABLE m_asia PARTITION OF m FOR VALUES IN ('asia')")
    conn.execute("INSERT INTO m VALUES (3, 'asia')")  # a new partition: no action needed
    wait_records(out, 3)
    assert p.stop() == 0
    members = conn.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1",
        (db.publication,),
    ).fetchall()
    # pg_publication_tables lists the leaves; the publication itself holds only the root
    assert [r[0] for r in members] == ["m_asia", "m_eu", "m_us"]
    assert scalar(
        conn,
        "SELECT array_agg(prrelid::regclass::text) FROM pg_publication_rel r"
        f" JOIN pg_publication p ON p.oid = r.prpubid WHERE pubname = '{db.publication}'",
    ) == ["m"]
    assert [(m["name"], m["after"]) for m in records(out, "modification")] == [
        ("m_eu", {"id": 1, "region": "eu"}),
        ("m_us", {"id": 2, "region": "us"}),
        ("m_asia", {"id": 3, "region": "asia"}),
    ]
    # with the flag: the existing publication is altered, changes arrive as the root's
    p = start(pg2sink_proc, out, "--publish-via-partition-root")
    assert pubviaroot(conn, db.publication)
    conn.execute("INSERT INTO m VALUES (4, 'eu')")
    conn.execute("CREATE TABLE m_af PARTITION OF m FOR VALUES IN ('af')")
    conn.execute("INSERT INTO m VALUES (5, 'af')")
    conn.execute("UPDATE m SET region = 'us' WHERE id = 4")  # moves between partitions
    wait_records(out, 7)
    assert p.stop() == 0
    later = records(out)[-5:]
    assert later[0]["kind"] == "schema" and later[0]["name"] == "m"
    assert [(r["name"], r["operation"], r["before"], r["after"]) for r in later[1:]] == [
        ("m", "INSERT", None, {"id": 4, "region": "eu"}),
        ("m", "INSERT", None, {"id": 5, "region": "af"}),
        # a row moving partitions is a DELETE and an INSERT in PostgreSQL
        ("m", "DELETE", {"id": 4, "region": "eu"}, None),
        ("m", "INSERT", None, {"id": 4, "region": "us"}),
    ]
    # and back: the flag off alters the publication again
    p = start(pg2sink_proc, out)
    assert not pubviaroot(conn, db.publication)
    assert p.stop() == 0


def test_publish_via_partition_root_from_the_environment(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    make_partitioned(conn)
    out = tmp_path / "out.jsonl"
    p = pg2sink_proc(
        "--file-path", str(out), *FAST, env={"PG2SINK_PUBLISH_VIA_PARTITION_ROOT": "true"}
    ).start()
    p.wait_streaming()
    assert pubviaroot(conn, db.publication)
    conn.execute("INSERT INTO m VALUES (1, 'us')")
    assert wait_records(out, 1)[0]["name"] == "m"
    assert p.stop() == 0


# --- 7. logical decoding messages -------------------------------------------------


def emit(conn: psycopg.Connection[TupleRow], transactional: bool, prefix: str, content: Any) -> int:
    return int(
        scalar(
            conn,
            "SELECT pg_logical_emit_message(%s, %s, %s) - '0/0'",
            (transactional, prefix, content),
        )
    )


def test_messages_are_forwarded_filtered_and_confirmed(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    out = tmp_path / "out.jsonl"
    args = ("--messages", "--message-prefix", "app", "--message-prefix", "audit")
    p = start(pg2sink_proc, out, *args)
    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (1)")
        emit(conn, True, "app", "hello")
        emit(conn, True, "other", "filtered out")
        xid = int(scalar(conn, "SELECT txid_current()"))
    binary = bytes([0, 255, 1, 128])
    emit(conn, False, "audit", binary)
    # a non-transactional message is sent even when its transaction rolls back;
    # a transactional one is not
    with pytest.raises(psycopg.errors.RaiseException), conn.transaction():
        emit(conn, False, "app", "kept despite rollback")
        emit(conn, True, "app", "rolled back")
        conn.execute("DO $$ BEGIN RAISE EXCEPTION 'abort'; END $$")
    last = emit(conn, False, "app", "last")
    msgs = wait_records(out, 4, "message")
    # confirmed past the last message once it is durable (keepalive checkpoints)
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) > last, what="confirmation past the message")
    assert p.stop(signal.SIGKILL) == -signal.SIGKILL
    mod = records(out, "modification")[0]
    decoded = [(m["transactional"], m["prefix"], base64.b64decode(m["content"])) for m in msgs]
    assert decoded == [
        (True, "app", b"hello"),
        (False, "audit", binary),
        (False, "app", b"kept despite rollback"),
        (False, "app", b"last"),
    ]
    assert msgs[0]["xid"] == mod["xid"] == xid % 2**32
    assert msgs[0]["timestamp"] == mod["timestamp"]
    assert all(m["xid"] is None and m["timestamp"] is None for m in msgs[1:])
    assert msgs[-1]["lsn"] == last
    lines = records(out)
    assert [r["kind"] for r in lines].index("message") > [r["kind"] for r in lines].index(
        "modification"
    )  # WAL order inside the transaction: the insert, then the message
    # a restart repeats nothing that was confirmed
    p2 = start(pg2sink_proc, out, *args)
    emit(conn, False, "app", "after restart")
    wait_records(out, 5, "message")
    assert p2.stop() == 0
    contents = [base64.b64decode(m["content"]) for m in records(out, "message")]
    assert contents.count(b"last") == 1 and contents[-1] == b"after restart"


def commits(out: Path, n: int) -> bool:
    return out.exists() and out.read_text().count("COMMIT") >= n


def test_messages_are_requested_from_the_server_only_with_the_flag(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    """--decode-only prints every message the server sends: without --messages it sends
    none (the option is not in START_REPLICATION), with it both kinds."""
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    printed = []
    for n, flags in enumerate(((), ("--messages",))):
        out = tmp_path / f"decoded{n}.txt"
        p = start(pg2sink_proc, out, "--decode-only", *flags)
        with conn.transaction():
            emit(conn, True, "app", "x")
            conn.execute("INSERT INTO t VALUES (%s)", (n,))
        emit(conn, False, "app", "y")
        conn.execute("INSERT INTO t VALUES (%s)", (n + 10,))
        # --decode-only never advances the slot: the second run decodes the first run's
        # two transactions again before its own two (waiting for two commits only made
        # the count of its MESSAGE lines depend on where it was stopped)
        wait_for(partial(commits, out, 2 * (n + 1)), what="every commit decoded")
        assert p.stop() == 0
        printed.append(out.read_text())
    assert "MESSAGE" not in printed[0]
    # both runs' messages, the first run's now sent too: the option is the request
    assert printed[1].count("MESSAGE") == 4
    # and a real run without --messages writes no Message record
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out)
    assert len(wait_records(out, 4)) == 4  # the changes --decode-only left in the slot
    assert p.stop() == 0
    assert records(out, "message") == []


def test_message_prefix_without_messages_is_an_error(pg2sink_proc: Proc) -> None:
    p = pg2sink_proc("--message-prefix", "app").start()
    assert p.proc is not None and p.proc.wait(30) == 2
    assert "pg2sink: error: --message-prefix filters --messages: add --messages" in p.stderr()


# --- Kafka: schema evolution in the registry, TRUNCATE options, messages -----------


@pytest.mark.slow
def test_kafka_subjects_evolve_and_carry_truncate_toast_and_messages(
    db: Database,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    tmp_path: Path,
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id serial primary key, a int)")
    conn.execute("CREATE TABLE doc (id int primary key, n int, big text)")
    conn.execute("ALTER TABLE doc ALTER big SET STORAGE EXTERNAL")
    p = start_kafka(pg2sink_proc, kafka_stack, topic_prefix, "--messages")
    conn.execute("INSERT INTO doc VALUES (1, 0, %s)", (big_value(3),))
    conn.execute("UPDATE doc SET n = 1")  # big unchanged, not sent: listed, null
    topic = f"{topic_prefix}.public.t"
    conn.execute("INSERT INTO t (a) VALUES (1)")
    conn.execute("ALTER TABLE t ADD COLUMN b text")  # nullable: compatible
    conn.execute("INSERT INTO t (a, b) VALUES (2, 'two')")
    conn.execute("ALTER TABLE t DROP COLUMN a")  # every field has a default: compatible
    conn.execute("INSERT INTO t (b) VALUES ('three')")
    conn.execute("ALTER TABLE t RENAME COLUMN b TO bee")  # a drop and an add: compatible
    conn.execute("INSERT INTO t (bee) VALUES ('four')")
    conn.execute("TRUNCATE t RESTART IDENTITY")
    emit(conn, False, "app", "done")
    changes = Reader(kafka_stack.bootstrap_servers, [topic], kafka_stack.registry_url)
    messages = Reader(kafka_stack.bootstrap_servers, [f"{topic_prefix}.messages"], None)
    docs = Reader(
        kafka_stack.bootstrap_servers, [f"{topic_prefix}.public.doc"], kafka_stack.registry_url
    )
    try:
        got = changes.read(5)
        note = messages.read(1)[0]
        inserted, updated = (m.value for m in docs.read(2))
    finally:
        changes.close()
        messages.close()
        docs.close()
    assert p.stop() == 0
    # the registry's global rule is BACKWARD (scripts/services.py, docs/changes.md)
    assert registry_get(kafka_stack, f"subjects/{topic}-value/versions") == [1, 2, 3, 4]
    ids = [m.value_schema_id for m in got]
    assert ids[0] < ids[1] < ids[2] < ids[3] == ids[4]
    assert [m.value["after"] for m in got[:4]] == [
        {"id": 1, "a": 1},
        {"id": 2, "a": 2, "b": "two"},
        {"id": 3, "b": "three"},
        {"id": 4, "bee": "four"},
    ]
    assert all(m.value["truncate"] is None for m in got[:4])
    truncate = got[4]
    assert truncate.value["operation"] == "TRUNCATE" and truncate.raw_key is None
    assert truncate.value["truncate"] == {"cascade": False, "restart_identity": True}
    assert note.raw_key == b"app"
    assert note.value["kind"] == "message" and note.value["transactional"] is False
    assert base64.b64decode(note.value["content"]) == b"done"
    assert note.headers["lsn"] == str(note.value["lsn"])
    # Avro has no room for the JSON marker: null in `after`, named in `unchanged_toast`
    assert inserted["after"]["big"] == big_value(3) and inserted["unchanged_toast"] == []
    assert updated["after"] == {"id": 1, "n": 1, "big": None}
    assert updated["unchanged_toast"] == ["big"]
