"""pg2sink_sink_write_seconds through /metrics of a real pg2sink, file and Kafka sinks:
each acknowledgement of written transactions observes the oldest one's wait."""

from __future__ import annotations

import re
import urllib.request
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import Database, KafkaStack, wait_for
from tests.sinks.kafka.test_kafka import start as start_kafka
from tests.sinks.kafka.test_kafka_health import api_url
from tests.support import Proc
from tests.support import start as start_file


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def _grown(url: str, name: str, than: float) -> float | None:
    """The metric's value once it is above `than`, else None."""
    value = metric(url, name)
    return value if value > than else None


@pytest.mark.slow
@pytest.mark.parametrize("sink", ["file", "kafka"])
def test_write_latency_is_observed_per_acknowledgement(
    db: Database,
    pg2sink_proc: Proc,
    tmp_path: Path,
    topic_prefix: str,
    sink: str,
    request: pytest.FixtureRequest,
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    if sink == "file":
        p = start_file(pg2sink_proc, tmp_path / "out.jsonl")
    else:
        stack: KafkaStack = request.getfixturevalue("kafka_stack")
        p = start_kafka(pg2sink_proc, stack, topic_prefix, avro=False)
    url = api_url(p)
    count = "pg2sink_sink_write_seconds_count"
    seen = metric(url, count)
    for i in range(3):
        conn.execute("INSERT INTO t VALUES (%s)", (i,))
        seen = wait_for(partial(_grown, url, count, seen), timeout=10, what=f"{count} +1")
    total = metric(url, "pg2sink_sink_write_seconds_sum")
    assert 0 < total < seen * 10  # seconds: each transaction waited, none for long
    assert metric(url, 'pg2sink_sink_write_seconds_bucket{le="+Inf"}') == metric(url, count)
    assert p.stop() == 0
