"""Kafka's health as pg2sink reports it: GET /status and one log line per change of state.

Real pg2sink processes against an address where no broker listens, and against a broker
of this module's own that a test stops and starts again.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import services

from pg2sink.observability.stats import StreamStats
from pg2sink.sinks.kafka.health import PROBE_INTERVAL, BrokerHealth
from tests.conftest import Database, KafkaStack, Pg2Sink, wait_for
from tests.sinks.kafka import test_kafka
from tests.sinks.kafka.kafka_support import create_topic
from tests.sinks.kafka.test_kafka import Reader, start
from tests.support import Proc

reader = test_kafka.reader  # the fixtures
own_kafka = test_kafka.own_kafka

UNREACHABLE = "is unreachable"
REACHABLE = "Kafka is reachable again"


def api_url(p: Pg2Sink) -> str:
    match = re.search(r"/metrics on (http://\S+)", p.stderr())
    assert match, p.stderr()
    return match.group(1).rstrip("/")


def status(url: str) -> tuple[int, dict[str, Any]]:
    """GET /status: (HTTP status, JSON body)."""
    try:
        with urllib.request.urlopen(f"{url}/status", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def status_without_slot(url: str) -> tuple[int, dict[str, Any]]:
    """GET /status with the slot's health (shown once the server was polled) checked valid
    and taken out of the body: the part the sinks' outage tests compare whole."""
    code, body = status(url)
    slot = body.pop("slot", None)
    assert slot is None or slot["invalidation_reason"] is None, slot
    return code, body


