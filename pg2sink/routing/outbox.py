"""The outbox (pglsn's model): each INSERT into an outbox table becomes one message.

An outbox table holds a destination column (the Kafka topic the message goes to, the
NATS subject under the sink's prefix, the Kinesis stream), a
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

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pg2sink.errors import ConfigError
from pg2sink.logical.messages import Relation
from pg2sink.publication.patterns import TablePattern, compile_pattern
from pg2sink.sinks.base import PublishesMessages

__all__ = ["OutboxColumns", "OutboxRule", "Publisher", "check_sink", "publisher_for"]

#: a message's headers: (name, value) pairs, as confluent_kafka takes them
Headers = list[tuple[str, bytes | None]]
#: (destination, key, value, headers, lsn): publish one message, durably by the next
#: acknowledgement
Publisher = Callable[[str, bytes | None, bytes, Headers, int], None]
#: one INSERT's message: (destination, key, value, headers)
OutboxMessage = tuple[str, bytes | None, bytes, Headers]

log = logging.getLogger(__name__)

_BYTEA_OID = 17
_JSON = (114, 3802)  # json, jsonb
_HEX_BYTEA = re.compile(rb"\\x([0-9a-fA-F]*)")


@dataclass(frozen=True)
class OutboxRule:
    """Tables matching `table` are outboxes with these columns."""

    table: TablePattern
    topic_column: str
    payload_column: str
    key_column: str | None
    headers_column: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxColumns:
    """Where an outbox table's message parts are in its tuples (column positions)."""

    topic: int
    payload: int
    key: int | None
    payload_is_bytea: bool
    headers: int | None = None
    """A json/jsonb column whose object's members are the message's headers."""

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
        key, headers = rule.key_column, rule.headers_column
        columns = cls(
            topic,
            payload,
            position(key, "--outbox-key-column") if key is not None else None,
            rel.columns[payload].type_oid == _BYTEA_OID,
            position(headers, "--outbox-headers-column") if headers is not None else None,
        )
        if columns.headers is not None and rel.columns[columns.headers].type_oid not in _JSON:
            raise ConfigError(
                f"--outbox {rel.namespace}.{rel.name}: --outbox-headers-column {headers} "
                "must be json or jsonb (an object of header names and values)"
            )
        return columns

    def message(self, values: Sequence[bytes | None]) -> OutboxMessage | None:
        """(destination, key, value, headers) of one inserted row's text values; None for
        a row without a destination (NULL topic: nothing to publish)."""
        topic = values[self.topic]
        if topic is None:
            return None
        payload = values[self.payload] or b""
        if self.payload_is_bytea:
            hex_text = _HEX_BYTEA.fullmatch(payload)  # bytea_output = hex (session setting)
            payload = bytes.fromhex(hex_text.group(1).decode()) if hex_text else payload
        key = values[self.key] if self.key is not None else None
        headers = values[self.headers] if self.headers is not None else None
        return topic.decode(), key, payload, _headers(headers) if headers else []


def _headers(text: bytes) -> Headers:
    """A JSON object's members as headers: a string as its UTF-8, null as no value, any
    other value as its JSON text. Anything but an object gives none, with a warning (a
    row the stream cannot skip must not stop it)."""
    try:
        members = json.loads(text)
    except ValueError:
        members = None
    if not isinstance(members, dict):
        log.warning("outbox row headers that are no JSON object are not sent")
        return []
    return [
        (name, None if v is None else (v if isinstance(v, str) else json.dumps(v)).encode())
        for name, v in members.items()
    ]


def compile_outbox(
    tables: Sequence[str],
    topic_column: str,
    payload_column: str,
    key_column: str | None,
    headers_column: str | None = None,
) -> tuple[OutboxRule, ...]:
    """The --outbox rules."""
    return tuple(
        OutboxRule(compile_pattern(t), topic_column, payload_column, key_column, headers_column)
        for t in tables
    )


_SINKS = ("kafka", "nats", "kinesis")
_UNSUPPORTED = (
    "--outbox publishes to Kafka, NATS and Kinesis only: add --sink kafka, nats or kinesis"
)


def check_sink(sink: str, headers: bool = False) -> None:
    """ConfigError, at start, for --outbox on a sink that cannot publish it yet."""
    if sink not in _SINKS:
        raise ConfigError(_UNSUPPORTED)
    if headers and sink != "kafka":
        raise ConfigError("--outbox-headers-column: only Kafka messages have headers here")


def publisher_for(sink: object) -> Publisher:
    """How `sink` publishes an outbox message, through its own producer so that its
    acknowledgement covers the outbox messages too (ConfigError for another sink):

    - Kafka: to the topic the row names (created by the broker, or checked, as the sink's
      own topics are), with the key and an `lsn` header;
    - NATS: to the subject `<--nats-subject-prefix>.<the row's topic>` (inside the
      sink's JetStream stream), Nats-Msg-Id `<lsn>:<subject>`; NATS messages have no key;
    - Kinesis: a record of the stream the row names (which must exist), partition key
      the key column's text (else the stream's name), data the payload.

    Each is the sink's `publish` (sinks/base.PublishesMessages)."""
    if isinstance(sink, PublishesMessages):
        return sink.publish
    raise ConfigError(_UNSUPPORTED)
