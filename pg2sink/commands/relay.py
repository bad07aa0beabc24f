"""`pg2sink relay`: its options and its run (docs/relay.md).

Its options: the relay's own (config.RelayConfig), --sink and every sink's options as
`pg2sink stream` has them (each sink writes in its default format), and logging. The
registry of the consumed Avro topics is the Kafka sink's --schema-registry-url (and
--schema-registry-config): the same registry serves both sides when the relay writes to
Kafka again.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from pg2sink import options
from pg2sink.config import Group, StreamConfig
from pg2sink.errors import ConfigError
from pg2sink.observability.http import serve_api
from pg2sink.observability.stats import StreamStats
from pg2sink.options import Option
from pg2sink.relay.config import GROUP, RelayConfig
from pg2sink.sinks import entries
from pg2sink.sinks.kafka.config import KafkaConfig

__all__ = ["add_parser", "run"]

log = logging.getLogger(__name__)

_SINK = options.options_of(StreamConfig, groups=[Group.SINK], omit=["decode_only"])
#: --http-token-file, --http-tls-cert, --http-tls-key as the stream has them (the relay's
#: --relay-metrics-address is its own: another default port)
_HTTP = options.options_of(StreamConfig, groups=[Group.OBSERVABILITY], omit=["metrics_address"])


def add_parser(sub: Any, sinks: list[Option], groups: list[str], logging: list[Option]) -> None:
    """The `relay` subcommand, with the sinks' options `sinks` under their `groups`."""
    relay = sub.add_parser(
        "relay",
        help="relay pg2sink's Kafka topics (Avro or JSON) into another sink",
        description="Consume the topics pg2sink streams to Kafka (from one or several "
        "databases) and write their changes to --sink. Consumer offsets are committed only "
        "after the sink durably holds the changes before them (at-least-once; "
        "docs/relay.md).",
    )
    options.add_options(
        relay,
        [*options.options_of(RelayConfig), *_SINK, *sinks, *_HTTP, *logging],
        [GROUP, Group.SINK, *groups, Group.OBSERVABILITY, Group.LOGGING, Group.CONFIG],
    )


def _sink(args: argparse.Namespace) -> Any:
    """The chosen sink, not opened, from its options (checked as the stream checks them)."""
    entry = entries.entry(args.sink or StreamConfig.sink)
    config = None if entry.config is None else options.build(entry.config, args)
    if isinstance(config, entries.Checked):
        config.check()
    return entry.create(config)


def _offsets_file(cfg: RelayConfig, args: argparse.Namespace) -> Path | None:
    """The DuckDB file that keeps the offsets with --relay-exactly-once (offsets.py)."""
    if not cfg.relay_exactly_once:
        return None
    if args.sink != "duckdb":
        raise ConfigError("--relay-exactly-once needs --sink duckdb")
    return Path(args.duckdb_path)


def run(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> None:
    """Relay until SIGINT or SIGTERM."""
    cfg: RelayConfig = options.build(RelayConfig, args)
    cfg.check()
    # registers the URL's secret; Avro topics need the registry, pg2sink's JSON topics
    # --from-schema-topic, psql-streamer's neither: a message needing one says so
    kafka: KafkaConfig = options.build(KafkaConfig, args)
    sink = _sink(args)
    # confluent-kafka is the [kafka] extra: imported once the relay runs
    try:
        from pg2sink.relay.relay import Relay
        from pg2sink.relay.schemas import Shapes
    except ImportError as e:
        raise ConfigError(f"pg2sink relay needs the kafka extra: {e}") from None
    from pg2sink.subscription.loop import StopRequested

    url = kafka.schema_registry_url
    stats = StreamStats()
    stats.info = {"sink": args.sink or StreamConfig.sink}
    relay = Relay(cfg, sink, Shapes(url, kafka.registry.reveal()) if url else None, stats)
    relay.offsets_file = _offsets_file(cfg, args)
    http = serve_api(
        cfg.relay_metrics_address,
        stats,
        args.http_token_file,
        args.http_tls_cert,
        args.http_tls_key,
    )
    if http is not None:
        log.info("HTTP API on %s", http.url)
    stop = StopRequested()
    stop.install()
    try:
        relay.run(stop)
    finally:
        stop.uninstall()
        if http is not None:
            http.close()