def poll_status(url: str, seconds: float) -> list[int]:
    """/status every 0.1 s for `seconds`: the HTTP statuses seen."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(status(url)[0])
        time.sleep(0.1)
    return seen


def test_state_changes_on_evidence_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    now = [0.0]
    stats = StreamStats()
    stats.sink_up()
    health = BrokerHealth("b:9092", clock=lambda: now[0])
    health.report_to(stats)
    health.trouble("b:9092/bootstrap: Disconnected")  # e.g. an idle connection closed
    assert health.probe_due()
    health.reached()  # the probe answered: nothing happened
    assert not health.probe_due() and stats.sink_healthy
    health.trouble("b:9092/bootstrap: Connect failed: Connection refused")
    health.probe_failed("Failed to get metadata")
    assert not health.down and not health.probe_due()  # one failed probe is not enough
    now[0] += PROBE_INTERVAL
    health.trouble("1/1 brokers are down")
    health.probe_failed("Failed to get metadata")
    assert health.down and not stats.sink_healthy
    assert "Connection refused" in stats.sink_reason  # the first trouble's words
    for _ in range(10):  # librdkafka goes on reporting; probes go on failing
        now[0] += PROBE_INTERVAL
        health.trouble("1/1 brokers are down")
        assert health.probe_due()
        health.probe_failed("Failed to get metadata")
    health.reached()  # a delivery
    health.reached()
    assert not health.down and stats.sink_healthy
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and UNREACHABLE in lines[0] and REACHABLE in lines[1]


SASL = ("security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN", "sasl.username=u")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["nothing listens", "wrong credentials"])
def test_unreachable_broker_is_one_line_and_a_steady_500(
    db: Database, pg2sink_proc: Proc, kafka_stack: KafkaStack, topic_prefix: str, case: str
) -> None:
    settings: tuple[str, ...] = ()
    if case == "nothing listens":
        stack = KafkaStack(f"127.0.0.1:{services.free_ports(1)[0]}", "")
    else:  # a real broker, which refuses the login
        stack, settings = kafka_stack, (*SASL, "sasl.password=Hunter2xyz")
    extra = [arg for setting in settings for arg in ("--kafka-config", setting)]
    p = start(pg2sink_proc, stack, topic_prefix, *extra, avro=False)
    url = api_url(p)
    wait_for(lambda: status(url)[0] == 500, timeout=10, what="/status 500")
    code, body = status(url)
    assert code == 500 and body["sink"] == "failing" and UNREACHABLE in body["problems"]["sink"]
    assert body["replication"] == "ok"
    seen = poll_status(url, 6)
    assert set(seen) == {500}, seen
    err = p.stderr()
    assert err.count(UNREACHABLE) == 1, err
    assert REACHABLE not in err, err
    assert "Hunter2xyz" not in err + json.dumps(body)
    assert p.stop() == 0


@pytest.mark.slow
def test_broker_outage_is_500_during_and_200_after_one_line_each(
    db: Database,
    pg2sink_proc: Proc,
    own_kafka: services.Kafka,
    topic_prefix: str,
    reader: Callable[..., Reader],
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    topic = f"{topic_prefix}.public.t"
    create_topic(own_kafka.bootstrap_servers, topic, partitions=1)
    stack = KafkaStack(own_kafka.bootstrap_servers, "")
    p = start(pg2sink_proc, stack, topic_prefix, avro=False)
    url = api_url(p)
    read = reader(topic, avro=False, bootstrap=own_kafka.bootstrap_servers)
    conn.execute("INSERT INTO t VALUES (1)")
    read.read(1)
    assert status(url)[0] == 200
    own_kafka.stop()
    t0 = time.monotonic()
    conn.execute("INSERT INTO t VALUES (2)")  # waits in the producer queue
    wait_for(lambda: status(url)[0] == 500, timeout=15, what="/status 500 in the outage")
    detected = time.monotonic() - t0
    during = poll_status(url, 10)
    assert set(during) == {500}, during
    conn.execute("INSERT INTO t VALUES (3)")
    own_kafka.start()
    t1 = time.monotonic()
    wait_for(lambda: status(url)[0] == 200, timeout=60, what="/status 200 after the outage")
    recovered = time.monotonic() - t1
    assert sorted(m.value["after"]["id"] for m in read.read(3)) == [1, 2, 3]
    after = poll_status(url, 3)
    assert set(after) == {200}, after
    err = p.stderr()
    assert err.count(UNREACHABLE) == 1, err
    assert err.count(REACHABLE) == 1, err
    print(f"outage seen after {detected:.1f}s, recovery {recovered:.1f}s after the restart")
    assert p.stop() == 0


@pytest.mark.slow
def test_a_30s_broker_outage_shows_on_status_within_5s_each_way(
    db: Database,
    pg2sink_proc: Proc,
    own_kafka: services.Kafka,
    topic_prefix: str,
    reader: Callable[..., Reader],
) -> None:
    """As the NATS sink's (test_nats.py): the broker stopped for 30 s while a row is
    inserted every second: GET /status answers 500 within 5 s of the stop and for the
    whole outage, 200 again within 5 s of the broker's return, and nothing is lost."""
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    topic = f"{topic_prefix}.public.t"
    create_topic(own_kafka.bootstrap_servers, topic, partitions=1)
    p = start(pg2sink_proc, KafkaStack(own_kafka.bootstrap_servers, ""), topic_prefix, avro=False)
    url = api_url(p)
    read = reader(topic, avro=False, bootstrap=own_kafka.bootstrap_servers)
    conn.execute("INSERT INTO t VALUES (1)")
    read.read(1)
    assert status(url)[0] == 200
    own_kafka.stop()
    stopped = time.monotonic()
    conn.execute("INSERT INTO t VALUES (2)")
    wait_for(lambda: status(url)[0] == 500, timeout=5, what="/status 500 within 5 s of the stop")
    last = 2
    while time.monotonic() - stopped < 30:
        last += 1
        conn.execute("INSERT INTO t VALUES (%s)", (last,))
        time.sleep(1)
        assert status(url)[0] == 500
    own_kafka.start()
    wait_for(lambda: status(url)[0] == 200, timeout=5, what="/status 200 within 5 s of the return")
    assert sorted(m.value["after"]["id"] for m in read.read(last)) == list(range(1, last + 1))
    assert p.stop() == 0
