"""The fast paths must agree with decode() on every message they accept, and decline the rest
(the row reader in Python and in C alike)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime

import pytest

from pg2sink.changelog import typemap
from pg2sink.changelog.rows import RowDecoder
from pg2sink.errors import DecodeError
from pg2sink.formats.jsonenc import dumps
from pg2sink.logical import fastpath
from pg2sink.logical.decoder import decode
from pg2sink.logical.messages import UNCHANGED_TOAST, Begin, Commit, Insert, Update
from tests.logical import golden

# "c" where PG2SINK_IMPL loaded the C reader (changelog.pgvalues registered it at import)
READERS = ["python", "c"] if fastpath._native is not None else ["python"]


@pytest.fixture(autouse=True, params=READERS)
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on the Python reader, and on the C one (changelog/_rows_native.c) where
    it is loaded: compile_row_reader makes whichever is registered."""
    if request.param == "python":
        monkeypatch.setattr(fastpath, "_native", None)
    return str(request.param)


USERS = ["id", "name", "bio", "m", "big"]
CONVERTERS: list[Callable[[bytes], object]] = [int, bytes.decode, bytes.decode, bytes.decode, len]


def general(data: bytes, names: list[str], converters: list[Callable[[bytes], object]]) -> object:
    msg = decode(data)
    assert isinstance(msg, Insert | Update)
    return RowDecoder(names, converters).decode(msg.new)


@pytest.mark.parametrize(
    "data",
    [golden.INSERT_USERS, golden.UPDATE_NO_OLD],
    ids=["insert", "update-without-old-tuple"],
)
def test_reader_agrees_with_decode(data: bytes) -> None:
    read = fastpath.compile_row_reader(USERS, CONVERTERS)
    row = read(data)
    assert row is not None
    assert row == general(data, USERS, CONVERTERS)
    assert fastpath.RELATION_ID.unpack_from(data, 1)[0] == golden.USERS_OID


def test_unchanged_toast_and_null_pass_through() -> None:
    row = fastpath.compile_row_reader(USERS, CONVERTERS)(golden.UPDATE_NO_OLD)
    assert row is not None
    assert row["big"] is UNCHANGED_TOAST
    assert row["bio"] is None


def test_six_text_columns() -> None:
    names = [f"c{i}" for i in range(1, 7)]
    conv: list[Callable[[bytes], object]] = [bytes.decode] * 6
    row = fastpath.compile_row_reader(names, conv)(golden.INSERT_SIX)
    assert row == general(golden.INSERT_SIX, names, conv)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    assert row == dict(zip(names, words, strict=True))


@pytest.mark.parametrize(
    "data",
    [
        golden.UPDATE_KEY,  # old key tuple first
        golden.UPDATE_OLD,  # old row first
        golden.INSERT_FULL_T_BINARY,  # binary values
        golden.INSERT_USERS[:-1],  # truncated
        golden.INSERT_USERS + b"x",  # trailing byte
        golden.INSERT_FULL_T,  # 2 columns, not 5
    ],
    ids=["update-key", "update-old", "binary", "truncated", "trailing", "column-count"],
)
def test_reader_declines_what_it_does_not_handle(data: bytes) -> None:
    assert fastpath.compile_row_reader(USERS, CONVERTERS)(data) is None


def test_reader_declines_when_a_converter_raises() -> None:
    def refuse(value: bytes) -> object:
        raise ValueError("no")

    assert (
        fastpath.compile_row_reader(USERS, [refuse, *CONVERTERS[1:]])(golden.INSERT_USERS) is None
    )


def test_begin_and_commit_fields_agree_with_decode() -> None:
    begin = decode(golden.BEGIN)
    assert isinstance(begin, Begin)
    assert fastpath.begin_fields(golden.BEGIN) == (begin.final_lsn, begin.commit_time, begin.xid)
    commit = decode(golden.COMMIT)
    assert isinstance(commit, Commit)
    assert fastpath.commit_end_lsn(golden.COMMIT) == commit.end_lsn
    assert fastpath.begin_fields(golden.COMMIT) is None
    assert fastpath.commit_end_lsn(golden.BEGIN) is None
    assert fastpath.begin_fields(golden.BEGIN + b"\x00") is None
    assert fastpath.commit_end_lsn(golden.COMMIT[:-1]) is None


