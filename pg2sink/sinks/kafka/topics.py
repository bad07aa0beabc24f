"""Which topic a table's messages go to.

Default: `<prefix>.<schema>.<table>`. With `--topic-map schema.table=topic` the named tables
go where the map says; the others go to `--fallback-topic`, and without one they are an
error naming the table: a table is never dropped silently. A --topic-map table with a dot
or a quote in a name is written as SQL writes it (`"my.schema".t=topic`, _map_key).

Default names are injective: two tables never share a default topic (nor, therefore,
registry subjects, which follow the topic). Kafka topic names allow only [A-Za-z0-9._-]
and at most 249 characters, and '.' separates the parts, so each identifier is escaped:
letters, digits and '_' stay as they are (the topic of a plain identifier is unchanged),
every other byte of its UTF-8 text becomes '-' and two lowercase hex digits, '-' and '.'
included. '-' is the escape character because PostgreSQL needs quotes to put it in a
name, so it is rare there, and it cannot start a part's plain text:

    public.order_items        → <prefix>.public.order_items
    public."order items"      → <prefix>.public.order-20items
    "my.schema".t             → <prefix>.my-2eschema.t
    my."schema.t"             → <prefix>.my.schema-2et
    public."Größe"            → <prefix>.public.Gr-c3-b6-c3-9fe

(Debezium replaces such characters with '_', which maps "order items" and order_items to
one topic.) The prefix is the user's and the same for every table; characters Kafka
rejects in it become '_'.

Two tables still reach one topic when --topic-map or --fallback-topic sends them there,
which is on purpose. What is refused, before the second table's first message
(SinkError): two tables whose topics Kafka itself holds to be one (Kafka rejects a topic
that differs from an existing one only by '.' versus '_': `p.a_b.c` and `p.a.b_c`), and
a default name longer than Kafka allows. Either error says to route the table with
--topic-map.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pg2sink.errors import ConfigError, SinkError
from pg2sink.publication.patterns import parse_table_name, quote_table_name

__all__ = ["MAX_TOPIC_LENGTH", "TopicRouter", "escape_identifier", "kafka_identity", "topic_name"]

#: Kafka's limit on a topic name's length (kafka.common.internals.Topic).
MAX_TOPIC_LENGTH = 249

_NOT_IN_TOPIC = re.compile(r"[^A-Za-z0-9._-]")
_ESCAPED = re.compile(r"[^A-Za-z0-9_]+")


def _hex_bytes(match: re.Match[str]) -> str:
    return "".join(f"-{b:02x}" for b in match.group().encode())


def escape_identifier(name: str) -> str:
    """A PostgreSQL identifier as one part of a topic name (module docstring)."""
    return _ESCAPED.sub(_hex_bytes, name)


def topic_name(prefix: str, *names: str) -> str:
    """`prefix` (characters Kafka rejects become '_') and the escaped names, '.'-joined."""
    return ".".join((_NOT_IN_TOPIC.sub("_", prefix), *map(escape_identifier, names)))


def kafka_identity(topic: str) -> str:
    """What Kafka compares topics by when it refuses a colliding one ('.' and '_' alike)."""
    return topic.replace(".", "_")


def _map_key(table: str) -> tuple[str, str]:
    """A --topic-map table → (schema, table).

    `schema.table` without quotes is split at its dot and taken as written (capitals
    included), as ever. With double quotes it reads as SQL does (`"my.schema".t`), and
    a name with more dots than one must quote the part holding them: `my.schema.t` could
    be either of two tables."""
    if '"' in table or table.count(".") != 1:
        return parse_table_name(table, "--topic-map")
    schema, _, name = table.partition(".")
    return schema, name


def _check_chosen_topics(topics: list[str]) -> None:
    """ConfigError for a --topic-map or --fallback-topic topic Kafka cannot hold."""
    identities: dict[str, str] = {}
    for topic in topics:
        if _NOT_IN_TOPIC.search(topic) or len(topic) > MAX_TOPIC_LENGTH or topic in (".", ".."):
            raise ConfigError(
                f"invalid topic {topic!r}: Kafka topic names are 1 to {MAX_TOPIC_LENGTH} "
                "characters of A-Z, a-z, 0-9, '.', '_' and '-'"
            )
        other = identities.setdefault(kafka_identity(topic), topic)
        if other != topic:
            raise ConfigError(
                f"topics {other!r} and {topic!r} collide in Kafka, which treats '.' and '_' "
                "alike in topic names: use one of them"
            )


class TopicRouter:
    """Table → topic, as the module docstring says."""

    def __init__(
        self, prefix: str, topic_map: Mapping[str, str], fallback: str | None = None
    ) -> None:
        self.prefix = prefix
        self.topic_map = {_map_key(table): topic for table, topic in topic_map.items()}
        self.fallback = fallback
        _check_chosen_topics([*self.topic_map.values(), *([fallback] if fallback else [])])
        #: the tables routed so far by their topic's Kafka identity: (topic, table)
        self._routed: dict[str, tuple[str, str]] = {}

    def topic(self, namespace: str, name: str) -> str:
        mapped = self.topic_map.get((namespace, name))
        if mapped is not None:
            return mapped
        if self.fallback:
            return self.fallback
        if self.topic_map:
            table = quote_table_name(namespace, name)
            raise SinkError(
                f"table {table} has no --topic-map entry and there is no --fallback-topic: "
                f"add --topic-map {table}=TOPIC, set --fallback-topic, or exclude the table "
                f"with -T {table}"
            )
        return self._default(namespace, name)

    def _default(self, namespace: str, name: str) -> str:
        """The default topic; SinkError when Kafka cannot hold it as this table's own."""
        topic = topic_name(self.prefix, namespace, name)
        table = quote_table_name(namespace, name)
        if len(topic) > MAX_TOPIC_LENGTH:
            raise SinkError(
                f"the topic of table {table} would be {len(topic)} characters long, more "
                f"than Kafka's {MAX_TOPIC_LENGTH}: route it with --topic-map {table}=TOPIC"
            )
        seen = self._routed.setdefault(kafka_identity(topic), (topic, table))
        if seen[1] != table:
            raise SinkError(
                f"tables {seen[1]} and {table} would share a Kafka topic ({seen[0]!r} and "
                f"{topic!r}: Kafka treats '.' and '_' alike in topic names): route them "
                f"with --topic-map (one topic each, or one on purpose)"
            )
        return topic
