"""The Kinesis sink: its batching rules, and end to end against kinesalite.

kinesalite (the `kinesis_endpoint` fixture, or a services.Kinesalite a test stops and
starts) is a real Kinesis API server: pg2sink puts with boto3, the tests read every
shard back with boto3 as consumers do. kinesalite never answers PutRecords with a
partial failure or a throughput error, so the retry rules are tested on
batching.plan_retry with responses shaped as the AWS API reference documents them,
and through the sender with `Throttled`, a put of our own that fails the entries
of chosen keys as such a response says and forwards the rest to kinesalite.
"""

from __future__ import annotations

import itertools
import logging
import pickle
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
import services

from pg2sink.changelog.records import Message, Modification, Operation, Schema, Truncation
from pg2sink.errors import ConfigError, SinkError, SinkUnavailableError
from pg2sink.formats.jsonlines import record_line
from pg2sink.observability.stats import StreamStats
from pg2sink.retry import bounded_wait
from pg2sink.sinks.delivery import Marks as _Marks
from pg2sink.sinks.kinesis.batching import (
    BACKOFF_BASE,
    BACKOFF_CAP,
    MAX_RECORD_BYTES,
    MAX_RECORDS,
    MAX_REQUEST_BYTES,
    Entry,
    plan_retry,
    take_batch,
)
from pg2sink.sinks.kinesis.config import KinesisConfig
from pg2sink.sinks.kinesis.imports import KinesisImportTarget
from pg2sink.sinks.kinesis.payload import MESSAGES_KEY, Payload
from pg2sink.sinks.kinesis.sender import Sender
from pg2sink.sinks.kinesis.sink import KinesisSink
from tests.conftest import Database, run_cli, wait_for
from tests.sinks.kafka.test_kafka_health import api_url, status, status_without_slot
from tests.sinks.kinesis.kinesis_support import (
    AWS_ENV,
    create_stream,
    kinesis_args,
    kinesis_client,
    read_stream,
    start,
)
from tests.sinks.null.test_null import import_table
from tests.support import Proc, own_server

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient
    from mypy_boto3_kinesis.type_defs import PutRecordsRequestEntryTypeDef

T = datetime(2026, 11, 24, 4, 30, 0, 123456, tzinfo=UTC)
#: kinesalite's dummy credentials; their secret key is no word of pg2sink's log lines (the
#: sink redacts the secret key wherever it appears)


# --- PutRecords responses as the AWS API reference shows them ---------------------------


def stored(shard: int = 0, n: int = 1) -> dict[str, str]:
    return {"SequenceNumber": f"4960{n:052d}", "ShardId": f"shardId-{shard:012d}"}


def failed(code: str = "ProvisionedThroughputExceededException") -> dict[str, str]:
    messages = {
        "ProvisionedThroughputExceededException": "Rate exceeded for shard "
        "shardId-000000000001 in stream exampleStreamName under account 111111111111.",
        "InternalFailure": "Internal service failure.",
        "KMSAccessDeniedException": "User is not authorized to perform kms:GenerateDataKey",
    }
    return {"ErrorCode": code, "ErrorMessage": messages[code]}


def response(*records: Mapping[str, object]) -> dict[str, Any]:
    return {
        "FailedRecordCount": sum("ErrorCode" in r for r in records),
        "Records": list(records),
        "EncryptionType": "NONE",
    }


def test_plan_retry_of_a_full_success_sends_nothing_again() -> None:
    sent = [Entry("a", b"1"), Entry("b", b"2")]
    outcome = plan_retry(sent, response(stored(0, 1), stored(1, 2)))
    assert outcome.again == [] and outcome.failed == 0 and outcome.terminal is None