# Text forms as PostgreSQL prints them (DateStyle=ISO, TimeZone=UTC), common and not.
INLINE_SAMPLES: dict[Callable[[bytes], object], list[bytes]] = {
    typemap._json_number: [b"12.50", b"-0.001", b"1e+20", b"0", b"NaN", b"Infinity", b"-Infinity"],
    typemap._json_float: [b"0.1", b"-0", b"1e+20", b"-1.5e-45", b"NaN", b"-Infinity"],
    typemap._decode_timestamptz: [
        b"2024-05-01 10:00:00+00",
        b"2024-05-01 10:00:00.123456+00",
        b"infinity",
        b"-infinity",
        b"0044-03-15 10:00:00+00 BC",
        b"12345-01-01 00:00:00+00",
    ],
    typemap._decode_timestamp: [
        b"2024-05-01 10:00:00",
        b"2024-05-01 10:00:00.5",
        b"infinity",
        b"0044-03-15 10:00:00 BC",
    ],
    typemap._decode_date: [b"2024-02-29", b"infinity", b"-infinity", b"0044-03-15 BC"],
}


def test_every_inline_is_sampled() -> None:
    assert set(fastpath._INLINE) == set(INLINE_SAMPLES)


@pytest.mark.parametrize(
    ("converter", "text"),
    [(c, t) for c, texts in INLINE_SAMPLES.items() for t in texts],
    ids=lambda v: v.decode() if isinstance(v, bytes) else getattr(v, "__name__", "?"),
)
def test_inline_gives_the_converter_result_or_declines(
    converter: Callable[[bytes], object], text: bytes
) -> None:
    read = fastpath.compile_row_reader(["v"], [converter])
    data = b"I\x00\x00\x00\x01N\x00\x01t" + len(text).to_bytes(4, "big") + text
    row = read(data)
    expected = converter(text)
    if row is None:  # declined: only ever for values outside the common case
        assert isinstance(expected, typemap.PgText), f"{text!r} declined but is common"
    else:
        assert type(row["v"]) is type(expected)
        assert dumps(row["v"]) == dumps(expected)  # Fragments have no ==, their JSON does


def test_inline_timestamptz_is_utc() -> None:
    data = b"I\x00\x00\x00\x01N\x00\x01t\x00\x00\x00\x16" + b"2024-05-01 10:00:00+00"
    row = fastpath.compile_row_reader(["at"], [typemap._decode_timestamptz])(data)
    assert row == {"at": datetime(2024, 5, 1, 10, tzinfo=UTC)}
    assert isinstance(row["at"], datetime) and row["at"].tzinfo is UTC
    assert fastpath.compile_row_reader(["d"], [typemap._decode_date])(
        b"I\x00\x00\x00\x01N\x00\x01t\x00\x00\x00\x0a2024-02-29"
    ) == {"d": date(2024, 2, 29)}


@pytest.mark.parametrize(
    "name",
    ['a"b', "it's", "new\nline", "back\\slash", "x'}; import os #", "日本語", ""],
)
def test_any_column_name_is_a_safe_literal(name: str) -> None:
    data = b"I\x00\x00\x00\x01N\x00\x02t\x00\x00\x00\x011t\x00\x00\x00\x012"
    row = fastpath.compile_row_reader([name, "other"], [int, int])(data)
    assert row == {name: 1, "other": 2}


def _insert(*values: bytes | None) -> bytes:
    """An Insert of relation 1 with these text values (None: NULL)."""
    data = b"I" + (1).to_bytes(4, "big") + b"N" + len(values).to_bytes(2, "big")
    for v in values:
        data += b"n" if v is None else b"t" + len(v).to_bytes(4, "big") + v
    return data


BOOL_ROW = ["a", "n", "b"]
BOOL_CONVERTERS: list[Callable[[bytes], object]] = [typemap._decode_bool, int, typemap._decode_bool]


@pytest.mark.parametrize(
    "values",
    [(b"t", b"1", b"f"), (b"f", b"22", b"t"), (None, b"3", None), (b"t", None, b"t")],
)
def test_fixed_bool_texts_agree_with_decode(values: tuple[bytes | None, ...]) -> None:
    data = _insert(*values)
    row = fastpath.compile_row_reader(BOOL_ROW, BOOL_CONVERTERS)(data)
    assert row is not None
    assert row == general(data, BOOL_ROW, BOOL_CONVERTERS)


@pytest.mark.parametrize("values", [(b"x", b"1", b"t"), (b"t", b"1", b"tt"), (b"t", b"1", b"")])
def test_other_bool_texts_go_to_the_converter(values: tuple[bytes | None, ...]) -> None:
    # the converter rejects them: the reader declines, the general path raises
    assert fastpath.compile_row_reader(BOOL_ROW, BOOL_CONVERTERS)(_insert(*values)) is None
    with pytest.raises(DecodeError, match="KeyError"):
        general(_insert(*values), BOOL_ROW, BOOL_CONVERTERS)


def test_fixed_texts_must_have_one_length() -> None:
    with pytest.raises(ValueError, match="one length"):
        fastpath.register_fixed(len, {b"t": 1, b"true": 2})
