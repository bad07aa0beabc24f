"""LSN text form and PG-epoch timestamp helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from pg2sink.logical import (
    PG_EPOCH_OFFSET_US,
    datetime_to_pg_timestamp,
    format_lsn,
    now_pg_timestamp,
    parse_lsn,
    pg_timestamp_to_datetime,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0/0", 0),
        ("16/B374D848", 0x16_B374D848),
        ("0/1544C38", 0x1544C38),
        ("FFFFFFFF/FFFFFFFF", 2**64 - 1),
        ("00000001/00000000", 2**32),
    ],
)
def test_parse_and_format(text: str, value: int) -> None:
    assert parse_lsn(text) == value
    assert parse_lsn(text.lower()) == value
    assert parse_lsn(format_lsn(value)) == value


def test_format_like_postgresql() -> None:
    assert format_lsn(0x16_B374D848) == "16/B374D848"
    assert format_lsn(0x1544C38) == "0/1544C38"
    assert format_lsn(2**32) == "1/0"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0",
        "1/",
        "/1",
        "1/2/3",
        "123456789/0",
        "0/123456789",
        "0x1/2",
        " 1/2",
        "1/2 ",
        "+1/2",
        "g/1",
        "1_0/2",
        "-1/0",
        "1/2\n",
    ],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid LSN"):
        parse_lsn(text)


@pytest.mark.parametrize("value", [-1, 2**64])
def test_format_rejects_out_of_range(value: int) -> None:
    with pytest.raises(ValueError, match="64-bit"):
        format_lsn(value)


def test_epoch_offset() -> None:
    assert int(datetime(2000, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000 == PG_EPOCH_OFFSET_US


def test_timestamp_from_the_origin_capture() -> None:
    # golden.BEGIN_WITH_ORIGIN: commit time set to '2024-05-01 10:00:00+00' by the SQL
    dt = pg_timestamp_to_datetime(767_872_800_000_000)
    assert dt == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert dt.tzinfo is UTC


def test_timestamp_round_trip() -> None:
    assert pg_timestamp_to_datetime(0) == datetime(2000, 1, 1, tzinfo=UTC)
    assert pg_timestamp_to_datetime(-1) == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    us = 848_543_430_232_448
    assert datetime_to_pg_timestamp(pg_timestamp_to_datetime(us)) == us
    cet = timezone(timedelta(hours=2))
    assert datetime_to_pg_timestamp(datetime(2024, 5, 1, 12, 0, tzinfo=cet)) == 767_872_800_000_000


def test_naive_datetime_rejected() -> None:
    with pytest.raises(ValueError, match="naive"):
        datetime_to_pg_timestamp(datetime(2024, 5, 1))


def test_now() -> None:
    before = datetime_to_pg_timestamp(datetime.now(UTC))
    now = now_pg_timestamp()
    after = datetime_to_pg_timestamp(datetime.now(UTC))
    assert before <= now <= after