def test_plan_retry_sends_failed_entries_and_later_ones_of_their_key_in_order() -> None:
    a1, a2, a3 = Entry("a", b"a1"), Entry("a", b"a2"), Entry("a", b"a3")
    b1, b2, c1 = Entry("b", b"b1"), Entry("b", b"b2"), Entry("c", b"c1")
    sent = [a1, b1, a2, c1, b2, a3]
    outcome = plan_retry(
        sent,
        response(
            stored(0, 1),  # a1
            failed(),  # b1: throttled
            failed("InternalFailure"),  # a2
            stored(1, 2),  # c1
            stored(0, 3),  # b2: stored ahead of b1, so sent again after it
            stored(0, 4),  # a3: stored ahead of a2, so sent again after it
        ),
    )
    assert outcome.again == [b1, a2, b2, a3]
    assert outcome.errors == {"ProvisionedThroughputExceededException": 1, "InternalFailure": 1}
    assert outcome.failed == 2 and outcome.terminal is None


def test_plan_retry_names_a_failure_retrying_cannot_fix() -> None:
    sent = [Entry("a", b"1"), Entry("b", b"2")]
    outcome = plan_retry(sent, response(stored(), failed("KMSAccessDeniedException")))
    assert outcome.terminal == (
        "KMSAccessDeniedException: User is not authorized to perform kms:GenerateDataKey"
    )


def test_plan_retry_refuses_a_response_that_does_not_answer_each_entry() -> None:
    with pytest.raises(SinkError, match="PutRecords of 2 records with 1 results"):
        plan_retry([Entry("a", b"1"), Entry("b", b"2")], response(stored()))


def test_batches_keep_to_the_request_limits() -> None:
    queue = deque(Entry(str(i), b"x") for i in range(1200))
    assert [len(take_batch(queue)) for _ in range(3)] == [MAX_RECORDS, MAX_RECORDS, 200]
    big = b"x" * (MAX_RECORD_BYTES - 1)  # 1 MiB with its one-character key
    queue = deque(Entry("k", big) for _ in range(7))
    sizes = [len(take_batch(queue)) for _ in range(2)]
    assert sizes == [5, 2] and 5 * (len(big) + 1) <= MAX_REQUEST_BYTES
    assert take_batch(deque()) == []
    # a request puts to one stream: an outbox record of another stream starts a new one
    streams = [None, "out", "out", None, None]
    queue = deque(Entry("k", str(i).encode(), s) for i, s in enumerate(streams))
    assert [[e.data for e in take_batch(queue)] for _ in range(3)] == [
        [b"0"],
        [b"1", b"2"],
        [b"3", b"4"],
    ]


def backoff(attempt: int, rand: Callable[[], float]) -> float:
    """The sender's wait before retry number `attempt` (its Backoff's)."""
    return bounded_wait(attempt, BACKOFF_BASE, BACKOFF_CAP, 1.0, rand)


def test_backoff_is_full_jitter_capped() -> None:
    assert backoff(0, lambda: 1.0) == pytest.approx(0.1)
    assert backoff(3, lambda: 0.5) == pytest.approx(0.4)
    assert backoff(30, lambda: 1.0) == BACKOFF_CAP
    assert backoff(30, lambda: 0.0) == 0.0


# --- payload: partition keys and data ------------------------------------------------------


def schema(name: str = "t", key: tuple[str, ...] = ("id",)) -> Schema:
    fields = [{"name": "id", "type": ["null", "int"], "default": None}]
    row = {"type": "record", "name": "value", "fields": fields, "pg.primary_key": list(key)}
    return Schema(T, 10, "public", name, row, primary_key=key)


def change(
    op: Operation,
    before: dict[str, object] | None,
    after: dict[str, object] | None,
    name: str = "t",
) -> Modification:
    return Modification(T, 0, 100, 7, op, "public", name, before, after)


