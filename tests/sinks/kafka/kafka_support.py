"""Kafka helpers for the tests of several modules: topics created ahead of pg2sink, and
what a read_committed consumer reads back (--exactly-once)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import confluent_kafka as ck
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic


def create_topic(
    bootstrap: str, topic: str, partitions: int, config: dict[str, str] | None = None
) -> None:
    """Create `topic`; `config`: its topic-level settings (max.message.bytes...)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})
    admin.create_topics([new])[topic].result(30)


def as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def message_headers(raw: Any) -> dict[str, str]:
    """A consumed message's headers as text."""
    items = raw.items() if isinstance(raw, dict) else raw or []
    return {k: (as_bytes(v) or b"").decode() for k, v in items}


@dataclass
class Committed:
    """One message a read_committed consumer got."""

    topic: str
    partition: int
    key: Any
    value: Any
    headers: dict[str, str]


def _key(raw: str | bytes | None) -> Any:
    """A JSON key decoded, the offsets topic's plain text one as text."""
    data = raw.encode() if isinstance(raw, str) else raw
    if data is None:
        return None
    return json.loads(data) if data.startswith(b"{") else data.decode()


def read_committed(bootstrap: str, topics: list[str]) -> list[Committed]:
    """Every message of `topics` a read_committed consumer sees, to each partition's end
    (its high watermark when the reading started), in partition order; JSON values with
    numbers exact (numeric as Decimal)."""
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        ends: dict[tuple[str, int], int] = {}
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            for p in meta.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), 10)
                if high > low:
                    ends[(topic, p)] = high
        consumer.assign([TopicPartition(t, p, ck.OFFSET_BEGINNING) for t, p in ends])
        out: list[Committed] = []
        deadline = time.monotonic() + 60
        while ends:
            assert time.monotonic() < deadline, f"partitions not read to their end: {ends}"
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                name = msg.topic()
                assert name is not None
                raw = msg.value()
                out.append(
                    Committed(
                        name,
                        msg.partition() or 0,
                        _key(msg.key()),
                        json.loads(raw, parse_float=Decimal) if raw else None,
                        message_headers(msg.headers()),
                    )
                )
            for tp in consumer.position([TopicPartition(t, p) for t, p in ends]):
                if tp.offset >= ends[(tp.topic, tp.partition)]:
                    del ends[(tp.topic, tp.partition)]
        return out
    finally:
        consumer.close()
