"""Transaction metadata (sinks/txmeta.py): a BEGIN and an END record per transaction that
changed a published table, in the file sink (--transactions) and in Kafka
(--transaction-topic, with and without --exactly-once), against real servers."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pg2sink.sinks.txmeta import TransactionTracker
from tests.conftest import Database, KafkaStack, read_jsonl, wait_for
from tests.sinks.kafka.kafka_support import create_topic, read_committed
from tests.sinks.kafka.test_kafka import kafka_args
from tests.support import Proc, start

T = datetime(2026, 11, 24, 5, 0, 0, 250000, tzinfo=UTC)


def test_tracker_begins_at_the_first_change_and_ends_at_the_commit() -> None:
    out: list[dict[str, Any]] = []
    tracker = TransactionTracker(out.append)
    tracker.checkpoint(50)  # a keepalive: no transaction, nothing
    for name in ("a", "b", "a"):
        tracker.begin(7, T)
        tracker.count("public", name)
    tracker.checkpoint(100)
    tracker.begin(8, T)
    tracker.count("public", "b")
    tracker.begin(9, T)  # no checkpoint between: 8 ends without its LSN
    tracker.count("public", "a")
    tracker.checkpoint(300)
    ts = 1795496400250
    assert out == [
        {"status": "BEGIN", "id": "7", "event_count": None, "data_collections": None,
         "ts_ms": ts, "xid": 7, "lsn": None, "timestamp": T},
        {"status": "END", "id": "7", "event_count": 3,
         "data_collections": [{"data_collection": "public.a", "event_count": 2},
                              {"data_collection": "public.b", "event_count": 1}],
         "ts_ms": ts, "xid": 7, "lsn": 100, "timestamp": T},
        {"status": "BEGIN", "id": "8", "event_count": None, "data_collections": None,
         "ts_ms": ts, "xid": 8, "lsn": None, "timestamp": T},
        {"status": "END", "id": "8", "event_count": 1,
         "data_collections": [{"data_collection": "public.b", "event_count": 1}],
         "ts_ms": ts, "xid": 8, "lsn": None, "timestamp": T},
        {"status": "BEGIN", "id": "9", "event_count": None, "data_collections": None,
         "ts_ms": ts, "xid": 9, "lsn": None, "timestamp": T},
        {"status": "END", "id": "9", "event_count": 1,
         "data_collections": [{"data_collection": "public.a", "event_count": 1}],
         "ts_ms": ts, "xid": 9, "lsn": 300, "timestamp": T},
    ]  # fmt: skip


def workload(db: Database) -> None:
    """Four transactions: two tables; an update; a TRUNCATE of both; and one that changes
    an unpublished table only (no records)."""
    conn = db.connect()
    with conn.transaction():
        conn.execute("INSERT INTO a VALUES (1), (2)")
        conn.execute("INSERT INTO b VALUES (1)")
    conn.execute("UPDATE a SET id = 3 WHERE id = 2")
    conn.execute("TRUNCATE a, b")
    conn.execute("INSERT INTO hidden VALUES (1)")
    conn.execute("INSERT INTO a VALUES (4)")  # the end of the workload


def make_tables(db: Database) -> None:
    conn = db.connect()
    for t in ("a", "b", "hidden"):
        conn.execute(f"CREATE TABLE {t} (id int primary key)")


#: (operation, table) of the workload's changes, per transaction
EXPECTED = [
    [("INSERT", "a"), ("INSERT", "a"), ("INSERT", "b")],
    [("UPDATE", "a")],
    [("TRUNCATE", "a"), ("TRUNCATE", "b")],
    [("INSERT", "a")],
]


def check_boundaries(
    transactions: list[dict[str, Any]], changes: list[list[dict[str, Any]]]
) -> None:
    """BEGIN and END of each transaction in order, their counts those of its changes."""
    assert [t["status"] for t in transactions] == ["BEGIN", "END"] * len(EXPECTED)
    assert [[(c["operation"], c["name"]) for c in group] for group in changes] == EXPECTED
    pairs = zip(transactions[::2], transactions[1::2], strict=True)
    for (begin, end), group in zip(pairs, changes, strict=True):
        xid = group[0]["xid"]
        assert {c["xid"] for c in group} == {xid}
        assert [c["sequence"] for c in group] == list(range(len(group)))
        assert begin["id"] == end["id"] == str(xid) and begin["xid"] == end["xid"] == xid
        assert begin["event_count"] is None and begin["data_collections"] is None
        assert begin["lsn"] is None and isinstance(end["lsn"], int)
        assert begin["ts_ms"] == end["ts_ms"] and begin["timestamp"] == group[0]["timestamp"]
        assert end["event_count"] == len(group)
        per_table = Counter(f"public.{c['name']}" for c in group)
        assert end["data_collections"] == [
            {"data_collection": name, "event_count": n} for name, n in per_table.items()
        ]
        assert all(c["lsn"] < end["lsn"] for c in group)
    ends = [t["lsn"] for t in transactions[1::2]]
    assert ends == sorted(ends)


def test_file_sink_writes_transaction_lines_around_each_transaction(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    make_tables(db)
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out, "--transactions", "-T", "public.hidden")
    workload(db)
    wait_for(lambda: len(read_jsonl(out)) >= 17, what="the workload's lines")
    assert p.stop() == 0
    lines = [r for r in read_jsonl(out) if r["kind"] != "schema"]
    kinds = "".join("t" if r["kind"] == "transaction" else "c" for r in lines)
    # every change between its transaction's BEGIN and END
    assert kinds == "tccct" + "tct" + "tcct" + "tct"
    transactions = [r for r in lines if r["kind"] == "transaction"]
    groups: list[list[dict[str, Any]]] = [[]]
    for r in lines[1:]:
        if r["kind"] == "transaction":
            if r["status"] == "END":
                groups.append([])
        else:
            groups[-1].append(r)
    check_boundaries(transactions, groups[:-1])
    assert list(transactions[0]) == [
        "kind", "status", "id", "event_count", "data_collections", "ts_ms", "xid", "lsn",
        "timestamp",
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_kafka_transaction_topic_has_begin_and_end_of_each_transaction(
    db: Database,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    exactly_once: bool,
) -> None:
    make_tables(db)
    tx_topic = f"{topic_prefix}.transactions"
    data = [f"{topic_prefix}.public.a", f"{topic_prefix}.public.b"]
    for topic in (tx_topic, *data):
        create_topic(kafka_stack.bootstrap_servers, topic, partitions=1)
    extra = ["--transaction-topic", tx_topic, "-T", "public.hidden"]
    if exactly_once:
        extra.append("--exactly-once")
    p = pg2sink_proc(*kafka_args(kafka_stack, topic_prefix, *extra, avro=False)).start()
    p.wait_streaming()
    workload(db)
    wait_for(
        lambda: len(read_committed(kafka_stack.bootstrap_servers, [tx_topic])) >= 8,
        what="the transaction records",
    )
    assert p.stop() == 0
    records = read_committed(kafka_stack.bootstrap_servers, [tx_topic])
    assert [m.key for m in records] == [{"id": m.value["id"]} for m in records]
    changes = read_committed(kafka_stack.bootstrap_servers, data)
    # the data messages' xid header is the transaction's id
    assert all(m.headers["xid"] == str(m.value["xid"]) for m in changes)
    by_xid: dict[int, list[dict[str, Any]]] = {}
    for m in sorted(changes, key=lambda m: (m.value["lsn"], m.value["sequence"])):
        by_xid.setdefault(m.value["xid"], []).append(m.value)
    groups = sorted(by_xid.values(), key=lambda g: g[0]["lsn"])
    check_boundaries([m.value for m in records], groups)