def test_partition_keys_and_data() -> None:
    payload = Payload()
    s = payload.entry(schema())
    assert (s.key, s.data) == ("public.t", record_line(schema())[:-1])
    payload.entry(schema("pair", ("b", "a")))
    payload.entry(schema("nokey", ()))
    ins = change(Operation.INSERT, None, {"id": 1, "v": "x"})
    assert payload.entry(ins).key == '{"id":1}'
    assert payload.entry(ins).data == record_line(ins)[:-1]
    delete = change(Operation.DELETE, {"id": 1, "v": None}, None)
    assert payload.entry(delete).key == '{"id":1}'  # from the old key
    pair = change(Operation.UPDATE, None, {"a": 1, "b": "z"}, "pair")
    assert payload.entry(pair).key == '{"b":"z","a":1}'  # key order
    assert payload.entry(change(Operation.INSERT, None, {"id": 1}, "nokey")).key == "public.nokey"
    trunc = Truncation(T, 0, 100, 7, Operation.TRUNCATE, "public", "t", None, None)
    assert payload.entry(trunc).key == "public.t"
    msg = Message(T, 100, 7, True, "audit", b"hi")
    assert payload.entry(msg).key == "audit"
    assert payload.entry(Message(None, 100, None, False, "", b"")).key == MESSAGES_KEY
    long = payload.entry(change(Operation.INSERT, None, {"id": "é" * 300}))
    assert long.key.startswith("sha256:") and len(long.key) == 71
    assert payload.entry(change(Operation.INSERT, None, {"id": "é" * 300})).key == long.key


def test_a_record_over_1_mib_is_an_error_naming_the_table_and_size() -> None:
    payload = Payload()
    payload.entry(schema("big"))
    huge = change(Operation.UPDATE, None, {"id": 1, "v": "x" * MAX_RECORD_BYTES}, "big")
    with pytest.raises(SinkError) as e:
        payload.entry(huge)
    assert not e.value.retryable
    size = len(record_line(huge)) - 1 + len('{"id":1}')
    assert f"a UPDATE record of public.big is {size:,} bytes" in str(e.value)
    assert "at most 1,048,576 bytes" in str(e.value)


def test_marks_acknowledge_only_checkpoints_whose_entries_are_stored() -> None:
    marks = _Marks()
    assert marks.acknowledged(0) is None
    marks.checkpoint(0, 50)  # nothing written before it: acknowledged at once
    marks.checkpoint(3, 100)
    marks.checkpoint(3, 120)  # nothing written since: the mark moves
    marks.checkpoint(5, 110)  # never backwards
    marks.checkpoint(5, 200)
    assert marks.acknowledged(0) == 50
    assert marks.acknowledged(2) == 50
    assert marks.acknowledged(4) == 120
    assert marks.acknowledged(5) == 200
    marks.checkpoint(7, 300)
    marks.forget()
    assert marks.acknowledged(100) == 200


# --- kinesalite ----------------------------------------------------------------------------


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """kinesalite's dummy credentials and region for boto3 in this process."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def stream(kinesis_endpoint: str, topic_prefix: str) -> Iterator[str]:
    """A new 4-shard stream on the session's kinesalite, deleted afterwards."""
    client = kinesis_client(kinesis_endpoint)
    create_stream(client, topic_prefix, 4)
    yield topic_prefix
    client.delete_stream(StreamName=topic_prefix)


def insert(i: int, key: int, lsn: int) -> Modification:
    return Modification(T, i, lsn, 7, Operation.INSERT, "public", "t", None, {"id": key, "i": i})


def test_sink_puts_every_record_keyed_and_in_order_per_key(
    aws_env: None, kinesis_endpoint: str, stream: str
) -> None:
    sink = KinesisSink(KinesisConfig(stream, kinesis_endpoint=kinesis_endpoint))
    sink.open()
    try:
        assert sink.flush() is None
        sink.write(schema())
        for i in range(1200):  # three requests: 500, 500, then the rest at the flush
            sink.write(insert(i, i % 7, 1000 + i))
            if i % 100 == 99:
                sink.checkpoint(1000 + i + 1)
        assert sink.flush() == 2200
        assert sink.pending_bytes() == 0
    finally:
        sink.close()
    records = read_stream(kinesis_client(kinesis_endpoint), stream)
    assert len(records) == 1201
    assert len({shard for shard, _, _ in records}) > 1  # the keys spread over shards
    by_key: dict[str, list[dict[str, Any]]] = {}
    for _, key, data in records:
        by_key.setdefault(key, []).append(orjson.loads(data))
    assert by_key.pop("public.t")[0]["kind"] == "schema"
    assert sorted(by_key) == [f'{{"id":{k}}}' for k in range(7)]
    for key, values in by_key.items():
        assert all(v["after"]["id"] == orjson.loads(key)["id"] for v in values)
        seq = [v["sequence"] for v in values]
        assert seq == sorted(seq) and len(seq) in (171, 172)  # all, in order


