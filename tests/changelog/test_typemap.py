"""codec_for and avro_row_schema: one test per mapping row.

Every text input is what PostgreSQL 15 prints in a session with DateStyle=ISO,
IntervalStyle=iso_8601, TimeZone=UTC, extra_float_digits=3, bytea_output=hex (checked
against a server; tests/catalog/test_types.py repeats the check live).
"""

from __future__ import annotations

import io
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from pg2sink.catalog.types import PgType
from pg2sink.changelog.typemap import (
    PgArray,
    PgText,
    RowColumn,
    ValueCodec,
    avro_name,
    avro_row_schema,
    codec_for,
    nullable,
)
from pg2sink.formats.jsonenc import dumps


def builtin(name: str, *, category: str = "U", delimiter: str = ",") -> PgType:
    return PgType(0, name, "pg_catalog", "b", category, delimiter=delimiter)


def array_of(element: PgType) -> PgType:
    return PgType(0, "_" + element.name, element.namespace, "b", "A", element=element)


def codec(name: str, typmod: int = -1) -> ValueCodec:
    return codec_for(builtin(name), typmod)


def decode(name: str, text: bytes, typmod: int = -1) -> object:
    return codec(name, typmod).decode(text)


# --- the Avro type of each built-in type ---


@pytest.mark.parametrize(
    ("name", "typmod", "avro"),
    [
        ("bool", -1, {"type": "boolean", "pg.type": "bool"}),
        ("int2", -1, {"type": "int", "pg.type": "int2"}),
        ("int4", -1, {"type": "int", "pg.type": "int4"}),
        ("int8", -1, {"type": "long", "pg.type": "int8"}),
        ("oid", -1, {"type": "long", "pg.type": "oid"}),
        ("xid", -1, {"type": "long", "pg.type": "xid"}),
        ("cid", -1, {"type": "long", "pg.type": "cid"}),
        ("xid8", -1, {"type": "string", "pg.type": "xid8"}),
        ("float4", -1, {"type": "float", "pg.type": "float4"}),
        ("float8", -1, {"type": "double", "pg.type": "float8"}),
        ("numeric", -1, {"type": "string", "pg.type": "numeric"}),
        (
            "numeric",
            655366,  # numeric(10,2)
            {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": 10,
                "scale": 2,
                "pg.type": "numeric(10,2)",
            },
        ),
        (
            "numeric",
            329730,  # numeric(5,-2): integers rounded to hundreds, up to 7 digits
            {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": 7,
                "scale": 0,
                "pg.type": "numeric(5,-2)",
            },
        ),
        (
            "numeric",
            196617,  # numeric(3,5): below 0.01, five decimals
            {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": 5,
                "scale": 5,
                "pg.type": "numeric(3,5)",
            },
        ),
        (
            "numeric",
            65536004,  # numeric(1000,0)
            {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": 1000,
                "scale": 0,
                "pg.type": "numeric(1000,0)",
            },
        ),
        ("money", -1, {"type": "string", "pg.type": "money"}),
        ("text", -1, {"type": "string", "pg.type": "text"}),
        ("varchar", -1, {"type": "string", "pg.type": "varchar"}),
        ("varchar", 24, {"type": "string", "pg.type": "varchar(20)"}),
        ("bpchar", -1, {"type": "string", "pg.type": "bpchar"}),
        ("bpchar", 9, {"type": "string", "pg.type": "bpchar(5)"}),
        ("name", -1, {"type": "string", "pg.type": "name"}),
        ("bytea", -1, {"type": "bytes", "pg.type": "bytea"}),
        ("uuid", -1, {"type": "string", "logicalType": "uuid", "pg.type": "uuid"}),
        ("date", -1, {"type": "int", "logicalType": "date", "pg.type": "date"}),
        ("time", -1, {"type": "long", "logicalType": "time-micros", "pg.type": "time"}),
        ("time", 3, {"type": "long", "logicalType": "time-micros", "pg.type": "time(3)"}),
        (
            "timestamp",
            -1,
            {"type": "long", "logicalType": "local-timestamp-micros", "pg.type": "timestamp"},
        ),
        (
            "timestamp",
            0,
            {"type": "long", "logicalType": "local-timestamp-micros", "pg.type": "timestamp(0)"},
        ),
        (
            "timestamptz",
            -1,
            {"type": "long", "logicalType": "timestamp-micros", "pg.type": "timestamptz"},
        ),
        (
            "timestamptz",
            6,
            {"type": "long", "logicalType": "timestamp-micros", "pg.type": "timestamptz(6)"},
        ),
        ("timetz", 2, {"type": "string", "pg.type": "timetz(2)"}),
        ("bit", 4, {"type": "string", "pg.type": "bit(4)"}),
        ("varbit", 8, {"type": "string", "pg.type": "varbit(8)"}),
        ("varbit", -1, {"type": "string", "pg.type": "varbit"}),
        ("interval", -1, {"type": "string", "pg.type": "interval"}),
        # typmods and spellings from format_type() on a PostgreSQL 15 table
        ("interval", 470286339, {"type": "string", "pg.type": "interval day to second(3)"}),
        ("interval", 327679, {"type": "string", "pg.type": "interval year"}),
        ("interval", 2147418114, {"type": "string", "pg.type": "interval(2)"}),
        ("interval", 402718719, {"type": "string", "pg.type": "interval minute to second"}),
        ("interval", 469827583, {"type": "string", "pg.type": "interval hour to second"}),
    ],
)
def test_builtin_avro(name: str, typmod: int, avro: dict[str, Any]) -> None:
    c = codec(name, typmod)
    assert c.avro == avro
    assert c.pg_type == avro["pg.type"]


