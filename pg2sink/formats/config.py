"""The one `--format` option of the message sinks (Kafka, NATS, Kinesis), and what the
CLI hands the chosen sink.

`--format` is declared once, here (FormatConfig), not by each sink: the CLI builds it,
refuses a format the chosen sink does not take (its registry entry's `formats`, the
first being its default: avro for Kafka, json for NATS and Kinesis) with a one-line
error, and puts the choice in the sink's config (its `format` and `formatting` fields,
which are no options). The source's host and database, which psql-streamer's and
Debezium's messages name, come from the connection string (or libpq's environment);
never a password.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict

from pg2sink.errors import ConfigError
from pg2sink.options import flag

__all__ = ["FORMATS", "FormatConfig", "Formatting", "choose", "origin_of"]

#: Group.SINK's name (pg2sink.config imports the sinks' configs, which import this)
GROUP = "sink"
#: every --format; which sink takes which: sinks/entries.py SinkEntry.formats
FORMATS = ("avro", "json", "pg-kinesis", "wal-listener", "psql-streamer", "debezium")


@dataclass(frozen=True)
class FormatConfig:
    """The message format options of `pg2sink stream` (docs/formats.md)."""

    format: str | None = flag(
        None,
        group=GROUP,
        help="message format of --sink kafka, nats or kinesis: avro (Kafka only; Kafka's "
        "default), json (pg2sink's; the others' default), the seed tools' pg-kinesis, "
        "wal-listener, psql-streamer, or debezium (docs/formats.md)",
        choices=FORMATS,
    )
    """None: the sink's default (the first of its registry entry's formats)."""
    debezium_schemas: bool = flag(
        False,
        group=GROUP,
        help="with --format debezium, write each key and value with its Kafka Connect "
        "schema (JsonConverter's schemas.enable=true)",
    )
    debezium_avro: bool = flag(
        False,
        group=GROUP,
        help="with --format debezium on --sink kafka, write keys and values in Avro "
        "through --schema-registry-url, as Kafka Connect's AvroConverter does",
    )


@dataclass(frozen=True)
class Formatting:
    """What a message sink's format needs beyond its name (set by the CLI)."""

    debezium_schemas: bool = False
    host: str = ""
    """The source's host (psql-streamer's Host); empty: unknown."""
    database: str = ""
    """The source's database (psql-streamer's Database, Debezium's source.db)."""
    debezium_avro: bool = False
    """--debezium-avro: Debezium's events in Avro through the registry (Kafka only)."""


def origin_of(dsn: str) -> tuple[str, str]:
    """The host and database a connection string names, libpq's way: its keywords, else
    PGHOST / PGDATABASE, else the user name for the database."""
    try:
        params = conninfo_to_dict(dsn)
    except Exception:  # an invalid DSN is the source's error to report, not this one's
        params = {}
    host = str(params.get("host") or os.environ.get("PGHOST") or "")
    user = params.get("user") or os.environ.get("PGUSER") or _login()
    database = str(params.get("dbname") or os.environ.get("PGDATABASE") or user)
    return host, database


def _login() -> str:
    """The OS user name, libpq's default user; empty where the OS has none (a container
    without a passwd entry)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def choose(sink: str, supported: tuple[str, ...], config: FormatConfig) -> str | None:
    """The format of `--sink=sink`: --format, else the sink's default (None for a sink
    that takes none); ConfigError naming the choices for one it does not take."""
    if not supported:
        if config.format is not None:
            raise ConfigError(f"--format is for --sink kafka, nats or kinesis, not {sink}")
        return None
    chosen = config.format or supported[0]
    if chosen not in supported:
        raise ConfigError(
            f"--sink={sink} does not take --format {chosen}: choose one of {', '.join(supported)}"
        )
    if config.debezium_schemas and chosen != "debezium":
        raise ConfigError("--debezium-schemas needs --format debezium")
    if config.debezium_avro and (chosen != "debezium" or sink != "kafka"):
        raise ConfigError("--debezium-avro needs --sink kafka --format debezium")
    if config.debezium_avro and config.debezium_schemas:
        raise ConfigError("--debezium-avro and --debezium-schemas: choose one")
    return chosen
