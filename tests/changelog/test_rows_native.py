"""changelog/_rows_native.c: the C row reader gives the Python reader's rows, or declines alike.

`fastpath.python_row_reader` is the reference. For every converter the C reader converts
itself (pgvalues.NATIVE_CODES) and some it calls, the value texts come from a real
PostgreSQL printing them in a session with pg2sink's replication settings, common and
special values alike (NaN, infinity, BC, year 10000, -0, 24:00:00...). Both readers read
the same Insert messages; their rows must be equal value for value, with the same types
and the same JSON, and a declined row (None) must be declined by both. Random damage to
the messages (bytes changed, cut, added) must also give the same answer from both.

Skipped under PG2SINK_IMPL=python, where the C module is not loaded (test_impl.py checks
the choice and that the extensions are built here).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime

import pytest
from psycopg import sql

from pg2sink.catalog.server import REPLICATION_SESSION_SETTINGS
from pg2sink.changelog import _cmodule, pgvalues
from pg2sink.formats import jsonenc
from pg2sink.logical import fastpath
from pg2sink.logical.messages import UNCHANGED_TOAST
from tests.conftest import Database

pytestmark = pytest.mark.skipif(
    _cmodule.IMPL != "c", reason="PG2SINK_IMPL=python: the C row reader is not loaded"
)

Converter = Callable[[bytes], object]

# (converter, PostgreSQL type, literals the server prints back as text)
CASES: list[tuple[Converter, str, list[str]]] = [
    (int, "int8", ["0", "-1", "42", "9223372036854775807", "-9223372036854775808"]),
    (int, "int2", ["-32768", "32767", "7"]),
    (pgvalues._decode_text, "text", ["", "a", "日本語", 'q"uote', "tab\tnew\nline", "\\"]),
    (pgvalues._decode_bool, "bool", ["true", "false"]),  # printed by boolout: t, f
    (
        pgvalues._json_number,
        "numeric",
        ["0", "1.50", "-0.00000001", "NaN", "Infinity", "-Infinity", "1e30", "123.456e-10"],
    ),
    (
        pgvalues._json_float,
        "float8",
        ["0", "-0", "1e20", "1.5", "NaN", "Infinity", "-Infinity", "2.2250738585072014e-308"],
    ),
    (pgvalues._json_float, "float4", ["-0", "0.1", "3.4028235e38", "1e-45", "NaN"]),
    (
        pgvalues._decode_date,
        "date",
        [
            "2024-02-29",
            "0001-01-01",
            "9999-12-31",
            "infinity",
            "-infinity",
            "4713-01-01 BC",
            "10000-01-01",
        ],
    ),
    (
        pgvalues._decode_timestamp,
        "timestamp",
        [
            "2024-05-01 10:00:00",
            "2024-05-01 10:00:00.5",
            "2024-05-01 10:00:00.123456",
            "infinity",
            "0044-03-15 10:00:00 BC",
            "12345-01-01 00:00:00",
            "1999-12-31 23:59:59.99",
        ],
    ),
    (
        pgvalues._decode_timestamptz,
        "timestamptz",
        [
            "2024-05-01 10:00:00+00",
            "2024-05-01 10:00:00.000001+02",
            "-infinity",
            "0044-03-15 10:00:00+00 BC",
            "12345-01-01 00:00:00+00",
            "2000-02-29 12:00:00.1+00",
        ],
    ),
    # converters the C reader calls (no code of its own)
    (pgvalues._decode_numeric, "numeric", ["0.10", "NaN", "-12345678901234567890.5"]),
    (pgvalues._decode_float, "float8", ["-0", "Infinity", "0.30000000000000004"]),
    (pgvalues._json_bytea, "bytea", ["\\x", "\\x00ff10"]),
    (pgvalues._decode_time, "time", ["24:00:00", "10:00:00.5", "00:00:00"]),
]


def server_texts(db: Database, pg_type: str, literals: Sequence[str]) -> list[bytes]:
    """What PostgreSQL's output function prints for `literals` as `pg_type` in a
    replication-like session (a cast to text is the output function, but for bool)."""
    with db.connect() as conn:
        for name, value in REPLICATION_SESSION_SETTINGS.items():
            conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        rows = conn.execute(
            sql.SQL("SELECT {} FROM unnest(%s::text[]) v").format(
                sql.SQL("boolout(v::bool)::text" if pg_type == "bool" else f"v::{pg_type}::text")
            ),
            [list(literals)],
        ).fetchall()
    return [row[0].encode() for row in rows]


def insert(*values: object) -> bytes:
    """An Insert of relation 1 with these values (None: NULL, UNCHANGED_TOAST: 'u')."""
    data = b"I" + (1).to_bytes(4, "big") + b"N" + len(values).to_bytes(2, "big")
    for v in values:
        if v is None:
            data += b"n"
        elif v is UNCHANGED_TOAST:
            data += b"u"
        else:
            assert isinstance(v, bytes)
            data += b"t" + len(v).to_bytes(4, "big") + v
    return data


def assert_same(names: Sequence[str], converters: Sequence[Converter], data: bytes) -> object:
    """Both readers' results for `data`, checked equal; returns the row.

    The C reader may decline a row the Python one reads, when a value's text is one that
    PostgreSQL never prints but Python's parser takes (fromisoformat takes any separator
    between date and time): the general path then converts it exactly as the Python
    reader did. It must never read a row the Python reader declines, nor read it otherwise.
    """
    python = fastpath.python_row_reader(names, converters)(data)
    native = pgvalues.native_row_reader(names, converters)(data)
    if native is None:
        return None if python is None else "declined by C only"
    assert python is not None, (data, native)
    assert list(native) == list(python)
    for name in names:
        p, n = python[name], native[name]
        assert type(n) is type(p), (name, data, p, n)
        assert n == p, (name, data, p, n)
        if isinstance(p, datetime):
            assert isinstance(n, datetime) and n.tzinfo is p.tzinfo
    assert jsonenc.dumps(native) == jsonenc.dumps(python)
    return python


@pytest.mark.parametrize(
    ("converter", "pg_type", "literals"),
    CASES,
    ids=[f"{c.__name__}-{t}" for c, t, _ in CASES],
)
def test_each_value_as_the_python_reader(
    db: Database, converter: Converter, pg_type: str, literals: list[str]
) -> None:
    texts = server_texts(db, pg_type, literals)
    accepted = 0
    for text in texts:
        row = assert_same(["v"], [converter], insert(text))
        assert row != "declined by C only", f"{text!r}, a text PostgreSQL prints, declined"
        accepted += row is not None
    # and all of them in one row, between a NULL and an unchanged TOASTed value
    names = ["n", *(f"c{i}" for i in range(len(texts))), "u"]
    row_converters: list[Converter] = [int, *[converter] * len(texts), pgvalues._decode_text]
    assert assert_same(names, row_converters, insert(None, *texts, UNCHANGED_TOAST)) != (
        "declined by C only"
    )
    assert accepted > 0, f"every {pg_type} text declined: the common case must be read"


def test_a_row_of_every_code_and_damaged_copies_of_it(db: Database) -> None:
    converters: list[Converter] = [
        int,
        pgvalues._decode_text,
        pgvalues._json_number,
        pgvalues._decode_timestamptz,
        pgvalues._decode_bool,
        pgvalues._decode_text,
        pgvalues._json_float,
        pgvalues._decode_date,
        pgvalues._decode_timestamp,
        pgvalues._decode_numeric,
    ]
    names = [f"c{i}" for i in range(len(converters))]
    literals = ["42", "alice", "12.50", "2024-05-01 10:00:00.25+00", "t", '{"a": 1}', "0.5"]
    literals += ["2024-02-29", "2024-05-01 10:00:00", "3.14"]
    types = ["int8", "text", "numeric", "timestamptz", "bool", "jsonb", "float8", "date"]
    types += ["timestamp", "numeric"]
    texts = [server_texts(db, t, [v])[0] for t, v in zip(types, literals, strict=True)]
    data = insert(*texts)
    assert assert_same(names, converters, data) is not None
    rng = random.Random(20261124)
    outcomes: Counter[str] = Counter()
    for _ in range(3000):
        damaged = bytearray(data)
        change = rng.randrange(3)
        if change == 0:  # a byte changed
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        elif change == 1:  # cut short
            del damaged[rng.randrange(len(damaged)) :]
        else:  # bytes added
            at = rng.randrange(len(damaged) + 1)
            damaged[at:at] = rng.randbytes(rng.randrange(1, 4))
        row = assert_same(names, converters, bytes(damaged))
        outcomes["declined" if row is None else row if isinstance(row, str) else "read"] += 1
    # both outcomes were exercised, and C declined alone only for a few odd texts
    assert outcomes["read"] > 100 and outcomes["declined"] > 1000, outcomes
    assert outcomes["declined by C only"] < 30, outcomes


def test_a_column_count_or_tag_other_than_the_relations_declines() -> None:
    read = pgvalues.native_row_reader(["a", "b"], [int, int])
    assert read(insert(b"1", b"2")) == {"a": 1, "b": 2}
    assert read(insert(b"1")) is None
    assert read(insert(b"1", b"2", b"3")) is None
    update_with_old = b"U" + (1).to_bytes(4, "big") + b"O" + insert(b"1", b"2")[5:]
    assert read(update_with_old) is None
    with pytest.raises(TypeError):
        read(bytearray(insert(b"1", b"2")))  # type: ignore[arg-type]


def test_json_default_writes_numbers_and_hands_the_rest_to_python() -> None:
    number = pgvalues.JsonNumber(b"-12.50")
    assert jsonenc.default is not jsonenc.python_default
    assert jsonenc.dumps([number, b"\x00\xff", UNCHANGED_TOAST]) == (
        b'[-12.50,"AP8=",{"unchanged_toast":true}]'
    )
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsonenc.dumps(object())
