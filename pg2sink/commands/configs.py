"""The settings a command needs, built from its parsed arguments: the source's, the
chosen sink's (with its --format) and the whole stream's. Every value goes through
options.build, which registers its secrets before anything can show them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from pg2sink import options
from pg2sink.config import SourceConfig, StreamConfig
from pg2sink.errors import ConfigError
from pg2sink.formats.config import FormatConfig, Formatting, choose, origin_of
from pg2sink.routing.config import RoutingConfig
from pg2sink.sinks import entries

__all__ = ["sink_config", "source_config", "stream_config"]


def source_config(args: argparse.Namespace) -> SourceConfig:
    """The source's settings; the libpq environment's password is a secret too."""
    options.add_secret(os.environ.get("PGPASSWORD"))
    config: SourceConfig = options.build(SourceConfig, args)
    return config


def sink_config(args: argparse.Namespace, source: SourceConfig) -> object | None:
    """The chosen sink's settings (the file sink's with --decode-only, which prints to
    --file-path), with its --format; ConfigError for what can be checked without its
    server."""
    name = "file" if args.decode_only else (args.sink or StreamConfig.sink)
    entry = entries.entry(name)
    formats: FormatConfig = options.build(FormatConfig, args)
    # --decode-only prints what the stream would send, whatever --format says
    chosen = None if args.decode_only else choose(name, entry.formats, formats)
    if entry.config is None:
        return None
    # build() registers the secrets of each value as it makes it, so that no error
    # below can show them
    config: object = options.build(entry.config, args)
    if chosen is not None:  # a message sink: its format, and whom its messages name
        host, database = origin_of(source.dsn.reveal())
        formatting = Formatting(formats.debezium_schemas, host, database, formats.debezium_avro)
        config = dataclasses.replace(config, format=chosen, formatting=formatting)  # type: ignore[type-var]
    if isinstance(config, entries.Checked):
        config.check()
    return config


#: the formats of the tools pg2sink succeeds, whose streams carry their records only
_SEED_FORMATS = {
    "pg-kinesis": "pg_kinesis",
    "wal-listener": "wal-listener",
    "psql-streamer": "psql-streamer",
}


def stream_config(args: argparse.Namespace) -> StreamConfig:
    """Everything `pg2sink stream` needs, with --capture-ddl's message forwarding."""
    if args.message_prefixes and not args.messages:  # switches read by _switches_from_env
        raise ConfigError("--message-prefix filters --messages: add --messages")
    seed = _SEED_FORMATS.get(args.format or "")
    if seed is not None and (args.messages or args.capture_ddl):
        flag = "--messages" if args.messages else "--capture-ddl"
        raise ConfigError(
            f"--format {args.format} carries {seed}'s own records only, and its consumers "
            f"expect a table and columns in each: {flag} would put pg2sink's message "
            "records on the same stream; leave it off, or use --format json"
        )
    source = source_config(args)
    cfg: StreamConfig = options.build(
        StreamConfig,
        args,
        source=source,
        sink_config=sink_config(args, source),
        routing=options.build(RoutingConfig, args),
    )
    if cfg.capture_ddl and (cfg.message_prefixes or not cfg.messages):
        # the DDL messages are forwarded even without --messages (and only they, then)
        prefixes = (*cfg.message_prefixes, "pg2sink.ddl")
        cfg = dataclasses.replace(cfg, messages=True, message_prefixes=prefixes)
    return cfg
