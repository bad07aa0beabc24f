"""Which topic a table's messages go to.

Default: `<prefix>.<schema>.<table>`. With `--topic-map schema.table=topic` the named tables
go where the map says; the others go to `--fallback-topic`, and without one they are an
error naming the table: a table is never dropped silently. Kafka topic names allow only
[A-Za-z0-9._-] (at most 249 characters), so any other character of a PostgreSQL name
becomes '_' in a default topic name ('order items' → 'order_items').
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pg2sink.errors import SinkError

__all__ = ["TopicRouter", "topic_name"]

_NOT_IN_TOPIC = re.compile(r"[^A-Za-z0-9._-]")


def topic_name(*parts: str) -> str:
    """The parts joined by '.', with characters Kafka rejects replaced by '_'."""
    return _NOT_IN_TOPIC.sub("_", ".".join(parts))


class TopicRouter:
    """Table → topic, as the module docstring says."""

    def __init__(
        self, prefix: str, topic_map: Mapping[str, str], fallback: str | None = None
    ) -> None:
        self.prefix = prefix
        self.topic_map = dict(topic_map)
        self.fallback = fallback

    def topic(self, namespace: str, name: str) -> str:
        mapped = self.topic_map.get(f"{namespace}.{name}")
        if mapped is not None:
            return mapped
        if self.fallback:
            return self.fallback
        if self.topic_map:
            table = f"{namespace}.{name}"
            raise SinkError(
                f"table {table} has no --topic-map entry and there is no --fallback-topic: "
                f"add --topic-map {table}=TOPIC, set --fallback-topic, or exclude the table "
                f"with -T {table}"
            )
        return topic_name(self.prefix, namespace, name)