class Throttled:
    """A put that answers as Kinesis does when a shard's throughput is exceeded: the
    entries `refuse(request number, index, entry)` picks fail (ErrorCode and
    ErrorMessage as documented), every other entry is put to kinesalite, and its real
    result (a sequence number and a shard) takes its place in the response."""

    def __init__(
        self, client: KinesisClient, stream: str, refuse: Callable[[int, int, Entry], bool]
    ) -> None:
        self.client, self.stream, self.refuse = client, stream, refuse
        self.requests: list[list[str]] = []

    def __call__(self, entries: Sequence[Entry]) -> Mapping[str, Any]:
        n = len(self.requests)
        self.requests.append([e.data.decode() for e in entries])
        refused = [self.refuse(n, i, e) for i, e in enumerate(entries)]
        passed: list[PutRecordsRequestEntryTypeDef] = [
            {"Data": e.data, "PartitionKey": e.key}
            for e, r in zip(entries, refused, strict=True)
            if not r
        ]
        results = iter(
            self.client.put_records(StreamName=self.stream, Records=passed)["Records"]
            if passed
            else []
        )
        return response(*(failed() if r else dict(next(results)) for r in refused))


def test_sender_resends_throttled_entries_before_newer_ones(
    kinesis_endpoint: str, stream: str
) -> None:
    client = kinesis_client(kinesis_endpoint)
    # the "hot" key's shard is over its throughput for three requests
    put = Throttled(client, stream, lambda n, i, e: e.key == "hot" and n < 3)
    sender = Sender(put, stream, rand=lambda: 0.01)
    sender.start()
    try:
        entries = [Entry("hot" if i % 3 == 0 else f"k{i % 5}", b"%d" % i) for i in range(30)]
        for e in entries[:15]:
            sender.enqueue(e)
        sender.send_all()
        wait_for(lambda: put.requests, 10, "the first request")
        for e in entries[15:]:  # queued while the first request is retried
            sender.enqueue(e)
        sender.send_all()
        assert sender.wait_accepted(30, 10)
    finally:
        sender.stop(5)
    # the failed entries go again, in order, before anything newer
    assert put.requests[1:4] == [["0", "3", "6", "9", "12"]] * 3
    assert put.requests[0] == [str(i) for i in range(15)]
    assert [r for req in put.requests[4:] for r in req] == [str(i) for i in range(15, 30)]
    got = read_stream(client, stream)
    hot = [int(data) for _, key, data in got if key == "hot"]
    assert hot == list(range(0, 30, 3))  # each once, in order
    for k in range(5):
        mine = [int(data) for _, key, data in got if key == f"k{k}"]
        assert mine == [i for i in range(30) if i % 3 and i % 5 == k]


def test_a_partial_failure_inside_a_key_repeats_the_later_entries_after_it(
    kinesis_endpoint: str, stream: str
) -> None:
    client = kinesis_client(kinesis_endpoint)
    put = Throttled(client, stream, lambda n, i, e: n == 0 and i == 0)
    sender = Sender(put, stream, rand=lambda: 0.01)
    sender.start()
    try:
        for data in (b"1", b"2", b"3"):
            sender.enqueue(Entry("k", data))
        sender.send_all()
        assert sender.wait_accepted(3, 10)
    finally:
        sender.stop(5)
    assert put.requests == [["1", "2", "3"], ["1", "2", "3"]]
    # 2 and 3 were stored ahead of 1, then again after it: the last copies are in order
    assert [data for _, _, data in read_stream(client, stream)] == [b"2", b"3", b"1", b"2", b"3"]


def test_open_explains_a_missing_stream_and_creates_it_when_asked(
    aws_env: None, kinesis_endpoint: str, topic_prefix: str
) -> None:
    cfg = KinesisConfig(topic_prefix, kinesis_endpoint=kinesis_endpoint)
    with pytest.raises(SinkError, match=f"Kinesis stream '{topic_prefix}' does not exist") as e:
        KinesisSink(cfg).open()
    assert "--kinesis-create-stream" in str(e.value)
    sink = KinesisSink(KinesisConfig(topic_prefix, None, kinesis_endpoint, None, 3))
    sink.open()
    sink.close()
    client = kinesis_client(kinesis_endpoint)
    try:
        assert len(client.list_shards(StreamName=topic_prefix)["Shards"]) == 3
    finally:
        client.delete_stream(StreamName=topic_prefix)