@pytest.mark.parametrize(
    "name",
    [
        "json",
        "jsonb",
        "xml",
        "inet",
        "cidr",
        "macaddr",
        "macaddr8",
        "tsvector",
        "tsquery",
        "point",
        "line",
        "lseg",
        "box",
        "path",
        "polygon",
        "circle",
        "pg_lsn",
        "int2vector",
        "oidvector",
        "regclass",
        "tid",
        "char",
        "unknown",
        "some_future_type",
    ],
)
def test_other_builtins_are_strings(name: str) -> None:
    c = codec(name)
    assert c.avro == {"type": "string", "pg.type": name}
    assert c.pg_type == name


# --- decoding, with the exact text PostgreSQL prints ---


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("bool", b"t", True),
        ("bool", b"f", False),
        ("int2", b"-32768", -32768),
        ("int4", b"2147483647", 2147483647),
        ("int8", b"123456789012345678", 123456789012345678),
        ("oid", b"4294967295", 4294967295),
        ("xid", b"4294967295", 4294967295),
        ("cid", b"12", 12),
        ("xid8", b"18446744073709551615", "18446744073709551615"),
        ("float4", b"1.1", 1.1),
        ("float4", b"3.4028235e+38", 3.4028235e38),
        ("float4", b"-1e-45", -1e-45),
        ("float8", b"0.1", 0.1),
        ("float8", b"1.7976931348623157e+308", 1.7976931348623157e308),
        ("float8", b"5e-324", 5e-324),
        ("float8", b"-0", -0.0),
        ("numeric", b"123456789012345678901234567890", Decimal("123456789012345678901234567890")),
        ("numeric", b"0.00000001", Decimal("0.00000001")),
        ("numeric", b"-12.5", Decimal("-12.5")),
        ("money", b"$1,234.56", "$1,234.56"),
        ("money", b"-$12.34", "-$12.34"),
        ("text", b"h\xc3\xa9llo", "héllo"),
        ("varchar", b"abc", "abc"),
        ("bpchar", b"abc  ", "abc  "),  # char(5): the padding is part of the value
        ("name", b"abc", "abc"),
        ("bytea", b"\\x0a0b", b"\n\x0b"),
        ("bytea", b"\\x", b""),
        ("bytea", b"\\xdeadbeef", b"\xde\xad\xbe\xef"),
        (
            "uuid",
            b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        ),
        ("date", b"2024-05-01", date(2024, 5, 1)),
        ("date", b"0001-01-01", date(1, 1, 1)),
        ("time", b"10:00:00", time(10)),
        ("time", b"23:59:59.999999", time(23, 59, 59, 999999)),
        ("timestamp", b"2000-02-29 23:59:59.5", datetime(2000, 2, 29, 23, 59, 59, 500000)),
        ("timestamp", b"2024-05-01 10:00:00", datetime(2024, 5, 1, 10)),
        (
            "timestamptz",
            b"2024-05-01 10:00:00.123456+00",
            datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC),
        ),
        (
            "timestamptz",
            b"1999-12-31 23:59:59.999999+00",
            datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        ),
        ("json", b'{"a": [1,2]}', '{"a": [1,2]}'),
        ("jsonb", b'{"a": [1, 2], "b": "\xc3\xa9"}', '{"a": [1, 2], "b": "é"}'),
        ("xml", b"<a>x</a>", "<a>x</a>"),
        ("interval", b"P1Y2M3DT4H5M6.5S", "P1Y2M3DT4H5M6.5S"),
        ("timetz", b"10:00:00.123+05:30", "10:00:00.123+05:30"),
        ("inet", b"192.168.0.1/24", "192.168.0.1/24"),
        ("cidr", b"10.0.0.0/8", "10.0.0.0/8"),
        ("macaddr", b"08:00:2b:01:02:03", "08:00:2b:01:02:03"),
        ("macaddr8", b"08:00:2b:01:02:03:04:05", "08:00:2b:01:02:03:04:05"),
        ("bit", b"1010", "1010"),
        ("tsvector", b"'a' 'cat' 'fat'", "'a' 'cat' 'fat'"),
        ("tsquery", b"'a' & 'b'", "'a' & 'b'"),
        ("point", b"(1,2)", "(1,2)"),
        ("lseg", b"[(0,0),(1,1)]", "[(0,0),(1,1)]"),
        ("circle", b"<(0,0),1>", "<(0,0),1>"),
        ("pg_lsn", b"16/B374D848", "16/B374D848"),
        ("int2vector", b"1 2", "1 2"),
    ],
)
def test_decode(name: str, text: bytes, value: object) -> None:
    decoded = decode(name, text)
    assert decoded == value
    assert type(decoded) is type(value)  # e.g. never a PgText for an ordinary value


