"""Typed configuration of pg2sink, with secret-safe handling of the source DSN.

The CLI (cli.py) fills these classes from flags and `PG2SINK_<NAME>`
environment variables; everything below the CLI receives them ready-made.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import psycopg.conninfo

from pg2sink.errors import ConfigError

#: Settings of the replication session. pgoutput renders column values with
#: the walsender's output functions, so these GUCs fix the text forms the
#: value decoders parse: ISO dates, UTC offsets, round-trip floats, hex bytea.
#: https://www.postgresql.org/docs/current/runtime-config-client.html
REPLICATION_SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}


class SecretDsn:
    """A libpq connection string whose password never leaks through str/repr."""

    __slots__ = ("_dsn",)

    def __init__(self, dsn: str) -> None:
        try:
            # Parsing validates both key=value DSNs and postgresql:// URIs.
            psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as e:
            raise ConfigError(
                f"invalid --source connection string: {_scrub(str(e), dsn)}"
            ) from None
        self._dsn = dsn

    def reveal(self) -> str:
        """The full DSN, for handing to libpq only."""
        return self._dsn

    @property
    def password(self) -> str | None:
        value = psycopg.conninfo.conninfo_to_dict(self._dsn).get("password")
        return str(value) if value else None

    def redacted(self) -> str:
        """The DSN without its password, for messages and logs."""
        params = psycopg.conninfo.conninfo_to_dict(self._dsn)
        params.pop("password", None)
        return psycopg.conninfo.make_conninfo("", **params) or "(libpq environment)"

    def __repr__(self) -> str:
        return f"SecretDsn({self.redacted()!r})"

    __str__ = redacted


def _scrub(message: str, dsn: str) -> str:
    """Remove anything password-like from an error message about `dsn`."""
    try:
        pw = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:
        pw = None
    if pw:
        message = message.replace(str(pw), "***")
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", message)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'10s', '500ms', '2m', '1h' or a bare number of seconds → seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"invalid duration {text!r} (examples: 10s, 500ms, 2m)")
    seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be greater than zero")
    return seconds


@dataclass(frozen=True)
class SourceConfig:
    """Where and what to replicate."""

    dsn: SecretDsn
    """libpq DSN or URI; empty means the libpq environment (PGHOST, PGPORT...)."""
    publication: str = "pg2sink"
    """Publication whose table membership pg2sink manages."""
    slot: str = "pg2sink"
    """Logical replication slot (pgoutput) pg2sink streams from."""
    schemas: tuple[str, ...] = ("public",)
    """Schemas whose tables are candidates for the publication."""
    tables: tuple[str, ...] = ()
    """psql-style patterns of tables to include (empty: every table)."""
    exclude_tables: tuple[str, ...] = ()
    """psql-style patterns of tables to exclude; wins over `tables`."""
    internal_schema: str = "pg2sink"
    """pg2sink's own schema, never published."""


@dataclass(frozen=True)
class StreamConfig:
    """Everything `pg2sink stream` needs."""

    source: SourceConfig
    sink: str = "file"
    """Sink name: file."""
    file_path: str = "-"
    """File sink target; '-' is standard output."""
    decode_only: bool = False
    """Print decoded pgoutput messages and never advance the slot."""
    heartbeat_interval: float = 10.0
    """Seconds between standby status updates to the server (at most)."""
    publication_poll_interval: float = 10.0
    """Seconds between publication membership reconciliations."""
    flush_interval: float = 0.1
    """Seconds between durable sink flushes (each flush may confirm an LSN)."""
    retry_initial: bool = False
    """Wait and retry while the slot is busy or the server unreachable at start."""
    retry_interval: float = 5.0
    """Seconds between retries with --retry-initial."""
    secrets: tuple[str, ...] = field(default=(), repr=False)
    """Strings that must never appear in output (passwords)."""