def test_config_checks() -> None:
    with pytest.raises(ConfigError, match="needs --kinesis-stream NAME"):
        KinesisConfig().check()
    with pytest.raises(ConfigError, match="invalid --kinesis-endpoint 'localhost:1'"):
        KinesisConfig("s", kinesis_endpoint="localhost:1").check()
    KinesisConfig("s", kinesis_endpoint="http://127.0.0.1:1").check()


def test_imports_put_the_schema_once_then_every_row_keyed(
    aws_env: None, kinesis_endpoint: str, stream: str
) -> None:
    table = import_table()
    target = KinesisImportTarget(KinesisConfig(stream, kinesis_endpoint=kinesis_endpoint))
    assert target.problem() is None
    # executors get the target pickled, and return only once their rows are stored
    executor = pickle.loads(pickle.dumps(target.begin(table.schema)))
    batches = [
        pa.RecordBatch.from_arrays(
            [pa.array([str(i) for i in range(k, k + 600)]), pa.array(["a", None] * 300)],
            names=["c0", "c1"],
        )
        for k in (0, 600)
    ]
    assert executor.write_rows(table, iter(batches)) == 1200
    got = read_stream(kinesis_client(kinesis_endpoint), stream)
    assert len(got) == 1201
    values = {key: orjson.loads(data) for _, key, data in got}
    assert values.pop("public.t")["kind"] == "schema"
    assert values['{"id":601}'] == orjson.loads(
        record_line(table.modification(601, {"id": 601, "v": None}))
    )
    assert sorted(values) == sorted(f'{{"id":{i}}}' for i in range(1200))
    assert {v["operation"] for v in values.values()} == {"IMPORT"}


# --- a kinesalite of our own, stopped and started -------------------------------------------


@pytest.fixture
def own_kinesalite() -> Iterator[services.Kinesalite]:
    with own_server(services.Kinesalite, "kinesis") as server:
        yield server