def test_numeric_keeps_scale() -> None:
    # '1.50'::numeric(10,2) prints 1.50: the Decimal keeps the exponent the Avro scale needs
    value = decode("numeric", b"1.50", 655366)
    assert isinstance(value, Decimal)
    assert value.as_tuple().exponent == -2
    assert str(decode("numeric", b"0.00120", 196617)) == "0.00120"


def test_float4_values_are_floats_that_print_as_postgresql_does() -> None:
    assert repr(decode("float4", b"1.1")) == "1.1"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("float4", b"NaN"),
        ("float4", b"Infinity"),
        ("float8", b"-Infinity"),
        ("numeric", b"NaN"),
        ("numeric", b"Infinity"),
        ("numeric", b"-Infinity"),
        ("date", b"infinity"),
        ("date", b"-infinity"),
        ("date", b"4713-01-01 BC"),
        ("date", b"0044-03-15 BC"),
        ("date", b"12345-01-01"),
        ("date", b"5874897-12-31"),
        ("timestamp", b"infinity"),
        ("timestamp", b"-infinity"),
        ("timestamp", b"0001-01-01 00:00:00 BC"),
        ("timestamp", b"12345-01-01 10:00:00"),
        ("timestamp", b"294276-12-31 23:59:59.999999"),
        ("timestamptz", b"infinity"),
        ("timestamptz", b"-infinity"),
        ("timestamptz", b"0001-01-01 00:00:00+00 BC"),
        ("timestamptz", b"4714-11-24 00:00:00+00 BC"),
        ("timestamptz", b"12345-01-01 10:00:00+00"),
        ("time", b"24:00:00"),
    ],
)
def test_values_python_cannot_hold_stay_text(name: str, text: bytes) -> None:
    value = decode(name, text)
    assert type(value) is PgText
    assert value == text.decode()


