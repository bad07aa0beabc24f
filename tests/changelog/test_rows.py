"""RowDecoder: text values decoded, NULL and unchanged TOAST kept, errors name the column."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from pg2sink.catalog.types import PgType
from pg2sink.changelog.rows import RowDecoder
from pg2sink.changelog.typemap import PgText, RowColumn, codec_for
from pg2sink.errors import DecodeError
from pg2sink.logical.messages import UNCHANGED_TOAST, BinaryValue, UnchangedToast


def _columns() -> list[RowColumn]:
    def column(name: str, typname: str, typmod: int = -1, key: bool = False) -> RowColumn:
        t = PgType(0, typname, "pg_catalog", "b", "U")
        return RowColumn(name, codec_for(t, typmod), key)

    return [
        column("id", "int8", key=True),
        column("name", "text"),
        column("amount", "numeric", 655366),
        column("at", "timestamptz"),
        column("ok", "bool"),
        column("doc", "jsonb"),
    ]


ROW = (
    b"42",
    b"h\xc3\xa9",
    b"12.50",
    b"2024-05-01 10:00:00.123456+00",
    b"t",
    b'{"a": 1}',
)


def test_decodes_in_column_order() -> None:
    decoded = RowDecoder.for_columns(_columns()).decode(ROW)
    assert decoded == {
        "id": 42,
        "name": "hé",
        "amount": Decimal("12.50"),
        "at": datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC),
        "ok": True,
        "doc": '{"a": 1}',
    }
    assert list(decoded) == ["id", "name", "amount", "at", "ok", "doc"]


def test_plain_constructor() -> None:
    decoder = RowDecoder(["a", "b"], [int, bytes.decode])
    assert decoder.names == ("a", "b")
    assert decoder.decode([b"1", b"x"]) == {"a": 1, "b": "x"}


def test_null_stays_none() -> None:
    decoded = RowDecoder.for_columns(_columns()).decode([b"1", None, None, None, None, None])
    assert decoded == {"id": 1, "name": None, "amount": None, "at": None, "ok": None, "doc": None}


def test_unchanged_toast_is_kept() -> None:
    decoded = RowDecoder.for_columns(_columns()).decode(
        [b"1", UNCHANGED_TOAST, b"1.00", None, b"f", UNCHANGED_TOAST]
    )
    assert decoded["name"] is UNCHANGED_TOAST
    assert decoded["doc"] is UNCHANGED_TOAST
    assert decoded["ok"] is False
    # another instance (e.g. after unpickling elsewhere) passes too
    other = UnchangedToast()
    assert RowDecoder(["a"], [int]).decode([other])["a"] is other


def test_special_values_pass_through() -> None:
    decoded = RowDecoder.for_columns(_columns()).decode(
        [b"1", b"", b"NaN", b"infinity", b"t", b"null"]
    )
    assert decoded["name"] == ""
    assert decoded["amount"] == PgText("NaN")
    assert decoded["at"] == PgText("infinity")
    assert decoded["doc"] == "null"  # the jsonb null, a value, not SQL NULL


def test_bad_value_names_column_and_type() -> None:
    decoder = RowDecoder.for_columns(_columns())
    with pytest.raises(DecodeError, match=r"column 'at' of type timestamptz: .*b'yesterday'") as e:
        decoder.decode([b"1", b"x", b"1.00", b"yesterday", b"t", b"{}"])
    assert isinstance(e.value.__cause__, ValueError)


def test_bad_value_without_type_names() -> None:
    with pytest.raises(DecodeError, match=r"column 'b': cannot decode b'x'"):
        RowDecoder(["a", "b"], [int, int]).decode([b"1", b"x"])


def test_bool_error_is_decode_error() -> None:
    with pytest.raises(DecodeError, match=r"column 'ok' of type bool"):
        RowDecoder.for_columns(_columns()).decode([b"1", b"x", b"1", None, b"true", None])


def test_long_bad_value_is_shortened() -> None:
    with pytest.raises(DecodeError, match=r"\.\.\. \(100 bytes\)"):
        RowDecoder(["a"], [int]).decode([b"x" * 100])


def test_binary_value_is_rejected() -> None:
    with pytest.raises(DecodeError, match=r"column 'name' of type text: unexpected BinaryValue"):
        RowDecoder.for_columns(_columns()).decode(
            [b"1", BinaryValue(b"abc"), None, None, None, None]
        )


@pytest.mark.parametrize("value", ["text as str", 12, bytearray(b"1"), memoryview(b"1")])
def test_other_value_kinds_are_rejected(value: object) -> None:
    with pytest.raises(DecodeError, match=r"column 'a'"):
        RowDecoder(["a"], [int]).decode([value])


def test_wrong_number_of_values() -> None:
    with pytest.raises(DecodeError, match="tuple has 2 values but the relation has 6 columns"):
        RowDecoder.for_columns(_columns()).decode([b"1", b"2"])


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="decoders"):
        RowDecoder(["a", "b"], [int])
    with pytest.raises(ValueError, match="type names"):
        RowDecoder(["a"], [int], pg_types=[])
    with pytest.raises(ValueError, match="duplicate"):
        RowDecoder(["a", "a"], [int, int])


def test_empty_relation() -> None:
    assert RowDecoder([], []).decode(()) == {}