@pytest.mark.slow
def test_sink_waits_out_an_outage_and_acknowledges_only_what_is_stored(
    aws_env: None, own_kinesalite: services.Kinesalite, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pg2sink.sinks.kinesis")
    endpoint = own_kinesalite.address
    name = f"s{uuid.uuid4().hex[:8]}"
    create_stream(kinesis_client(endpoint), name, 2)
    sink = KinesisSink(KinesisConfig(name, kinesis_endpoint=endpoint))
    stats = StreamStats()
    sink.open()
    try:
        stats.sink_up()  # as the service does once the sink is open
        sink.report_health(stats)
        sink.write(schema())
        for i in range(10):
            sink.write(insert(i, i, 100 + i))
        sink.checkpoint(200)
        assert sink.flush() == 200
        assert stats.sink_healthy
        own_kinesalite.stop()
        for i in range(10, 20):
            sink.write(insert(i, i % 10, 100 + i))
        sink.checkpoint(300)
        for _ in range(3):
            assert sink.flush() == 200  # not stored: not acknowledged
        assert sink.pending_bytes() > 0
        assert not stats.sink_healthy  # GET /status says why
        assert stats.sink_reason.startswith(f"Kinesis stream {name!r}: cannot reach Kinesis")
        own_kinesalite.start()
        wait_for(lambda: sink.flush() == 300, 30, "the records put after the outage")
        assert stats.sink_healthy
    finally:
        sink.close()
    got = read_stream(kinesis_client(endpoint), name)
    ids = [orjson.loads(d)["after"]["i"] for _, k, d in got if k != "public.t"]
    assert sorted(ids) == list(range(20))
    warnings = [r.getMessage() for r in caplog.records if "retrying with backoff" in r.getMessage()]
    assert len(warnings) == 1 and f"Kinesis stream {name!r}: cannot reach Kinesis" in warnings[0]
    assert any("stores records again" in r.getMessage() for r in caplog.records)


def test_a_queue_full_for_too_long_is_dropped_for_a_replay(
    aws_env: None, own_kinesalite: services.Kinesalite
) -> None:
    endpoint = own_kinesalite.address
    name = f"s{uuid.uuid4().hex[:8]}"
    create_stream(kinesis_client(endpoint), name, 1)
    cfg = KinesisConfig(name, kinesis_endpoint=endpoint)
    sink = KinesisSink(cfg, max_queued=2000, stall_wait=0.5)
    sink.open()
    try:
        sink.write(schema())
        sink.checkpoint(50)
        assert sink.flush() == 50
        own_kinesalite.stop()
        with pytest.raises(SinkUnavailableError, match="took no records for 0s") as e:
            for i in range(100):
                sink.write(insert(i, i, 100 + i))
                sink.checkpoint(101 + i)
        assert "cannot reach Kinesis" in str(e.value) and "at-least-once" in str(e.value)
        assert sink.acknowledged() == 50  # nothing after the outage
        own_kinesalite.start()
        # the replay (here: written again) is stored and acknowledged
        for i in range(3):
            sink.write(insert(i, i, 100 + i))
        sink.checkpoint(103)
        wait_for(lambda: sink.flush() == 103, 30, "the replayed records")
    finally:
        sink.close()


# --- through the CLI -------------------------------------------------------------------------


@pytest.mark.slow
def test_stream_puts_changes_of_two_tables(
    db: Database, pg2sink_proc: Proc, kinesis_endpoint: str, stream: str
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text)")
    conn.execute(
        "CREATE TABLE lines (order_id int, line int, qty int, PRIMARY KEY (order_id, line))"
    )
    p = start(pg2sink_proc, kinesis_endpoint, stream)
    with conn.transaction():
        conn.execute("INSERT INTO users VALUES (1, 'ada'), (2, 'bob')")
        conn.execute("INSERT INTO lines VALUES (10, 1, 5)")
    conn.execute("UPDATE users SET name = 'ada lovelace' WHERE id = 1")
    conn.execute("UPDATE lines SET qty = 6")
    conn.execute("DELETE FROM users WHERE id = 2")
    last_commit = db.current_lsn()
    client = kinesis_client(kinesis_endpoint)

    def records() -> list[tuple[str, str, bytes]]:
        got = read_stream(client, stream)
        return got if len(got) >= 8 else []

    got = wait_for(records, 30, "8 records in the stream")
    by_key: dict[str, list[dict[str, Any]]] = {}
    for _, key, data in got:
        by_key.setdefault(key, []).append(orjson.loads(data))
    assert [r["kind"] for r in by_key["public.users"]] == ["schema"]
    assert [r["kind"] for r in by_key["public.lines"]] == ["schema"]
    ada = by_key['{"id":1}']
    assert [(r["operation"], r["after"]) for r in ada] == [
        ("INSERT", {"id": 1, "name": "ada"}),
        ("UPDATE", {"id": 1, "name": "ada lovelace"}),
    ]
    bob = by_key['{"id":2}']
    assert [(r["operation"], r["before"]) for r in bob] == [
        ("INSERT", None),
        ("DELETE", {"id": 2}),  # the old key
    ]
    line = by_key['{"order_id":10,"line":1}']
    assert [(r["name"], r["operation"], r["after"]["qty"]) for r in line] == [
        ("lines", "INSERT", 5),
        ("lines", "UPDATE", 6),
    ]
    assert ada[0]["xid"] == line[0]["xid"] and (ada[0]["sequence"], line[0]["sequence"]) == (0, 2)
    assert len(got) == 8
    # everything is stored, so the slot's position passes the last commit
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= last_commit, 10, "the slot to advance")
    assert p.stop() == 0