def test_numeric_nan_in_constrained_column() -> None:
    # PostgreSQL allows NaN (not Infinity) in numeric(p,s)
    assert decode("numeric", b"NaN", 655366) == PgText("NaN")


def test_pgtext_repr() -> None:
    assert repr(PgText("NaN")) == "PgText('NaN')"


def test_timestamptz_other_offsets_become_utc() -> None:
    # only if the session TimeZone were not UTC; the value must still be the same instant
    value = decode("timestamptz", b"2024-05-01 12:00:00+02")
    assert value == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert isinstance(value, datetime)
    assert value.tzinfo is UTC
    assert value.utcoffset() == timedelta(0)
    half_hour = decode("timestamptz", b"2024-05-01 12:00:00+05:30")
    assert half_hour == datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=5, minutes=30)))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bool", b"true"),  # bool::text, not boolout
        ("bool", b""),
        ("int4", b"x"),
        ("int8", b"1.5"),
        ("float8", b"abc"),
        ("numeric", b"1,5"),
        ("bytea", b"\\012"),  # bytea_output=escape
        ("bytea", b"\\x0"),
        ("date", b"2024-13-01"),
        ("date", b"05/01/2024"),  # DateStyle=SQL
        ("date", b"12345-13-01"),
        ("date", b"2024-02-30 BC"),
        ("date", b"infinite"),
        ("time", b"25:00:00"),
        ("timestamp", b"2024-05-01 25:00:00"),
        ("timestamptz", b"2024-05-01 10:00:00"),  # no offset
        ("timestamptz", b"Wed May 01 10:00:00 2024 UTC"),  # DateStyle=Postgres
    ],
)
def test_bad_text_raises(name: str, text: bytes) -> None:
    with pytest.raises((ValueError, KeyError, ArithmeticError)):
        decode(name, text)


# --- types that are not built in ---


def test_citext_in_any_schema() -> None:
    citext = PgType(16390, "citext", "extensions", "b", "S")
    c = codec_for(citext, -1)
    assert c.avro == {"type": "string", "pg.type": "extensions.citext"}
    assert c.decode(b"Ab") == "Ab"


def test_builtin_names_only_count_in_pg_catalog() -> None:
    # a user type that happens to be called int4 is not the built-in int4
    impostor = PgType(16400, "int4", "public", "b", "U")
    c = codec_for(impostor, -1)
    assert c.avro == {"type": "string", "pg.type": "public.int4"}
    assert c.decode(b"(x)") == "(x)"


def test_enum_is_a_string_with_qualified_name() -> None:
    mood = PgType(16385, "mood", "public", "e", "E", enum_labels=("sad", "ok", "happy"))
    c = codec_for(mood, -1)
    assert c.avro == {"type": "string", "pg.type": "public.mood"}
    assert c.pg_type == "public.mood"
    assert c.decode(b"happy") == "happy"


def test_quoted_names_in_pg_type() -> None:
    odd = PgType(16385, "My Type", "Sales-Data", "e", "E", enum_labels=("a",))
    assert codec_for(odd, -1).pg_type == '"Sales-Data"."My Type"'


def test_domain_takes_its_base_codec() -> None:
    posint = PgType(16390, "posint", "public", "d", "N", base=builtin("int4"))
    c = codec_for(posint, -1)
    assert c.avro == {"type": "int", "pg.type": "public.posint"}
    assert c.pg_type == "public.posint"
    assert c.decode(b"42") == 42


def test_domain_applies_its_modifier() -> None:
    # CREATE DOMAIN price AS numeric(10,2): typtypmod 655366, the column's atttypmod -1
    price = PgType(16391, "price", "public", "d", "N", base=builtin("numeric"), base_typmod=655366)
    c = codec_for(price, -1)
    assert c.avro == {
        "type": "bytes",
        "logicalType": "decimal",
        "precision": 10,
        "scale": 2,
        "pg.type": "public.price",
    }
    assert c.decode(b"9.99") == Decimal("9.99")


