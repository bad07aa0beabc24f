"""The relay's own options (`pg2sink relay`; docs/relay.md); the sink's come from its
registry entry, the schema registry's from the Kafka sink's --schema-registry-url."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pg2sink.errors import ConfigError
from pg2sink.options import flag, positive_int, split_settings
from pg2sink.sensitive import Settings

GROUP = "relay (pg2sink relay)"


def _primary_key(text: str) -> tuple[str, tuple[str, ...]]:
    table, _, columns = text.partition("=")
    keys = tuple(c.strip() for c in columns.split(",") if c.strip())
    if not table.strip() or not keys:
        raise ConfigError(
            f"--relay-primary-key: {text!r}: expected TABLE=COLUMN[,COLUMN...], e.g. users=id"
        )
    return table.strip(), keys


@dataclass(frozen=True)
class RelayConfig:
    """Where the relay reads from (docs/relay.md)."""

    relay_bootstrap_servers: str = flag(
        group=GROUP,
        help="Kafka brokers of the topics to relay, host:port[,host:port...]",
        names=("--from-kafka",),
        metavar="SERVERS",
        parse=str.strip,
    )
    relay_topics: str = flag(
        "",
        group=GROUP,
        help="regular expression of the topics to relay (pg2sink's table topics, e.g. "
        r"'(db1|db2)\..*'); matched against whole topic names, new topics too",
        names=("--topics",),
        metavar="PATTERN",
    )
    relay_group_id: str = flag(
        "pg2sink-relay",
        group=GROUP,
        help="the consumer group whose committed offsets say what the sink holds",
        names=("--group-id",),
        metavar="GROUP",
    )
    relay_schema_topic: str = flag(
        "",
        group=GROUP,
        help="JSON topics: the producing pg2sink's --schema-topic, where the relay finds "
        "each table's Schema record",
        names=("--from-schema-topic",),
        metavar="TOPIC",
    )
    relay_consumer: Settings = flag(  # noqa: RUF009 (a dataclasses.field())
        factory=Settings,
        group=GROUP,
        help="librdkafka consumer setting (security.protocol, sasl.*, ssl.*...); repeatable",
        names=("--relay-kafka-config",),
        metavar="KEY=VALUE",
        repeat=True,
        split=split_settings,
        build=Settings.parse,
        secret=True,
    )
    relay_schema_prefix: bool = flag(
        False,
        group=GROUP,
        help="name each table's schema after its topic's prefix too (a.public.t: schema "
        "a_public), so that equal table names of several databases stay apart; without it "
        "a table arriving from a second topic stops the relay",
    )
    relay_exactly_once: bool = flag(
        False,
        group=GROUP,
        help="--sink duckdb: keep the consumed offsets in the DuckDB file, committed with "
        "the changes, and start from them (no change written twice after a crash)",
    )
    relay_dead_letter_topic: str = flag(
        "",
        group=GROUP,
        help="a topic (of the same cluster) that receives each message the relay cannot "
        "read, with headers naming its topic, partition, offset and the error; without it "
        "such a message stops the relay",
        metavar="TOPIC",
    )
    relay_primary_key: tuple[tuple[str, tuple[str, ...]], ...] = flag(
        (),
        group=GROUP,
        help="psql-streamer's topics: the key columns of a table, whose events do not "
        "name them (TABLE=COL[,COL...]; repeatable); without it the table has no key",
        metavar="TABLE=COLUMNS",
        repeat=True,
        build=lambda items, _name: tuple(_primary_key(i) for i in items),
    )
    relay_metrics_address: str = flag(
        "127.0.0.1:9526",
        group=GROUP,
        help="HOST:PORT serving the relay's /health, /status, /stats and Prometheus "
        "/metrics (the stream's default port plus one, so both run side by side; port 0: "
        "any free port; 'off': no listener)",
        metavar="HOST:PORT",
    )
    relay_batch_size: int = flag(
        5000,
        group=GROUP,
        help="most messages written to the sink between two offset commits",
        metavar="N",
        parse=positive_int,
    )

    def check(self) -> None:
        """ConfigError for what can be checked without a broker."""
        if not self.relay_bootstrap_servers:
            raise ConfigError("pg2sink relay needs --from-kafka SERVERS")
        if not self.relay_topics:
            raise ConfigError("pg2sink relay needs --topics PATTERN")
        try:
            re.compile(self.relay_topics)
        except re.error as e:
            raise ConfigError(
                f"--topics {self.relay_topics!r} is no regular expression: {e}"
            ) from None