@pytest.mark.slow
def test_stream_confirms_nothing_kinesis_has_not_stored_and_loses_nothing(
    db: Database, pg2sink_proc: Proc, own_kinesalite: services.Kinesalite
) -> None:
    """kinesalite stopped for 30 s while a transaction commits every second: pg2sink
    waits, logs once, says so on /status, confirms none of them, then resumes."""
    endpoint = own_kinesalite.address
    name = f"s{uuid.uuid4().hex[:8]}"
    client = kinesis_client(endpoint)
    create_stream(client, name, 2)
    conn = db.connect()
    conn.execute("CREATE TABLE kv (id int PRIMARY KEY, v int)")
    p = start(pg2sink_proc, endpoint, name)
    url = api_url(p)
    conn.execute("INSERT INTO kv SELECT g, 0 FROM generate_series(1, 10) g")
    before_outage = db.current_lsn()
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= before_outage, 10, "the first rows")
    own_kinesalite.stop()
    conn.execute("UPDATE kv SET v = 1")
    first_update = db.current_lsn()
    outage = 30
    for v in range(2, outage + 1):
        time.sleep(1)
        conn.execute("UPDATE kv SET v = %s", (v,))
        confirmed = db.slot_confirmed_lsn()
        assert confirmed is not None and confirmed < first_update  # nothing stored
    code, during = status(url)
    assert code == 500 and "cannot reach Kinesis" in during["problems"]["sink"]
    own_kinesalite.start()
    conn.execute("UPDATE kv SET v = %s", (outage + 1,))
    after = db.current_lsn()
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= after, 60, "the slot after the outage")
    assert status_without_slot(url) == (200, {"status": "ok", "replication": "ok", "sink": "ok"})
    got = read_stream(client, name)
    for k in range(1, 11):
        seen = [orjson.loads(d)["after"]["v"] for _, key, d in got if key == f'{{"id":{k}}}']
        assert seen == list(range(outage + 2))  # nothing lost, in order, no repeat here
    err = p.stderr()
    assert err.count("retrying with backoff") == 1 and "stores records again" in err
    assert p.stop() == 0


@pytest.mark.slow
def test_a_30s_outage_shows_on_status_within_5s_each_way(
    db: Database, pg2sink_proc: Proc, own_kinesalite: services.Kinesalite
) -> None:
    """As the NATS sink's (test_nats.py): kinesalite stopped for 30 s while a row is
    inserted every second: GET /status answers 500 (the sink's reason naming Kinesis)
    within 5 s of the stop and for the whole outage; 200 again within 5 s of its
    return."""
    endpoint = own_kinesalite.address
    name = f"s{uuid.uuid4().hex[:8]}"
    create_stream(kinesis_client(endpoint), name, 1)
    conn = db.connect()
    conn.execute("CREATE TABLE kv (id int PRIMARY KEY)")
    p = start(pg2sink_proc, endpoint, name)
    url = api_url(p)
    conn.execute("INSERT INTO kv VALUES (1)")
    first = db.current_lsn()
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= first, 30, "the first row")
    assert status(url)[0] == 200
    own_kinesalite.stop()
    stopped = time.monotonic()
    conn.execute("INSERT INTO kv VALUES (2)")
    wait_for(lambda: status(url)[0] == 500, 5, "/status 500 within 5 s of the stop")
    code, body = status(url)
    assert code == 500 and f"Kinesis stream {name!r}" in body["problems"]["sink"]
    last = 2
    while time.monotonic() - stopped < 30:
        last += 1
        conn.execute("INSERT INTO kv VALUES (%s)", (last,))
        time.sleep(1)
        assert status(url)[0] == 500
    own_kinesalite.start()
    wait_for(lambda: status(url)[0] == 200, 5, "/status 200 within 5 s of the return")
    written = db.current_lsn()
    wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= written, 60, "the slot to pass them")
    assert p.stop() == 0