def test_domain_over_domain_and_over_timestamptz() -> None:
    at = PgType(16392, "at", "public", "d", "D", base=builtin("timestamptz"))
    stamp = PgType(16393, "stamp", "public", "d", "D", base=at)
    c = codec_for(stamp, -1)
    assert c.avro["logicalType"] == "timestamp-micros"
    assert c.avro["pg.type"] == "public.stamp"
    assert c.decode(b"infinity") == PgText("infinity")


@pytest.mark.parametrize(
    ("kind", "name", "text"),
    [
        ("c", "pair", b'(1,"a b")'),
        ("r", "floatrange", b"[1.5,2.5)"),
        ("m", "floatmultirange", b"{[1.5,2.5),[3,4)}"),
        ("p", "anything", b"x"),
    ],
)
def test_composite_range_multirange_are_strings(kind: str, name: str, text: bytes) -> None:
    t = PgType(16394, name, "public", kind, "U")
    c = codec_for(t, -1)
    assert c.avro == {"type": "string", "pg.type": "public." + name}
    assert c.decode(text) == text.decode()


def test_builtin_ranges_are_strings() -> None:
    r = PgType(3904, "int4range", "pg_catalog", "r", "R")
    m = PgType(4451, "int4multirange", "pg_catalog", "m", "R")
    assert codec_for(r, -1).decode(b"[1,5)") == "[1,5)"
    assert codec_for(m, -1).avro == {"type": "string", "pg.type": "int4multirange"}
    assert codec_for(m, -1).decode(b"{[1,3),[5,7)}") == "{[1,3),[5,7)}"


# --- arrays ---


def test_int_array() -> None:
    c = codec_for(array_of(builtin("int4")), -1)
    assert c.avro == {
        "type": "array",
        "items": ["null", {"type": "int", "pg.type": "int4"}],
        "pg.type": "int4[]",
    }
    assert c.pg_type == "int4[]"
    assert c.decode(b"{1,2,NULL}") == [1, 2, None]
    assert c.decode(b"{{1,2},{3,4}}") == [[1, 2], [3, 4]]
    assert c.decode(b"{}") == []


def test_arrays_lists_cannot_hold_keep_postgresql_text() -> None:
    c = codec_for(array_of(builtin("int4")), -1)
    # lists have no lower bounds: '[0:1]={1,2}' stays text, in both paths
    for convert in (c.decode, c.to_json):
        value = convert(b"[0:1]={1,2}")
        assert value.__class__ is PgText and value == "[0:1]={1,2}"
        assert convert(b"[1:1][0:1]={{1,2}}") == PgText("[1:1][0:1]={{1,2}}")
    with pytest.raises(ValueError):
        c.decode(b"[0:1]={1,x}")  # still checked
    # several dimensions: nested lists that keep the text (for Avro's one-dimension arrays)
    value = c.decode(b"{{1,2},{3,NULL}}")
    assert value.__class__ is PgArray and value == [[1, 2], [3, None]]
    assert value.text == "{{1,2},{3,NULL}}"
    assert dumps(value) == dumps(c.to_json(b"{{1,2},{3,NULL}}")) == b"[[1,2],[3,null]]"
    assert c.decode(b"{1,2}").__class__ is list


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("float8", b"-0"),
        ("float4", b"-0"),
        ("float8", b"0.1"),
        ("float8", b"NaN"),
        ("float4", b"-Infinity"),
        ("numeric", b"0.00000001"),
        ("numeric", b"NaN"),
        ("bytea", b"\\x00ff"),
        ("_int4", b"[0:1]={1,2}"),
        ("_int4", b"{{1,NULL},{3,4}}"),
        ("_float8", b"{-0,NaN,1.5}"),
        ("_date", b"{infinity,2024-01-01}"),
    ],
)
def test_json_fast_path_writes_what_decode_writes(name: str, text: bytes) -> None:
    t = array_of(builtin(name[1:])) if name.startswith("_") else builtin(name)
    c = codec_for(t, -1)
    assert dumps(c.to_json(text)) == dumps(c.decode(text))


