"""The outbox (pglsn's model): each INSERT into an outbox table becomes one message.

An outbox table holds a destination column (the Kafka topic the message goes to, the
NATS subject under the sink's prefix), a
payload column (the message's value, exactly: a json/jsonb/text value's text as UTF-8,
a bytea value's bytes) and optionally a key column (the message key: the value's text).
The application inserts a row in the same transaction as its change of the domain
model, so the message goes out if and only if that transaction commits; it may delete
the row again in the same transaction (pgoutput still sends the INSERT). UPDATE, DELETE
and TRUNCATE of an outbox table are ignored, and no Schema record, change record or
import is written for it.

RoutingStage publishes at the INSERT through the sink's `Publisher` (publisher_for), in
stream order; the message is then covered by the sink's acknowledgement like its records
are: the commit's checkpoint is acknowledged only once everything produced before it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pg2sink.errors import ConfigError
from pg2sink.logical.messages import Relation
from pg2sink.publication.patterns import TablePattern, compile_pattern

__all__ = ["OutboxColumns", "OutboxRule", "Publisher", "check_sink", "publisher_for"]

#: (destination, key, value, lsn): publish one message, durably by the next acknowledgement
Publisher = Callable[[str, bytes | None, bytes, int], None]

_BYTEA_OID = 17
_HEX_BYTEA = re.compile(rb"\\x([0-9a-fA-F]*)")


@dataclass(frozen=True)
class OutboxRule:
    """Tables matching `table` are outboxes with these columns."""

    table: TablePattern
    topic_column: str
    payload_column: str
    key_column: str | None


@dataclass(frozen=True, slots=True)
class OutboxColumns:
    """Where an outbox table's message parts are in its tuples (column positions)."""

    topic: int
    payload: int
    key: int | None
    payload_is_bytea: bool

    @classmethod
    def of(cls, rule: OutboxRule, rel: Relation) -> OutboxColumns:
        """The positions of `rule`'s columns in `rel`; ConfigError naming a missing one."""
        names = [c.name for c in rel.columns]

        def position(column: str, option: str) -> int:
            if column not in names:
                raise ConfigError(
                    f"--outbox {rel.namespace}.{rel.name}: no column {column!r} ({option}); "
                    f"its columns: {', '.join(names)}"
                )
            return names.index(column)

        topic = position(rule.topic_column, "--outbox-topic-column")
        payload = position(rule.payload_column, "--outbox-payload-column")
        key = rule.key_column
        return cls(
            topic,
            payload,
            position(key, "--outbox-key-column") if key is not None else None,
            rel.columns[payload].type_oid == _BYTEA_OID,
        )

    def message(self, values: Sequence[bytes | None]) -> tuple[str, bytes | None, bytes] | None:
        """(destination, key, value) of one inserted row's text values; None for a row
        without a destination (NULL topic: nothing to publish)."""
        topic = values[self.topic]
        if topic is None:
            return None
        payload = values[self.payload] or b""
        if self.payload_is_bytea:
            hex_text = _HEX_BYTEA.fullmatch(payload)  # bytea_output = hex (session setting)
            payload = bytes.fromhex(hex_text.group(1).decode()) if hex_text else payload
        key = values[self.key] if self.key is not None else None
        return topic.decode(), key, payload


def compile_outbox(
    tables: Sequence[str], topic_column: str, payload_column: str, key_column: str | None
) -> tuple[OutboxRule, ...]:
    """The --outbox rules."""
    return tuple(
        OutboxRule(compile_pattern(t), topic_column, payload_column, key_column) for t in tables
    )


_SINKS = ("kafka", "nats")
_UNSUPPORTED = "--outbox publishes to Kafka and NATS only (for now): add --sink kafka or nats"


def check_sink(sink: str) -> None:
    """ConfigError, at start, for --outbox on a sink that cannot publish it yet."""
    if sink not in _SINKS:
        raise ConfigError(_UNSUPPORTED)


def publisher_for(sink: object) -> Publisher:
    """How `sink` publishes an outbox message, through its own producer so that its
    acknowledgement covers the outbox messages too (ConfigError for another sink):

    - Kafka: to the topic the row names (created by the broker, or checked, as the sink's
      own topics are), with the key and an `lsn` header;
    - NATS: to the subject `<--nats-subject-prefix>.<the row's topic>` (inside the
      sink's JetStream stream), Nats-Msg-Id `<lsn>:<subject>`; NATS messages have no key.

    The sinks' private members: a public `publish` of each sink is the step that remains
    (docs/routing.md)."""
    # by module name: importing the sinks' classes would import their client libraries
    kind = type(sink).__module__
    if kind == "pg2sink.sinks.kafka.sink":
        return _kafka(sink)
    if kind == "pg2sink.sinks.nats.sink":
        return _nats(sink)
    raise ConfigError(_UNSUPPORTED)


def _kafka(sink: Any) -> Publisher:
    check, produce = sink._topics.check, sink._produce

    def publish(topic: str, key: bytes | None, value: bytes, lsn: int) -> None:
        check(sink._producer, topic)
        produce(topic, key, value, [("lsn", b"%d" % lsn)])

    return publish


def _nats(sink: Any) -> Publisher:
    prefix, put = sink.cfg.nats_subject_prefix, sink._put

    def publish(topic: str, key: bytes | None, value: bytes, lsn: int) -> None:
        subject = f"{prefix}.{topic}"
        put(subject, value, f"{lsn}:{subject}")

    return publish
