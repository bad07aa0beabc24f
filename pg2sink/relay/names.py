"""Which table a relayed record lands in: never two sources' tables as one.

Several databases streamed to Kafka may each have a table `public.t`; the sink keys its
tables by schema and table name (the DuckDB sink's `public_t`), so relaying both as
they are would merge them: rows with equal keys would overwrite each other. The relay
tells sources apart by topic (pg2sink writes each table of a database to its own topic,
`<prefix>.<schema>.<table>`) and:

- by default refuses a table that arrives from a second topic: a SinkError naming both
  topics, raised before the change is written (its batch is not committed);
- with --relay-schema-prefix, names each table's schema after its topic's prefix as
  well: `public.t` of topic `a.public.t` becomes `a_public.t` (in DuckDB the view
  `a_public_t`), of `b.public.t` `b_public.t`. The prefix is the topic's name before
  `.<schema>.<table>`; a topic named otherwise (--topic-map) is the prefix as a whole.

What one relay run has seen is all it knows: two sources relayed by two runs into one
sink (one after the other, or two relays) are not compared; use --relay-schema-prefix
whenever topics of several databases reach one sink.
"""

from __future__ import annotations

from pg2sink.errors import SinkError

__all__ = ["TableNames", "topic_prefix"]


def topic_prefix(topic: str, namespace: str, name: str) -> str:
    """The part of `topic` before `.<namespace>.<name>`, else the whole topic."""
    suffix = f".{namespace}.{name}"
    return topic[: -len(suffix)] if topic.endswith(suffix) and topic != suffix else topic


class TableNames:
    """The schema name each relayed table gets (see the module docstring)."""

    def __init__(self, schema_prefix: bool) -> None:
        self.schema_prefix = schema_prefix
        #: the topic each table first came from (without --relay-schema-prefix)
        self._topics: dict[tuple[str, str], str] = {}
        self._names: dict[tuple[str, str, str], str] = {}

    def namespace(self, topic: str, namespace: str, name: str) -> str:
        """The schema name of table `namespace.name` of `topic` in the sink; SinkError
        for a table another topic already brought, unless schemas are prefixed."""
        key = (topic, namespace, name)
        known = self._names.get(key)
        if known is not None:
            return known
        if self.schema_prefix:
            out = f"{topic_prefix(topic, namespace, name)}_{namespace}"
        else:
            first = self._topics.setdefault((namespace, name), topic)
            if first != topic:
                raise SinkError(
                    f"table {namespace}.{name} comes from topics {first!r} and {topic!r} "
                    "(two databases?): the relay does not merge them; add "
                    "--relay-schema-prefix to name each after its topic's prefix"
                )
            out = namespace
        self._names[key] = out
        return out