def test_narrower_avro_types_get_a_string_branch() -> None:
    narrower = [
        codec("date"),
        codec("time"),
        codec("timestamp"),
        codec("timestamptz"),
        codec_for(builtin("numeric"), 655366),
        codec_for(array_of(builtin("int4")), -1),
    ]
    for c in narrower:
        assert nullable(c.avro) == ["null", c.avro, "string"], c.pg_type
    for name in ("int8", "float8", "text", "bytea", "uuid", "bool", "numeric", "jsonb"):
        assert nullable(codec(name).avro) == ["null", codec(name).avro], name
    dates = codec_for(array_of(builtin("date")), -1)
    assert dates.avro["items"] == ["null", codec("date").avro, "string"]
    row = avro_row_schema("public", "t", [RowColumn("d", codec("date"), False)])
    assert row["fields"][0]["type"] == ["null", codec("date").avro, "string"]


def test_array_modifier_belongs_to_the_element() -> None:
    # varchar(20)[] and numeric(10,2)[] columns have atttypmod 24 and 655366
    varchars = codec_for(array_of(builtin("varchar")), 24)
    assert varchars.pg_type == "varchar(20)[]"
    assert varchars.avro["items"][1]["pg.type"] == "varchar(20)"
    assert varchars.decode(b'{"a b",NULL,c}') == ["a b", None, "c"]
    numerics = codec_for(array_of(builtin("numeric")), 655366)
    assert numerics.avro["items"][1]["logicalType"] == "decimal"
    assert numerics.decode(b"{12.50,NaN}") == [Decimal("12.50"), PgText("NaN")]


def test_array_element_decoders() -> None:
    tstz = codec_for(array_of(builtin("timestamptz")), -1)
    assert tstz.decode(b'{"2024-01-01 10:00:00+00",NULL,infinity}') == [
        datetime(2024, 1, 1, 10, tzinfo=UTC),
        None,
        PgText("infinity"),
    ]
    assert codec_for(array_of(builtin("bytea")), -1).decode(b'{"\\\\x0a"}') == [b"\n"]
    assert codec_for(array_of(builtin("bool")), -1).decode(b"{t,f}") == [True, False]
    floats = codec_for(array_of(builtin("float8")), -1).decode(b"{NaN,Infinity,1.5}")
    assert floats == [PgText("NaN"), PgText("Infinity"), 1.5]
    jsonb = codec_for(array_of(builtin("jsonb")), -1).decode(b'{"{\\"a\\": 1}"}')
    assert jsonb == ['{"a": 1}']
    assert codec_for(array_of(builtin("date")), -1).decode(b"{2024-01-01}") == [date(2024, 1, 1)]


def test_box_array_uses_box_delimiter() -> None:
    box = builtin("box", category="G", delimiter=";")
    c = codec_for(array_of(box), -1)
    assert c.decode(b"{(1,1),(0,0);(2,2),(1,1)}") == ["(1,1),(0,0)", "(2,2),(1,1)"]


def test_array_of_enum_and_of_domain() -> None:
    mood = PgType(16385, "mood", "public", "e", "E", enum_labels=("sad", "happy"))
    c = codec_for(array_of(mood), -1)
    assert c.pg_type == "public.mood[]"
    assert c.avro["items"] == ["null", {"type": "string", "pg.type": "public.mood"}]
    assert c.decode(b"{sad,happy}") == ["sad", "happy"]
    price = PgType(16391, "price", "public", "d", "N", base=builtin("numeric"), base_typmod=655366)
    prices = codec_for(array_of(price), -1)
    assert prices.avro["items"][1]["precision"] == 10
    assert prices.decode(b"{1.00,NULL}") == [Decimal("1.00"), None]


