"""TypeCache against a real PostgreSQL, and the type mapping against the server's own text.

The last test prints values the way a pg2sink walsender session does (same settings) and
decodes them with `codec_for(TypeCache.get(oid), typmod)`: the unit tests in
tests/changelog/test_typemap.py assume those exact texts.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from pg2sink.catalog.types import PgType, TypeCache
from pg2sink.changelog.typemap import PgArray, PgText, codec_for

# The settings pg2sink gives its walsender session.
WALSENDER_SETTINGS = {
    "DateStyle": "ISO",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}


def _oid(conn: psycopg.Connection[Any], regtype: str) -> int:
    row = conn.execute("SELECT %s::regtype::oid", (regtype,)).fetchone()
    assert row is not None
    return int(row[0])


def _get(cache: TypeCache, oid: int) -> PgType:
    t = cache.get(oid)
    assert t is not None
    return t


def test_builtin(pg_conn: psycopg.Connection[Any]) -> None:
    int4 = _get(TypeCache(pg_conn), 23)
    assert int4 == PgType(23, "int4", "pg_catalog", "b", "N", delimiter=",")
    assert int4.display_name == "int4"


def test_array(pg_conn: psycopg.Connection[Any]) -> None:
    cache = TypeCache(pg_conn)
    ints = _get(cache, 1007)
    assert (ints.name, ints.category, ints.display_name) == ("_int4", "A", "int4[]")
    assert ints.element is not None
    assert ints.element.name == "int4"
    assert ints.element is cache.get(23)  # resolved through the cache


def test_types_with_typelem_that_are_not_arrays(pg_conn: psycopg.Connection[Any]) -> None:
    cache = TypeCache(pg_conn)
    for name in ("int2vector", "oidvector", "name", "point", "box"):
        t = _get(cache, _oid(pg_conn, name))
        assert t.element is None, name
        assert t.display_name == name


def test_box_delimiter(pg_conn: psycopg.Connection[Any]) -> None:
    cache = TypeCache(pg_conn)
    boxes = _get(cache, _oid(pg_conn, "box[]"))
    assert boxes.element is not None
    assert boxes.element.delimiter == ";"
    assert _get(cache, 23).delimiter == ","


def test_unknown_oid(pg_conn: psycopg.Connection[Any]) -> None:
    assert TypeCache(pg_conn).get(4_000_000_000) is None


def test_enum_and_invalidate(pg_conn: psycopg.Connection[Any]) -> None:
    pg_conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    cache = TypeCache(pg_conn)
    mood = _get(cache, _oid(pg_conn, "mood"))
    assert (mood.kind, mood.namespace, mood.display_name) == ("e", "public", "public.mood")
    assert mood.enum_labels == ("sad", "ok", "happy")
    moods = _get(cache, _oid(pg_conn, "mood[]"))
    assert moods.display_name == "public.mood[]"

    pg_conn.execute("ALTER TYPE mood ADD VALUE 'meh' BEFORE 'ok'")
    assert cache.get(mood.oid) is mood  # cached until told otherwise
    cache.invalidate(mood.oid)
    reloaded = _get(cache, mood.oid)
    assert reloaded.enum_labels == ("sad", "meh", "ok", "happy")  # in sort order
    # the array type referred to the old definition: it was dropped too
    new_moods = _get(cache, moods.oid)
    assert new_moods is not moods
    assert new_moods.element is reloaded


def test_domains(pg_conn: psycopg.Connection[Any]) -> None:
    pg_conn.execute("CREATE DOMAIN price AS numeric(10,2) CHECK (VALUE >= 0)")
    pg_conn.execute("CREATE DOMAIN small_price AS price")
    cache = TypeCache(pg_conn)
    price = _get(cache, _oid(pg_conn, "price"))
    assert (price.kind, price.base_typmod) == ("d", 655366)
    assert price.base is not None
    assert price.base.name == "numeric"
    small = _get(cache, _oid(pg_conn, "small_price"))
    assert small.base is price
    assert _get(cache, 1700).base_typmod == -1
    cache.invalidate(1700)  # numeric: every domain over it goes
    assert cache.get(small.oid) is not small


def test_kinds(pg_conn: psycopg.Connection[Any]) -> None:
    pg_conn.execute("CREATE TYPE pair AS (a int, b text)")
    pg_conn.execute("CREATE TYPE floatrange AS RANGE (subtype = float8)")
    cache = TypeCache(pg_conn)
    assert _get(cache, _oid(pg_conn, "pair")).kind == "c"
    assert _get(cache, _oid(pg_conn, "floatrange")).kind == "r"
    assert _get(cache, _oid(pg_conn, "floatmultirange")).kind == "m"
    assert _get(cache, _oid(pg_conn, "int4range")).display_name == "int4range"


def test_extension_type_and_quoted_names(pg_conn: psycopg.Connection[Any]) -> None:
    pg_conn.execute('CREATE SCHEMA "Sales-Data"')
    pg_conn.execute('CREATE EXTENSION citext SCHEMA "Sales-Data"')
    pg_conn.execute('CREATE TYPE "Sales-Data"."My Type" AS ENUM (\'a\')')
    cache = TypeCache(pg_conn)
    citext = _get(cache, _oid(pg_conn, '"Sales-Data".citext'))
    assert (citext.name, citext.namespace) == ("citext", "Sales-Data")
    assert citext.display_name == '"Sales-Data".citext'
    assert codec_for(citext, -1).avro == {"type": "string", "pg.type": '"Sales-Data".citext'}
    odd = _get(cache, _oid(pg_conn, '"Sales-Data"."My Type"'))
    assert odd.display_name == '"Sales-Data"."My Type"'


def test_cached_lookups_do_not_query(pg_conn: psycopg.Connection[Any]) -> None:
    cache = TypeCache(pg_conn)
    ints = cache.get(1007)
    pg_conn.close()
    assert cache.get(1007) is ints
    assert cache.get(23) is not None


def test_non_autocommit_connection_is_left_idle(pg_conn: psycopg.Connection[Any]) -> None:
    pg_conn.autocommit = False
    TypeCache(pg_conn).get(23)
    assert pg_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


# (SQL expression, the decoded value); every text comes from the server itself.
LIVE_CASES: list[tuple[str, object]] = [
    ("true", True),
    ("false", False),
    ("'-32768'::int2", -32768),
    ("2147483647", 2147483647),
    ("'123456789012345678'::int8", 123456789012345678),
    ("'4294967295'::oid", 4294967295),
    ("'4294967295'::xid", 4294967295),
    ("'18446744073709551615'::xid8", "18446744073709551615"),
    ("'1.1'::float4", 1.1),
    ("'3.4028235e38'::float4", 3.4028235e38),
    ("'0.1'::float8", 0.1),
    ("'5e-324'::float8", 5e-324),
    ("'NaN'::float8", PgText("NaN")),
    ("'Infinity'::float4", PgText("Infinity")),
    ("'-Infinity'::float8", PgText("-Infinity")),
    ("'1.50'::numeric(10,2)", Decimal("1.50")),
    ("'12345.678'::numeric(5,-2)", Decimal("12300")),
    ("'0.0012'::numeric(3,5)", Decimal("0.00120")),
    ("'NaN'::numeric(10,2)", PgText("NaN")),
    ("'1e-8'::numeric", Decimal("0.00000001")),
    ("'Infinity'::numeric", PgText("Infinity")),
    ("'-Infinity'::numeric", PgText("-Infinity")),
    ("'héllo'::text", "héllo"),
    ("'abc'::char(5)", "abc  "),
    ("'abc'::varchar(20)", "abc"),
    ("'abc'::name", "abc"),
    ("'\\x0a0b'::bytea", b"\n\x0b"),
    ("''::bytea", b""),
    ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("'2024-05-01'::date", date(2024, 5, 1)),
    ("'infinity'::date", PgText("infinity")),
    ("'-infinity'::date", PgText("-infinity")),
    ("'4713-01-01 BC'::date", PgText("4713-01-01 BC")),
    ("'12345-01-01'::date", PgText("12345-01-01")),
    ("'10:00'::time", time(10)),
    ("'23:59:59.999999'::time(6)", time(23, 59, 59, 999999)),
    ("'24:00:00'::time", PgText("24:00:00")),
    ("'2000-02-29 23:59:59.5'::timestamp(3)", datetime(2000, 2, 29, 23, 59, 59, 500000)),
    ("'-infinity'::timestamp", PgText("-infinity")),
    ("'0001-01-01 00:00:00 BC'::timestamp", PgText("0001-01-01 00:00:00 BC")),
    (
        "'2024-05-01 10:00:00.123456+00'::timestamptz",
        datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC),
    ),
    ("'2024-05-01 12:00:00+02'::timestamptz", datetime(2024, 5, 1, 10, tzinfo=UTC)),
    ("'infinity'::timestamptz", PgText("infinity")),
    ("'0001-01-01 00:00:00 BC'::timestamptz", PgText("0001-01-01 00:00:00+00 BC")),
    ("'12345-01-01 10:00'::timestamptz", PgText("12345-01-01 10:00:00+00")),
    ("'10:00+02'::timetz", "10:00:00+02"),
    ("'1 day 2 hours'::interval", "P1DT2H"),
    ("'{\"a\": 1}'::jsonb", '{"a": 1}'),
    ("'{\"a\":1}'::json", '{"a":1}'),
    ("'192.168.0.1/24'::inet", "192.168.0.1/24"),
    ("'1010'::bit(4)", "1010"),
    ("'16/B374D848'::pg_lsn", "16/B374D848"),
    ("'1 2'::int2vector", "1 2"),
    ("'[1,5)'::int4range", "[1,5)"),
    ("'{[1,3), [5,7)}'::int4multirange", "{[1,3),[5,7)}"),
    ("'happy'::mood", "happy"),
    ("'9.99'::price", Decimal("9.99")),
    ("row(1, 'a b')::pair", '(1,"a b")'),
    ("'Ab'::citext", "Ab"),
    ("'{1,2,NULL}'::int[]", [1, 2, None]),
    # nested lists that keep PostgreSQL's text (Avro has one dimension: docs/types.md)
    ("'{{1,2},{3,4}}'::int[]", PgArray([[1, 2], [3, 4]], "{{1,2},{3,4}}")),
    # other lower bounds have no list form that keeps them: the text itself
    ("'[0:1]={1,2}'::int[]", PgText("[0:1]={1,2}")),
    ("'{}'::int[]", []),
    (
        "array['a b', 'c\"d', 'NULL', 'x\\y', '', 'a,b', '{', E'\\t', 'é']",
        ["a b", 'c"d', "NULL", "x\\y", "", "a,b", "{", "\t", "é"],
    ),
    ("array['abc'::char(5)]", ["abc  "]),
    ("'{1.5,NaN}'::numeric(10,2)[]", [Decimal("1.50"), PgText("NaN")]),
    (
        "array['2024-01-01 10:00:00+00'::timestamptz, null, 'infinity']",
        [datetime(2024, 1, 1, 10, tzinfo=UTC), None, PgText("infinity")],
    ),
    ("array['\\x0a'::bytea]", [b"\n"]),
    ("array[true, false]", [True, False]),
    ("array['{\"a\":1}'::jsonb]", ['{"a": 1}']),
    ("array[box '((1,1),(0,0))', box '((2,2),(1,1))']", ["(1,1),(0,0)", "(2,2),(1,1)"]),
    ("array['sad', 'happy']::mood[]", ["sad", "happy"]),
    ("array[row(1, 'a b')::pair]", ['(1,"a b")']),
    ("array['9.99'::price]", [Decimal("9.99")]),
]


def test_server_text_decodes(pg_conn: psycopg.Connection[Any]) -> None:
    pg_conn.execute("CREATE EXTENSION citext")
    pg_conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    pg_conn.execute("CREATE DOMAIN price AS numeric(10,2)")
    pg_conn.execute("CREATE TYPE pair AS (a int, b text)")
    for name, value in WALSENDER_SETTINGS.items():
        pg_conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    cache = TypeCache(pg_conn)
    failures = []
    for expression, expected in LIVE_CASES:
        # libpq directly: the text exactly as the server sent it, with the type and typmod
        result = pg_conn.pgconn.exec_(f"SELECT {expression}".encode())
        assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
        text = result.get_value(0, 0)
        assert text is not None
        t = _get(cache, result.ftype(0))
        decoded = codec_for(t, result.fmod(0)).decode(text)
        if decoded != expected or type(decoded) is not type(expected):
            failures.append(f"{expression}: {text!r} decoded to {decoded!r}, not {expected!r}")
    assert not failures, "\n".join(failures)


def test_result_typmods_match_codec_names(pg_conn: psycopg.Connection[Any]) -> None:
    """pg.type spells modifiers as format_type() does (modulo internal type names)."""
    cache = TypeCache(pg_conn)
    expressions = {
        "'1'::numeric(10,2)": "numeric(10,2)",
        "'1'::numeric(5,-2)": "numeric(5,-2)",
        "'x'::varchar(20)": "varchar(20)",
        "'x'::char(5)": "bpchar(5)",
        "'1'::bit(4)": "bit(4)",
        "'10:00'::time(3)": "time(3)",
        "'2024-01-01'::timestamptz(0)": "timestamptz(0)",
        "'1 s'::interval day to second(3)": "interval day to second(3)",
        "'{x}'::varchar(20)[]": "varchar(20)[]",
    }
    for expression, pg_type in expressions.items():
        result = pg_conn.pgconn.exec_(f"SELECT {expression}".encode())
        assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
        t = _get(cache, result.ftype(0))
        assert codec_for(t, result.fmod(0)).pg_type == pg_type, expression


@pytest.mark.parametrize("oid", [16, 20, 25, 1114, 1184, 3802])
def test_display_names_of_common_builtins(pg_conn: psycopg.Connection[Any], oid: int) -> None:
    row = pg_conn.execute("SELECT typname FROM pg_type WHERE oid = %s", (oid,)).fetchone()
    assert row is not None
    assert _get(TypeCache(pg_conn), oid).display_name == row[0]
