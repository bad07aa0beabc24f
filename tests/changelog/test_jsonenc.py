"""dumps: every decoded value kind, as the module docstring's table says."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest

from pg2sink.changelog.typemap import PgText
from pg2sink.formats.jsonenc import dumps, loads
from pg2sink.logical.messages import UNCHANGED_TOAST, UnchangedToast


@pytest.mark.parametrize(
    ("value", "json"),
    [
        (None, b"null"),
        (True, b"true"),
        (False, b"false"),
        (-32768, b"-32768"),
        (123456789012345678, b"123456789012345678"),
        (4294967295, b"4294967295"),
        (1.1, b"1.1"),
        (0.1, b"0.1"),
        (-0.0, b"-0.0"),
        (1e300, b"1e+300"),
        (5e-324, b"5e-324"),
        (Decimal("1.50"), b"1.50"),
        (Decimal("12345678.90"), b"12345678.90"),
        (Decimal("0.00000001"), b"0.00000001"),
        (Decimal("123456789012345678901234567890"), b"123456789012345678901234567890"),
        (Decimal("-12.5"), b"-12.5"),
        (Decimal("0.0"), b"0.0"),
        (Decimal("12300"), b"12300"),
        (PgText("NaN"), b'"NaN"'),
        (PgText("Infinity"), b'"Infinity"'),
        (PgText("-Infinity"), b'"-Infinity"'),
        (PgText("infinity"), b'"infinity"'),
        (PgText("-infinity"), b'"-infinity"'),
        (PgText("0044-03-15 BC"), b'"0044-03-15 BC"'),
        (PgText("12345-01-01 10:00:00+00"), b'"12345-01-01 10:00:00+00"'),
        (PgText("24:00:00"), b'"24:00:00"'),
        ("héllo", '"héllo"'.encode()),
        ('{"a": 1}', b'"{\\"a\\": 1}"'),
        ("line\nbreak", b'"line\\nbreak"'),
        (b"\n\x0b", b'"Cgs="'),
        (b"", b'""'),
        (b"\xfb\xff", b'"+/8="'),  # standard alphabet, not URL-safe
        (date(2024, 5, 1), b'"2024-05-01"'),
        (date(1, 1, 1), b'"0001-01-01"'),
        (time(10), b'"10:00:00"'),
        (time(10, 0, 0, 5000), b'"10:00:00.005000"'),
        (datetime(2024, 5, 1, 10), b'"2024-05-01T10:00:00"'),
        (datetime(2024, 5, 1, 10, 0, 0, 123456), b'"2024-05-01T10:00:00.123456"'),
        (datetime(2024, 5, 1, 10, tzinfo=UTC), b'"2024-05-01T10:00:00Z"'),
        (datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC), b'"2024-05-01T10:00:00.123456Z"'),
        ([1, None, 2], b"[1,null,2]"),
        ([[1, 2], [3, None]], b"[[1,2],[3,null]]"),
        ([Decimal("1.50"), PgText("NaN")], b'[1.50,"NaN"]'),
        (UNCHANGED_TOAST, b'{"unchanged_toast":true}'),
    ],
)
def test_value(value: object, json: bytes) -> None:
    assert dumps(value) == json


def test_decimal_specials_never_become_null() -> None:
    assert dumps([Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity")]) == (
        b'["NaN","Infinity","-Infinity"]'
    )


def test_aware_non_utc_keeps_its_offset() -> None:
    # the decoders only produce UTC; anything else is still written correctly
    value = datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    assert dumps(value) == b'"2024-05-01T12:00:00+02:00"'


def test_bytes_round_trip_through_base64() -> None:
    data = bytes(range(256))
    assert base64.b64decode(loads(dumps(data))) == data


def test_record_is_one_line_utf8() -> None:
    record = {
        "operation": "UPDATE",
        "after": {"id": 1, "name": "日本\nlinebreak", "doc": UNCHANGED_TOAST},
    }
    line = dumps(record)
    assert b"\n" not in line
    assert "日本".encode() in line
    assert (
        line
        == (
            '{"operation":"UPDATE","after":{"id":1,"name":"日本\\nlinebreak",'
            '"doc":{"unchanged_toast":true}}}'
        ).encode()
    )


def test_unchanged_toast_marker_instances() -> None:
    assert dumps(UnchangedToast()) == b'{"unchanged_toast":true}'


@dataclass(frozen=True)
class _Record:
    name: str
    after: dict[str, object]


def test_dataclasses_are_objects_of_their_fields() -> None:
    record = _Record("t", {"v": Decimal("1.0"), "t": UNCHANGED_TOAST})
    assert dumps(record) == b'{"name":"t","after":{"v":1.0,"t":{"unchanged_toast":true}}}'


def test_subclasses_of_handled_types() -> None:
    class Money(Decimal):
        pass

    assert dumps(Money("1.25")) == b"1.25"
    assert dumps(bytearray(b"\x01")) == b'"AQ=="'


def test_unknown_type_raises() -> None:
    with pytest.raises(TypeError):
        dumps(object())


def test_loads() -> None:
    line = dumps({"n": Decimal("0.10"), "i": 3, "s": PgText("NaN")})
    assert loads(line) == {"n": 0.1, "i": 3, "s": "NaN"}
    exact = loads(line, exact_numbers=True)
    assert exact == {"n": Decimal("0.10"), "i": 3, "s": "NaN"}
    assert str(exact["n"]) == "0.10"
    assert loads(line.decode()) == loads(line)