def test_domain_over_array() -> None:
    ints = PgType(16395, "ints", "public", "d", "A", base=array_of(builtin("int4")))
    c = codec_for(ints, -1)
    assert c.avro["type"] == "array"
    assert c.avro["pg.type"] == "public.ints"
    assert c.decode(b"{1,2}") == [1, 2]


def test_bad_array_raises() -> None:
    with pytest.raises(ValueError):
        codec_for(array_of(builtin("int4")), -1).decode(b"{1,x}")
    with pytest.raises(ValueError):
        codec_for(array_of(builtin("int4")), -1).decode(b"1,2")


def _walk_avro(avro: Any) -> list[dict[str, Any]]:
    """Every non-union Avro type inside `avro`."""
    if isinstance(avro, list):
        return [t for branch in avro for t in _walk_avro(branch)]
    if isinstance(avro, str):
        return []  # "null" in a union
    found = [avro]
    if avro.get("type") == "array":
        found += _walk_avro(avro["items"])
    return found


# --- the row schema ---


def _all_codecs() -> list[RowColumn]:
    mood = PgType(16385, "mood", "public", "e", "E", enum_labels=("a",))
    price = PgType(16391, "price", "public", "d", "N", base=builtin("numeric"), base_typmod=655366)
    types = [
        (builtin("bool"), -1),
        (builtin("int2"), -1),
        (builtin("int4"), -1),
        (builtin("int8"), -1),
        (builtin("oid"), -1),
        (builtin("float4"), -1),
        (builtin("float8"), -1),
        (builtin("numeric"), 655366),
        (builtin("numeric"), 329730),
        (builtin("numeric"), 196617),
        (builtin("numeric"), -1),
        (builtin("money"), -1),
        (builtin("text"), -1),
        (builtin("varchar"), 24),
        (builtin("bytea"), -1),
        (builtin("uuid"), -1),
        (builtin("date"), -1),
        (builtin("time"), -1),
        (builtin("timestamp"), -1),
        (builtin("timestamptz"), -1),
        (builtin("jsonb"), -1),
        (builtin("interval"), 470286339),
        (mood, -1),
        (price, -1),
        (array_of(builtin("int4")), -1),
        (array_of(builtin("numeric")), 655366),
        (array_of(mood), -1),
        (array_of(builtin("timestamptz")), -1),
    ]
    return [
        RowColumn(f"c{i} {t.name}", codec_for(t, typmod), i == 0)
        for i, (t, typmod) in enumerate(types)
    ]


def test_every_avro_type_carries_pg_type() -> None:
    for column in _all_codecs():
        for avro in _walk_avro(column.codec.avro):
            assert isinstance(avro["pg.type"], str), avro


def test_row_schema_shape() -> None:
    columns = [
        RowColumn("id", codec("int8"), True),
        RowColumn("Name", codec("text"), False),
    ]
    assert avro_row_schema("public", "users", columns) == {
        "type": "record",
        "name": "value",
        "namespace": "public.users",
        "fields": [
            {
                "name": "id",
                "type": ["null", {"type": "long", "pg.type": "int8"}],
                "default": None,
                "pg.column": "id",
                "pg.key": True,
            },
            {
                "name": "Name",
                "type": ["null", {"type": "string", "pg.type": "text"}],
                "default": None,
                "pg.column": "Name",
                "pg.key": False,
            },
        ],
        "pg.namespace": "public",
        "pg.table": "users",
        "pg.primary_key": ["id"],
    }


def test_row_schema_key_record_name() -> None:
    columns = [RowColumn("id", codec("int8"), True)]
    assert avro_row_schema("public", "users", columns, name="key")["name"] == "key"


