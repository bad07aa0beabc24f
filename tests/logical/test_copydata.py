"""CopyData framing of the replication protocol, against frames captured from PostgreSQL 15."""

from __future__ import annotations

import pytest

from pg2sink.errors import DecodeError
from pg2sink.logical import (
    Begin,
    PrimaryKeepalive,
    Type,
    XLogData,
    decode,
    parse_copy_data,
    parse_lsn,
    standby_status_update,
)
from tests.logical import golden as g


def test_keepalive() -> None:
    assert parse_copy_data(g.KEEPALIVE) == PrimaryKeepalive(
        wal_end=parse_lsn("0/1543DC8"), send_time=0x000303BEEAE978B4, reply_requested=False
    )


def test_keepalive_reply_requested() -> None:
    assert parse_copy_data(memoryview(g.KEEPALIVE_REPLY_REQUESTED)) == PrimaryKeepalive(
        parse_lsn("0/15FA1A8"), 0x000303BEEB141DB2, True
    )


def test_xlogdata() -> None:
    frame = parse_copy_data(g.XLOGDATA_BEGIN)
    assert isinstance(frame, XLogData)
    assert frame.data_start == frame.wal_end == parse_lsn("0/1544B38")
    assert frame.send_time == 0x000303BEEAE97983
    assert frame.payload == g.BEGIN
    assert decode(frame.payload) == Begin(parse_lsn("0/1544C38"), 0x000303BEE9BC4980, 734)


def test_xlogdata_mid_transaction_has_zero_positions() -> None:
    assert parse_copy_data(g.XLOGDATA_TYPE) == XLogData(0, 0, 0x000303BEEAE979A1, g.TYPE_MOOD)


def test_xlogdata_payload_is_a_view_of_a_memoryview() -> None:
    frame = parse_copy_data(memoryview(g.XLOGDATA_TYPE))
    assert isinstance(frame, XLogData)
    assert isinstance(frame.payload, memoryview)
    assert decode(frame.payload) == Type(g.MOOD_OID, "public", "mood")


def test_standby_status_update_matches_what_the_server_accepted() -> None:
    lsn = parse_lsn("0/1544E48")
    assert standby_status_update(lsn, lsn, lsn, 0, reply_requested=True) == g.STANDBY_STATUS_UPDATE


def test_standby_status_update_layout() -> None:
    msg = standby_status_update(1, 2, 3, 4)
    assert len(msg) == 1 + 8 + 8 + 8 + 8 + 1
    assert (
        msg == b"r" + (1).to_bytes(8) + (2).to_bytes(8) + (3).to_bytes(8) + (4).to_bytes(8) + b"\0"
    )


@pytest.mark.parametrize("buf", [g.KEEPALIVE, g.XLOGDATA_BEGIN])
def test_truncated_frames(buf: bytes) -> None:
    # XLogData may carry any payload, but not less than its 25-byte header
    cuts = range(len(buf)) if buf[:1] == b"k" else range(25)
    for cut in cuts:
        with pytest.raises(DecodeError):
            parse_copy_data(buf[:cut])


def test_keepalive_with_trailing_bytes() -> None:
    with pytest.raises(DecodeError, match="expected 18"):
        parse_copy_data(g.KEEPALIVE + b"\0")


def test_truncated_error_names_the_message() -> None:
    with pytest.raises(DecodeError, match="truncated replication PRIMARY_KEEPALIVE message"):
        parse_copy_data(g.KEEPALIVE[:5])


@pytest.mark.parametrize("buf", [g.STANDBY_STATUS_UPDATE, b"h" + bytes(20), b"\0"])
def test_unknown_tag(buf: bytes) -> None:
    with pytest.raises(DecodeError, match="unknown replication CopyData tag"):
        parse_copy_data(buf)
