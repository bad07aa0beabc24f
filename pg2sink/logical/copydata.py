"""Sans-IO framing of the streaming replication protocol: the CopyData payloads.

After START_REPLICATION the server and the client exchange CopyData messages; the first byte
of each payload says what it is
(https://www.postgresql.org/docs/current/protocol-replication.html#PROTOCOL-REPLICATION-START-REPLICATION).
This module parses the server's XLogData and Primary keepalive messages and builds the
client's Standby status update. Reading and writing the connection is someone else's job.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from pg2sink.errors import DecodeError

__all__ = [
    "XLOG_DATA_HEADER",
    "CopyDataTag",
    "PrimaryKeepalive",
    "XLogData",
    "parse_copy_data",
    "standby_status_update",
]


class CopyDataTag(IntEnum):
    """First byte of a CopyData payload in a replication connection."""

    XLOG_DATA = ord("w")
    PRIMARY_KEEPALIVE = ord("k")
    STANDBY_STATUS_UPDATE = ord("r")


_XLOG_DATA: Final = struct.Struct(">BQQq")  # tag, data start, WAL end, send time
#: The XLogData header, public for the replication loop's fast path, which unpacks it
#: in place instead of building an XLogData per message; the payload starts at its size.
XLOG_DATA_HEADER: Final = _XLOG_DATA
_KEEPALIVE: Final = struct.Struct(">BQqB")  # tag, WAL end, send time, reply requested
_STATUS_UPDATE: Final = struct.Struct(">BQQQqB")  # tag, write, flush, apply, send time, reply


@dataclass(frozen=True, slots=True)
class XLogData:
    """WAL data ('w'): one pgoutput message with the WAL positions around it.

    Layout: Byte1('w'), Int64 start of the WAL data in this message, Int64 current end of WAL
    on the server, Int64 server clock at send time (PG-epoch microseconds), Byte(n) payload.
    """

    data_start: int
    wal_end: int
    send_time: int
    payload: memoryview | bytes
    """The pgoutput message (see `decoder.decode`); a slice of the input, same type."""


@dataclass(frozen=True, slots=True)
class PrimaryKeepalive:
    """Primary keepalive ('k').

    Layout: Byte1('k'), Int64 current end of WAL on the server, Int64 server clock at send time
    (PG-epoch microseconds), Byte1 1 if the client should reply at once to avoid a timeout.
    """

    wal_end: int
    send_time: int
    reply_requested: bool


def parse_copy_data(buf: bytes | memoryview) -> XLogData | PrimaryKeepalive:
    """Parse one CopyData payload sent by the server during START_REPLICATION."""
    if not buf:
        raise DecodeError("empty replication CopyData message")
    tag = buf[0]
    try:
        if tag == CopyDataTag.XLOG_DATA:
            _, data_start, wal_end, send_time = _XLOG_DATA.unpack_from(buf)
            return XLogData(data_start, wal_end, send_time, buf[_XLOG_DATA.size :])
        if tag == CopyDataTag.PRIMARY_KEEPALIVE:
            _, wal_end, send_time, reply = _KEEPALIVE.unpack_from(buf)
            if len(buf) != _KEEPALIVE.size:
                raise DecodeError(
                    f"primary keepalive message has {len(buf)} bytes, expected {_KEEPALIVE.size}"
                )
            return PrimaryKeepalive(wal_end, send_time, reply == 1)
    except struct.error as exc:
        raise DecodeError(
            f"truncated replication {CopyDataTag(tag).name} message: "
            f"it ends after {len(buf)} bytes ({exc})"
        ) from exc
    raise DecodeError(f"unknown replication CopyData tag {chr(tag)!r} (0x{tag:02x}) at offset 0")


def standby_status_update(
    write_lsn: int,
    flush_lsn: int,
    apply_lsn: int,
    send_time: int,
    reply_requested: bool = False,
) -> bytes:
    """Build a Standby status update ('r'), the payload of a CopyData sent to the server.

    Layout: Byte1('r'), Int64 last WAL byte + 1 written, Int64 ... flushed to disk,
    Int64 ... applied, Int64 client clock (PG-epoch microseconds), Byte1 1 to ask the server
    for an immediate reply. For a logical slot, flush_lsn is what the server keeps as the
    slot's confirmed_flush_lsn: WAL before it may be recycled.
    """
    return _STATUS_UPDATE.pack(
        CopyDataTag.STANDBY_STATUS_UPDATE,
        write_lsn,
        flush_lsn,
        apply_lsn,
        send_time,
        1 if reply_requested else 0,
    )