def test_row_schema_sanitises_and_keeps_originals() -> None:
    columns = [
        RowColumn("order id", codec("int4"), True),
        RowColumn("order-id", codec("int4"), True),
        RowColumn("order_id", codec("int4"), False),
        RowColumn("order_id_2", codec("int4"), False),
        RowColumn("1st", codec("int4"), False),
        RowColumn("größe", codec("int4"), False),
        RowColumn("日付", codec("int4"), False),
    ]
    schema = avro_row_schema("My Schema", "2024-sales", columns)
    assert schema["namespace"] == "My_Schema._2024_sales"
    assert schema["pg.namespace"] == "My Schema"
    assert schema["pg.table"] == "2024-sales"
    assert [f["name"] for f in schema["fields"]] == [
        "order_id",
        "order_id_2",
        "order_id_3",
        "order_id_2_2",
        "_1st",
        "gr__e",
        "__",
    ]
    assert [f["pg.column"] for f in schema["fields"]] == [c.name for c in columns]
    assert schema["pg.primary_key"] == ["order id", "order-id"]


@pytest.mark.parametrize(
    ("identifier", "name"),
    [
        ("users", "users"),
        ("Users", "Users"),
        ("_x", "_x"),
        ("a b", "a_b"),
        ("a.b", "a_b"),
        ("9lives", "_9lives"),
        ("", "_"),
        ('"q"', "_q_"),
        ("é", "_"),
        ("٣", "_"),  # a non-ASCII digit is not an Avro name character either
    ],
)
def test_avro_name(identifier: str, name: str) -> None:
    assert avro_name(identifier) == name


def test_row_schema_is_deterministic_and_independent_of_codecs() -> None:
    columns = _all_codecs()
    first = avro_row_schema("public", "t", columns)
    assert first == avro_row_schema("public", "t", columns)
    first["fields"][0]["type"][1]["pg.type"] = "changed"
    assert columns[0].codec.avro["pg.type"] == "bool"
    assert avro_row_schema("public", "t", columns) != first


def test_fastavro_accepts_the_schema() -> None:
    fastavro = pytest.importorskip("fastavro")
    schema = avro_row_schema("public", "every type", _all_codecs())
    parsed = fastavro.parse_schema(schema)
    assert parsed["name"] == "public.every_type.value"


def test_fastavro_writes_decoded_values() -> None:
    """The decoded Python values are what an Avro writer expects for each Avro type."""
    fastavro = pytest.importorskip("fastavro")
    texts: list[bytes | None] = [
        b"t",
        b"-32768",
        b"2147483647",
        b"123456789012345678",
        b"4294967295",
        b"1.5",
        b"0.1",
        b"12345678.90",
        b"12300",
        b"0.00120",
        b"123.456",
        b"$1.00",
        b"h\xc3\xa9",
        b"abc",
        b"\\x0a0b",
        b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        b"2024-05-01",
        b"10:00:00.5",
        b"2024-05-01 10:00:00.123456",
        b"2024-05-01 10:00:00.123456+00",
        b'{"a": 1}',
        b"P1D",
        b"a",
        b"9.99",
        b"{1,NULL}",
        b"{1.50,NULL}",
        b"{a}",
        None,
    ]
    columns = _all_codecs()
    schema = fastavro.parse_schema(avro_row_schema("public", "t", columns))
    record = {
        field["name"]: (None if text is None else column.codec.decode(text))
        for field, column, text in zip(
            avro_row_schema("public", "t", columns)["fields"], columns, texts, strict=True
        )
    }
    # fastavro gives string decimals back as Decimal only for the decimal logical type
    record[avro_name("c10 numeric")] = str(record[avro_name("c10 numeric")])
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema, record)
    buffer.seek(0)
    back = fastavro.schemaless_reader(buffer, schema)
    assert back["c0_bool"] is True
    assert back["c7_numeric"] == Decimal("12345678.90")
    assert back["c8_numeric"] == Decimal("12300")
    assert back["c9_numeric"] == Decimal("0.00120")
    assert back["c14_bytea"] == b"\n\x0b"
    assert back["c16_date"] == date(2024, 5, 1)
    assert back["c17_time"] == time(10, 0, 0, 500000)
    assert back["c18_timestamp"] == datetime(2024, 5, 1, 10, 0, 0, 123456)
    assert back["c19_timestamptz"] == datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
    assert back["c25__numeric"] == [Decimal("1.50"), None]
