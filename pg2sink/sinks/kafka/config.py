"""The Kafka sink's options (--sink=kafka; README "Kafka")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pg2sink.errors import ConfigError
from pg2sink.formats.config import Formatting
from pg2sink.options import flag, split_settings
from pg2sink.sensitive import Settings, url_password

if TYPE_CHECKING:
    from pg2sink.formats.kafka import Format
    from pg2sink.schema_registry import SchemaRegistry

GROUP = "kafka sink (--sink=kafka)"


def _settings(name: str, help: str) -> Any:
    """Repeatable KEY=VALUE client settings, whose values may be secrets."""
    return flag(
        factory=Settings,
        group=GROUP,
        help=help,
        names=(name,),
        metavar="KEY=VALUE",
        repeat=True,
        split=split_settings,
        build=Settings.parse,
        secret=True,
    )


@dataclass(frozen=True)
class KafkaConfig:
    """What `--sink=kafka` needs (README "Kafka").

    A field's `help` documents it, for `--help` and readers alike; a docstring under a
    field says what the code needs beyond it (units, what None means)."""

    bootstrap_servers: str = flag(
        group=GROUP,
        help="Kafka brokers, host:port[,host:port...]",
        names=("--kafka-bootstrap-servers",),
        metavar="SERVERS",
        parse=str.strip,
    )
    producer: Settings = _settings(  # noqa: RUF009 (a dataclasses.field())
        "--kafka-config",
        "librdkafka producer setting (security.protocol, sasl.*, ssl.*, linger.ms, "
        "compression.type...); repeatable",
    )
    schema_registry_url: str = flag(
        "",
        group=GROUP,
        help="schema registry, Confluent-compatible API (Apicurio: .../apis/ccompat/v7); "
        "needed for --format avro",
        metavar="URL",
        parse=str.strip,
        secret=True,
        repr=False,
    )
    """Confluent-compatible schema registry API; may hold user info, hence not in repr."""
    registry: Settings = _settings(  # noqa: RUF009 (a dataclasses.field())
        "--schema-registry-config",
        "schema registry client setting (basic.auth.user.info, ssl.ca.location, "
        "timeout...); repeatable",
    )
    format: str = "avro"
    """The message format: the shared --format option's choice (formats/config.py, set by
    the CLI): avro (Confluent wire format, registry), json, or a formats/ encoder's name."""
    formatting: Formatting = field(default_factory=Formatting)
    """What a formats/ encoder needs beyond its name (set by the CLI)."""
    topic_prefix: str = flag(
        "pg2sink",
        group=GROUP,
        help="a table's topic is PREFIX.<schema>.<table>",
        metavar="PREFIX",
    )
    topic_map: tuple[tuple[str, str], ...] = flag(
        (),
        group=GROUP,
        help="send a table's messages to TOPIC; repeatable",
        metavar="SCHEMA.TABLE=TOPIC",
        repeat=True,
        build=lambda pairs, _name: parse_topic_map(pairs),
    )
    """('schema.table', topic) pairs from --topic-map."""
    fallback_topic: str | None = flag(
        None,
        group=GROUP,
        help="topic of tables --topic-map does not name (without it such a table stops "
        "the stream with an error); without --topic-map, every table's topic",
        metavar="TOPIC",
    )
    tombstones: bool = flag(
        False,
        group=GROUP,
        help="follow each DELETE with a null-value message for its key (log compaction)",
    )
    schema_topic: str | None = flag(
        None,
        group=GROUP,
        help="also publish Schema records as JSON to this topic, keyed by schema.table",
        metavar="TOPIC",
    )
    message_topic: str | None = flag(
        None,
        group=GROUP,
        help="topic of Message records (--messages), JSON; default PREFIX.messages",
        metavar="TOPIC",
    )
    """Topic of Message records (--messages); None: '<topic_prefix>.messages'."""
    exactly_once: bool = flag(
        False,
        group=GROUP,
        help="write each flush as one Kafka transaction with its checkpoint in "
        "--offsets-topic, and skip at start what Kafka already holds: read_committed "
        "consumers see every change once (docs/kafka-exactly-once.md)",
    )
    transactional_id: str | None = flag(
        None,
        group=GROUP,
        help="with --exactly-once, the producer's transactional.id (default "
        "PREFIX.SLOT); a second pg2sink with the same id fences the first",
        metavar="ID",
    )
    """None: '<topic_prefix>.<slot>' (KafkaSink's use_slot fills it in)."""
    offsets_topic: str | None = flag(
        None,
        group=GROUP,
        help="with --exactly-once, the compacted topic of checkpoints (created if "
        "missing); default PREFIX.offsets",
        metavar="TOPIC",
    )
    """None: '<topic_prefix>.offsets'."""
    transaction_topic: str | None = flag(
        None,
        group=GROUP,
        help="publish a BEGIN and an END record (JSON, Debezium's fields) per transaction "
        "to this topic",
        metavar="TOPIC",
    )

    def check(self) -> None:
        """ConfigError for what can be checked without a broker (the CLI calls it)."""
        if not self.bootstrap_servers and "bootstrap.servers" not in self.producer:
            raise ConfigError("--sink=kafka needs --kafka-bootstrap-servers")
        if self.format == "avro" and not self.schema_registry_url:
            raise ConfigError("--format avro needs --schema-registry-url (or use --format json)")
        if not self.exactly_once and (self.transactional_id or self.offsets_topic):
            raise ConfigError("--transactional-id and --offsets-topic need --exactly-once")

    def secrets(self) -> list[str]:
        """Every secret value of this configuration (for log redaction)."""
        out = self.producer.secrets() + self.registry.secrets()
        password = url_password(self.schema_registry_url)
        if password:
            out.append(password)
        return out


def parse_topic_map(pairs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`schema.table=topic` strings → pairs; ConfigError for a malformed one."""
    out: dict[str, str] = {}
    for pair in pairs:
        table, eq, topic = pair.rpartition("=")
        if not eq or "." not in table.strip(".") or not topic.strip():
            raise ConfigError(f"invalid --topic-map {pair!r}: expected schema.table=topic")
        out[table] = topic.strip()
    return tuple(out.items())


def message_format(cfg: KafkaConfig, registry: SchemaRegistry | None = None) -> Format:
    """The Format of `cfg.format`; avro writes through `registry` (by default a client
    of --schema-registry-url), ConfigError without one. (Its imports are the sink's,
    not the CLI's, which reads this module for the options.)"""
    from pg2sink.formats.base import Origin
    from pg2sink.formats.debezium import DebeziumFormat
    from pg2sink.formats.kafka import AvroFormat, EncoderFormat, JsonFormat
    from pg2sink.formats.registry import encoder

    if cfg.format == "json":
        return JsonFormat()
    f = cfg.formatting
    if cfg.format != "avro" and not f.debezium_avro:
        origin = Origin(f.host, f.database, cfg.topic_prefix)
        if cfg.format == "debezium":
            return DebeziumFormat(origin, f.debezium_schemas)
        return EncoderFormat(encoder(cfg.format, origin))
    if registry is None:
        if not cfg.schema_registry_url:
            raise ConfigError("--format avro needs --schema-registry-url (or use --format json)")
        from pg2sink.schema_registry import RegistryClient

        registry = RegistryClient(cfg.schema_registry_url, cfg.registry.reveal())
    if f.debezium_avro:  # --format debezium --debezium-avro
        from pg2sink.formats.debezium_avro import DebeziumAvroFormat

        return DebeziumAvroFormat(Origin(f.host, f.database, cfg.topic_prefix), registry)
    return AvroFormat(registry)
