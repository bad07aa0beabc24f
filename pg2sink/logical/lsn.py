"""LSN and replication-timestamp helpers: pure conversions, no I/O.

An LSN (log sequence number) is a 64-bit byte position in the WAL; PostgreSQL prints it as two
upper-case hex halves, "16/B374D848" (https://www.postgresql.org/docs/current/datatype-pg-lsn.html).

Timestamps in the replication protocol are int64 microseconds since the PostgreSQL epoch,
2000-01-01 00:00:00 UTC, not the Unix epoch
(https://www.postgresql.org/docs/current/protocol-replication.html).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Final

__all__ = [
    "PG_EPOCH",
    "PG_EPOCH_OFFSET_US",
    "datetime_to_pg_timestamp",
    "format_lsn",
    "now_pg_timestamp",
    "parse_lsn",
    "pg_timestamp_to_datetime",
]

#: the largest value an LSN can take (it is an unsigned 64-bit integer)
_MAX_LSN: Final = 0xFFFF_FFFF_FFFF_FFFF

# Same grammar as pg_lsn_in(): 1 to 8 hex digits, '/', 1 to 8 hex digits, nothing else.
_LSN_RE: Final = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")

#: 2000-01-01 00:00:00 UTC, the zero of PostgreSQL timestamps
PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)

#: microseconds from the Unix epoch (1970-01-01) to the PostgreSQL epoch (2000-01-01)
PG_EPOCH_OFFSET_US: Final = 946_684_800 * 1_000_000

_ONE_US: Final = timedelta(microseconds=1)


def parse_lsn(text: str) -> int:
    """Parse PostgreSQL's text form of an LSN ("16/B374D848") into an int."""
    match = _LSN_RE.fullmatch(text)
    if match is None:
        raise ValueError(
            f"invalid LSN {text!r}: expected two hex numbers of 1 to 8 digits "
            "separated by '/', like '16/B374D848'"
        )
    return (int(match[1], 16) << 32) | int(match[2], 16)


def format_lsn(lsn: int) -> str:
    """Format an LSN the way PostgreSQL prints it: upper-case hex "X/XXXXXXXX" halves."""
    if not 0 <= lsn <= _MAX_LSN:
        raise ValueError(f"LSN {lsn} is outside the unsigned 64-bit range")
    return f"{lsn >> 32:X}/{lsn & 0xFFFF_FFFF:X}"


def pg_timestamp_to_datetime(us: int) -> datetime:
    """Turn PG-epoch microseconds into an aware UTC datetime.

    Raises OverflowError when the value is outside datetime's range (years 1 to 9999).
    """
    return PG_EPOCH + timedelta(microseconds=us)


def datetime_to_pg_timestamp(dt: datetime) -> int:
    """Turn an aware datetime into PG-epoch microseconds (exact, integer arithmetic)."""
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"naive datetime {dt.isoformat()} has no time zone; pass an aware one")
    return (dt - PG_EPOCH) // _ONE_US


def now_pg_timestamp() -> int:
    """The current time as PG-epoch microseconds, e.g. for a Standby Status Update."""
    return time.time_ns() // 1000 - PG_EPOCH_OFFSET_US