@pytest.mark.slow
def test_kill_9_and_restart_loses_nothing_and_keeps_per_key_order(
    db: Database, pg2sink_proc: Proc, kinesis_endpoint: str, stream: str
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE kv (id int PRIMARY KEY, v int)")
    p = start(pg2sink_proc, kinesis_endpoint, stream)
    keys, last = range(1, 51), 60
    conn.execute("INSERT INTO kv SELECT g, 0 FROM generate_series(1, 50) g")
    client = kinesis_client(kinesis_endpoint)
    done = threading.Event()

    def write() -> None:
        with db.connect() as writer:
            for v in range(1, last + 1):  # 60 transactions of 50 updates
                writer.execute("UPDATE kv SET v = %s", (v,))
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    wait_for(lambda: len(read_stream(client, stream)) > 500, 30, "the first updates")
    p.kill()  # mid-stream: some records are stored but not confirmed
    p.start()
    p.wait_streaming()
    thread.join(120)
    assert done.is_set()

    def values() -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for _, key, data in read_stream(client, stream):
            record = orjson.loads(data)
            if record["kind"] == "modification":
                out.setdefault(key, []).append(record["after"]["v"])
        return out

    wait_for(lambda: all(values().get(f'{{"id":{k}}}', [-1])[-1] == last for k in keys), 60, "v=60")
    got = values()
    print(f"{sum(map(len, got.values())) - 50 * (last + 1)} records repeated after the kill")
    for k, seen in got.items():
        # in order, nothing skipped; the replay may go back and repeat (at-least-once)
        assert set(seen) == set(range(last + 1)), k
        assert all(b <= a + 1 for a, b in itertools.pairwise(seen)), (k, seen)
    assert p.stop() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sink", "kinesis"], "--sink=kinesis needs --kinesis-stream NAME"),
        (
            ["--sink", "kinesis", "--kinesis-stream", "s", "--kinesis-create-stream", "0"],
            "shard count '0' must be at least 1",
        ),
        (
            [
                "--sink",
                "kinesis",
                "--kinesis-stream",
                "s",
                "--kinesis-endpoint",
                "http://127.0.0.1:1",
            ],
            "cannot reach Kinesis at http://127.0.0.1:1",
        ),
    ],
)
def test_bad_kinesis_configuration_exits_2_with_one_line(args: list[str], message: str) -> None:
    res = run_cli("stream", *args, env={"PGHOST": "127.0.0.1", "PGPORT": "1", **AWS_ENV})
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_missing_stream_and_no_credentials_are_one_line_errors(
    kinesis_endpoint: str, topic_prefix: str, tmp_path: Path
) -> None:
    args = ["stream", "--sink", "kinesis", "--kinesis-stream", topic_prefix]
    args += ["--kinesis-endpoint", kinesis_endpoint]
    env = {"PGHOST": "127.0.0.1", "PGPORT": "1", **AWS_ENV}
    res = run_cli(*args, env=env)
    assert res.returncode == 2
    assert f"Kinesis stream '{topic_prefix}' does not exist" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    bare = {
        **env,
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    res = run_cli(*args, env=bare)
    assert res.returncode == 2
    assert "--sink=kinesis found no AWS credentials" in res.stderr


@pytest.mark.slow
def test_secrets_stay_out_of_help_errors_and_debug_logs(
    db: Database, pg2sink_proc: Proc, kinesis_endpoint: str, stream: str
) -> None:
    secret, token = "kinesis-secret-0123456789", "session-token-9876543210"
    help_text = run_cli("stream", "--help", env={"AWS_SECRET_ACCESS_KEY": secret}).stdout
    assert "--kinesis-stream" in help_text and secret not in help_text
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    env = {**AWS_ENV, "AWS_SECRET_ACCESS_KEY": secret, "AWS_SESSION_TOKEN": token}
    p = pg2sink_proc(*kinesis_args(kinesis_endpoint, stream, "--log-level", "debug"), env=env)
    p.start().wait_streaming()
    conn.execute("INSERT INTO t VALUES (1)")
    wait_for(
        lambda: len(read_stream(kinesis_client(kinesis_endpoint), stream)) == 2, 30, "2 records"
    )
    assert p.stop() == 0
    err = p.stderr()
    assert "kinesis sink putting to stream" in err
    assert secret not in err and token not in err


def test_the_registry_knows_the_kinesis_sink() -> None:
    res = run_cli("stream", "--help")
    assert "kinesis sink (--sink=kinesis)" in res.stdout
    for option in ("--kinesis-region", "--kinesis-profile", "--kinesis-create-stream"):
        assert option in res.stdout
    # the registry reads config.py only: boto3 is imported when the sink is chosen
    code = (
        "import sys, pg2sink.sinks.entries as r; r.entry('kinesis');print('boto3' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "False", out.stderr
