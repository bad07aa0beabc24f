"""formats.avro: envelope and key schemas, and typed values written as Avro.

Rows are decoded from PostgreSQL's text form by the real codecs (changelog.typemap), then
encoded and read back with fastavro, as a consumer would.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import fastavro
import orjson
import pytest

from pg2sink.catalog.types import PgType
from pg2sink.changelog.records import Modification, Operation
from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for
from pg2sink.errors import SinkError
from pg2sink.formats.avro import (
    TableEncoder,
    UnrepresentableValueError,
    avro_long,
    avro_string,
    envelope_schema,
    key_schema,
)
from pg2sink.formats.jsonenc import dumps
from pg2sink.logical.messages import UNCHANGED_TOAST

SCHEMAS = Path(__file__).resolve().parent.parent.parent / "schemas"
T = datetime(2026, 11, 21, 2, 40, 21, 811015, tzinfo=UTC)


def builtin(name: str) -> PgType:
    return PgType(0, name, "pg_catalog", "b", "U")


def array_of(element: PgType) -> PgType:
    return PgType(0, "_" + element.name, "pg_catalog", "b", "A", element=element)


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


# (column, type, typmod, is_key)
COLUMNS: list[tuple[str, PgType, int, bool]] = [
    ("id", builtin("int8"), -1, True),
    ("i4", builtin("int4"), -1, False),
    ("b", builtin("bool"), -1, False),
    ("f8", builtin("float8"), -1, False),
    ("f4", builtin("float4"), -1, False),
    ("n", builtin("numeric"), numeric_typmod(10, 2), False),
    ("nu", builtin("numeric"), -1, False),
    ("t", builtin("text"), -1, False),
    ("by", builtin("bytea"), -1, False),
    ("u", builtin("uuid"), -1, False),
    ("d", builtin("date"), -1, False),
    ("tm", builtin("time"), -1, False),
    ("ts", builtin("timestamp"), -1, False),
    ("tstz", builtin("timestamptz"), -1, False),
    ("j", builtin("jsonb"), -1, False),
    ("ai", array_of(builtin("int4")), -1, False),
    ("an", array_of(builtin("numeric")), numeric_typmod(6, 3), False),
    ("order id", builtin("int4"), -1, True),
]

TEXT: dict[str, bytes] = {
    "id": b"9000000000",
    "i4": b"-2147483648",
    "b": b"t",
    "f8": b"0.1",
    "f4": b"1.5",
    "n": b"12345678.50",
    "nu": b"0.00000001",
    "t": "Zoë 🐘".encode(),
    "by": b"\\x00ff",
    "u": b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "d": b"2024-02-29",
    "tm": b"23:59:59.999999",
    "ts": b"2024-05-01 10:00:00.123456",
    "tstz": b"2024-05-01 10:00:00.000001+00",
    "j": b'{"a": [1, 2.5]}',
    "ai": b"{1,NULL,3}",
    "an": b"{1.500,NULL}",
    "order id": b"7",
}


def row_schema() -> dict[str, Any]:
    columns = [RowColumn(n, codec_for(t, m), k) for n, t, m, k in COLUMNS]
    return avro_row_schema("public", "all types", columns)


def decode_row(text: Mapping[str, bytes | None]) -> dict[str, object]:
    codecs = {n: codec_for(t, m) for n, t, m, _ in COLUMNS}
    return {n: None if v is None else codecs[n].decode(v) for n, v in text.items()}


def modification(
    after: dict[str, object] | None,
    before: dict[str, object] | None = None,
    op: Operation = Operation.INSERT,
) -> Modification:
    return Modification(T, 3, 22052544, 726, op, "public", "all types", before, after)


def read(schema: dict[str, Any], body: bytes) -> Any:
    parsed = fastavro.parse_schema(schema, named_schemas={})
    return fastavro.schemaless_reader(io.BytesIO(body), parsed, parsed)


def test_every_common_type_round_trips() -> None:
    encoder = TableEncoder("public", "all types", row_schema())
    body = encoder.encode_value(modification(decode_row(TEXT)))
    got = read(encoder.value, body)
    assert {k: got[k] for k in ("sequence", "lsn", "xid", "operation", "namespace", "name")} == {
        "sequence": 3,
        "lsn": 22052544,
        "xid": 726,
        "operation": "INSERT",
        "namespace": "public",
        "name": "all types",
    }
    assert got["timestamp"] == T
    assert got["before"] is None and got["unchanged_toast"] == []
    assert got["after"] == {
        "id": 9_000_000_000,
        "i4": -2147483648,
        "b": True,
        "f8": 0.1,
        "f4": 1.5,
        "n": Decimal("12345678.50"),
        "nu": "0.00000001",  # an unconstrained numeric is a string with PostgreSQL's digits
        "t": "Zoë 🐘",
        "by": b"\x00\xff",
        "u": UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),  # fastavro reads uuid as UUID
        "d": date(2024, 2, 29),
        "tm": time(23, 59, 59, 999999),
        "ts": datetime(2024, 5, 1, 10, 0, 0, 123456),
        "tstz": datetime(2024, 5, 1, 10, 0, 0, 1, tzinfo=UTC),
        "j": '{"a": [1, 2.5]}',
        "ai": [1, None, 3],
        "an": [Decimal("1.500"), None],
        "order_id": 7,  # the Avro field name; pg.column keeps 'order id'
    }


def test_nulls_and_a_key_only_before_image() -> None:
    encoder = TableEncoder("public", "all types", row_schema())
    nulls = decode_row(dict.fromkeys(TEXT, None))
    got = read(encoder.value, encoder.encode_value(modification(nulls)))
    assert set(got["after"].values()) == {None}
    # DELETE under REPLICA IDENTITY DEFAULT: only the key columns are in `before`
    delete = modification(None, {"id": 1, "order id": 2}, Operation.DELETE)
    got = read(encoder.value, encoder.encode_value(delete))
    assert got["after"] is None and got["operation"] == "DELETE"
    assert got["before"]["id"] == 1 and got["before"]["order_id"] == 2
    assert got["before"]["t"] is None


def test_unchanged_toast_is_null_and_listed() -> None:
    encoder = TableEncoder("public", "all types", row_schema())
    after = decode_row(TEXT)
    after["t"] = UNCHANGED_TOAST
    after["order id"] = UNCHANGED_TOAST
    got = read(encoder.value, encoder.encode_value(modification(after, op=Operation.UPDATE)))
    assert got["after"]["t"] is None and got["after"]["order_id"] is None
    assert got["unchanged_toast"] == ["t", "order_id"]


def test_float_specials_are_ieee_values() -> None:
    encoder = TableEncoder("public", "all types", row_schema())
    row = decode_row({"id": b"1", "f8": b"NaN", "f4": b"-Infinity", "nu": b"NaN"})
    after = read(encoder.value, encoder.encode_value(modification(row)))["after"]
    assert math.isnan(after["f8"]) and after["f4"] == -math.inf
    assert after["nu"] == "NaN"  # unconstrained numeric: a string, so the text itself


@pytest.mark.parametrize(
    ("column", "text"),
    [
        ("n", b"NaN"),
        ("d", b"infinity"),
        ("d", b"-infinity"),
        ("d", b"0044-03-15 BC"),
        ("d", b"12345-01-01"),
        ("ts", b"-infinity"),
        ("ts", b"0044-03-15 10:00:00.5 BC"),
        ("tstz", b"infinity"),
        ("tstz", b"12345-01-01 00:00:00+00"),
        ("tm", b"24:00:00"),
        ("ai", b"{{1,2},{3,NULL}}"),
        ("ai", b"[0:1]={1,2}"),
        ("ai", b"[0:1][1:1]={{1},{2}}"),
    ],
)
def test_values_outside_the_avro_type_are_postgresql_text_in_the_string_branch(
    column: str, text: bytes
) -> None:
    encoder = TableEncoder("public", "all types", row_schema())
    row = decode_row({"id": b"1", column: text})
    body = encoder.encode_value(modification(row))
    assert read(encoder.value, body)["after"][column] == text.decode()
    # the same string JSON writes (to_json is the file sink's path)
    codec = {n: codec_for(t, m) for n, t, m, _ in COLUMNS}[column]
    assert orjson.loads(dumps(codec.to_json(text))) in (
        text.decode(),
        orjson.loads(dumps(row[column])),
    )
    assert orjson.loads(dumps(row[column])) == orjson.loads(dumps(codec.to_json(text)))
    # a consumer tells it apart by the branch: index 2 of ["null", T, "string"]
    field = next(f for f in encoder.value["fields"][7]["type"][1]["fields"] if f["name"] == column)
    assert field["type"][2] == "string"


def test_a_key_outside_the_avro_type_is_text_too() -> None:
    columns = [RowColumn("day", codec_for(builtin("date"), -1), True)]
    encoder = TableEncoder("public", "days", avro_row_schema("public", "days", columns))
    assert encoder.key is not None
    for text, expected in ((b"infinity", "infinity"), (b"2024-02-29", date(2024, 2, 29))):
        row = {"day": columns[0].codec.decode(text)}
        body = encoder.encode_key(row)
        assert body is not None and read(encoder.key, body) == {"day": expected}


def test_array_items_outside_the_avro_type_are_text_items() -> None:
    columns = [
        RowColumn("id", codec_for(builtin("int8"), -1), True),
        RowColumn("ds", codec_for(array_of(builtin("date")), -1), False),
        RowColumn("ns", codec_for(array_of(builtin("numeric")), numeric_typmod(5, 2)), False),
        RowColumn("fs", codec_for(array_of(builtin("float8")), -1), False),
    ]
    row_record = avro_row_schema("public", "arrays", columns)
    encoder = TableEncoder("public", "arrays", row_record)
    row = {
        "id": 1,
        "ds": columns[1].codec.decode(b'{infinity,2024-02-29,NULL,"0001-01-01 BC"}'),
        "ns": columns[2].codec.decode(b"{NaN,1.50}"),
        "fs": columns[3].codec.decode(b"{NaN,-Infinity,-0}"),
    }
    m = Modification(T, 0, 1, 2, Operation.INSERT, "public", "arrays", None, row)
    after = read(encoder.value, encoder.encode_value(m))["after"]
    assert after["ds"] == ["infinity", date(2024, 2, 29), None, "0001-01-01 BC"]
    assert after["ns"] == ["NaN", Decimal("1.50")]
    assert math.isnan(after["fs"][0]) and after["fs"][1] == -math.inf
    assert math.copysign(1.0, after["fs"][2]) == -1.0  # -0 keeps its sign


def test_a_plain_list_of_lists_still_stops_with_a_clear_error() -> None:
    # A PgArray carries PostgreSQL's text; a bare nested list (not from the decoders) has
    # no text to write, so it is an error naming the column, never a null.
    encoder = TableEncoder("public", "all types", row_schema())
    with pytest.raises(UnrepresentableValueError) as e:
        encoder.encode_value(modification({"id": 1, "ai": [[1, 2], [3, 4]]}))
    assert isinstance(e.value, SinkError) and not e.value.retryable
    assert "public.all types" in str(e.value) and "'ai'" in str(e.value)


def test_decimal_is_quantized_to_the_scale_never_rounded() -> None:
    encoder = TableEncoder("public", "all types", row_schema())
    got = read(encoder.value, encoder.encode_value(modification({"id": 1, "n": Decimal("1.5")})))
    assert str(got["after"]["n"]) == "1.50"
    with pytest.raises(UnrepresentableValueError, match="does not fit Avro decimal"):
        encoder.encode_value(modification({"id": 1, "n": Decimal("1.505")}))
    with pytest.raises(UnrepresentableValueError, match="does not fit Avro decimal"):
        encoder.encode_value(modification({"id": 1, "n": Decimal("123456789.00")}))


def test_a_wrong_python_type_is_a_sink_error_not_a_crash() -> None:
    encoder = TableEncoder("public", "all types", row_schema())
    with pytest.raises(SinkError, match=r"cannot encode a change of public\.all types"):
        encoder.encode_value(modification({"id": "not a number"}))


def test_key_schema_is_the_key_columns_record() -> None:
    row = row_schema()
    key_columns = [
        RowColumn(n, codec_for(t, m), True) for n, t, m, k in COLUMNS if k
    ]  # same order as the table: id, then "order id" (the primary key's order here)
    assert key_schema(row) == avro_row_schema("public", "all types", key_columns, name="key")
    encoder = TableEncoder("public", "all types", row)
    assert encoder.key is not None
    body = encoder.encode_key(decode_row(TEXT))
    assert body is not None
    assert read(encoder.key, body) == {"id": 9_000_000_000, "order_id": 7}


def test_a_table_without_key_has_no_key_schema() -> None:
    columns = [RowColumn("v", codec_for(builtin("text"), -1), False)]
    row = avro_row_schema("public", "log", columns)
    encoder = TableEncoder("public", "log", row)
    assert key_schema(row) is None and encoder.key is None
    assert encoder.encode_key({"v": "x"}) is None


def test_envelope_follows_the_published_modification_schema() -> None:
    published = json.loads((SCHEMAS / "modification.avsc").read_text())
    envelope = envelope_schema(row_schema())
    assert [f["name"] for f in envelope["fields"]] == [f["name"] for f in published["fields"]]
    for ours, theirs in zip(envelope["fields"], published["fields"], strict=True):
        if ours["name"] in ("before", "after"):
            continue  # the published schema has a placeholder row record
        assert ours["type"] == theirs["type"], ours["name"]
        assert ours.get("default", "-") == theirs.get("default", "-"), ours["name"]
    assert envelope["fields"][7]["type"][1] == row_schema()
    assert envelope["fields"][8]["type"] == ["null", "public.all_types.value"]
    # two versions of one table and two tables parse side by side
    fastavro.parse_schema(envelope, named_schemas={})
    fastavro.parse_schema(envelope, named_schemas={})


# --- edge values: every varint length, long strings, decimals at their limits --------

_INTS = [0, 1, -1, 63, -64, 64, -65, 8191, -8192, 8192, 2**31 - 1, -(2**31)]
_LONGS = [*_INTS, 2**31, -(2**31) - 1, 2**53 + 1, 2**63 - 1, -(2**63)]
_STRINGS = ["", "a", "Zoë 🐘", "x" * 63, "y" * 64, "é" * 40, "z" * 300, "0\x00nul"]
_DECIMALS = ["0", "0.01", "-0.01", "1.27", "1.28", "-1.28", "-1.29", "12345678.50"]
_DECIMALS += ["-99999999.99", "99999999.99", "327.67", "-327.68", "1"]
# fewer decimals than the scale, exponents, negative zero
_DECIMALS += ["1.5", "-0.00", "0E-7", "1E+3", "9.9E+7", "-12.340000", "0.10"]


def _edge_rows() -> list[dict[str, object]]:
    """Typed rows covering every Avro type of the mapping, edge values, NULLs, TOAST."""
    base = decode_row(TEXT)
    rows: list[dict[str, object]] = [base, dict.fromkeys(base)]
    for i, long in enumerate(_LONGS):
        row = dict(base)
        row["id"] = long
        row["i4"] = _INTS[i % len(_INTS)]
        row["t"] = _STRINGS[i % len(_STRINGS)]
        row["j"] = _STRINGS[(i + 3) % len(_STRINGS)]
        row["n"] = Decimal(_DECIMALS[i % len(_DECIMALS)])
        row["by"] = bytes(range(256))[: (i * 17) % 257]
        row["b"] = i % 2 == 0
        row["f8"] = [0.0, -0.0, 1e308, -1.5, math.inf, -math.inf, math.nan][i % 7]
        row["f4"] = [0.0, 3.5, -2.25, math.inf, math.nan][i % 5]
        row["nu"] = Decimal(["0.00000001", "-12.5", "1E+3", "NaN", "Infinity"][i % 5])
        row["d"] = [date(1970, 1, 1), date(1, 1, 1), date(9999, 12, 31), date(1969, 12, 31)][i % 4]
        row["tm"] = [time(0), time(23, 59, 59, 999999), time(0, 0, 0, 1)][i % 3]
        row["ts"] = [
            datetime(1, 1, 1),
            datetime(9999, 12, 31, 23, 59, 59, 999999),
            datetime(1969, 12, 31, 23, 59, 59, 999999),
        ][i % 3]
        row["tstz"] = [
            datetime(1960, 1, 1, tzinfo=UTC),
            T,
            datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        ][i % 4]
        row["ai"] = [[], [None], [1, None, -(2**31)], list(range(100))][i % 4]
        row["an"] = [[], [Decimal("1.500"), None, Decimal("-999.999")]][i % 2]
        rows.append(row)
    toast = dict(base)
    toast["t"] = toast["j"] = toast["ai"] = UNCHANGED_TOAST
    rows.append(toast)
    return rows


def test_edge_values_read_back() -> None:
    """Edge rows of every Avro type of the mapping, in every operation's envelope, read
    back by fastavro as a consumer reads them."""
    encoder = TableEncoder("public", "all types", row_schema())
    assert encoder.key is not None
    for i, row in enumerate(_edge_rows()):
        for m in (
            modification(row, op=Operation.INSERT),
            modification(row, dict(row), Operation.UPDATE),
            modification(None, row, Operation.DELETE),
            modification(None, None, Operation.TRUNCATE),
        ):
            m.sequence, m.lsn, m.xid = i * 7, _LONGS[i % len(_LONGS)] & (2**63 - 1), i * 1000
            body = encoder.encode_value(m, b"\x00\x00\x00\x00\x07")
            assert body[:5] == b"\0\0\0\0\7"
            record = read(encoder.value, body[5:])
            assert (record["sequence"], record["lsn"], record["xid"]) == (m.sequence, m.lsn, m.xid)
            image = record["after"] if m.after is not None else record["before"]
            if image is None:
                continue
            for column in ("id", "i4", "t", "j", "by", "b"):
                value = row[column]
                assert image[column] == (None if value is UNCHANGED_TOAST else value), column
            toast = [c for c in ("t", "j", "ai") if row[c] is UNCHANGED_TOAST]
            assert record["unchanged_toast"] == (toast if m.after is not None else [])
        key = encoder.encode_key(row, b"H")
        assert key is not None and key[:1] == b"H"
        assert read(encoder.key, key[1:]) == {"id": row["id"], "order_id": row["order id"]}


def test_values_out_of_range_are_sink_errors() -> None:
    encoder = TableEncoder("public", "all types", row_schema())
    # out of range for Avro long / int, or not of the field's type
    for column, value in (
        ("id", 2**63),
        ("id", -(2**63) - 1),
        ("i4", 2**31),
        ("b", 1),
        ("id", True),
    ):
        with pytest.raises(SinkError, match=r"public\.all types"):
            encoder.encode_value(modification({"id": 1, column: value}))
    # values the converters turn into the field's type
    row: dict[str, object] = {"id": 1, "f8": "1.5", "t": Decimal("2.50"), "i4": 3}
    after = read(encoder.value, encoder.encode_value(modification(row)))["after"]
    assert (after["f8"], after["t"], after["i4"]) == (1.5, "2.50", 3)


def test_decimals_are_fastavros_own_decimal_bytes() -> None:
    """The converter's unscaled two's-complement bytes against fastavro's logical-type
    writer, and what it refuses is the error saying why."""
    columns = [
        RowColumn("n", codec_for(builtin("numeric"), numeric_typmod(12, 2)), False),
        RowColumn("z", codec_for(builtin("numeric"), numeric_typmod(18, 0)), False),
    ]
    record = avro_row_schema("public", "dec", columns)
    encoder = TableEncoder("public", "dec", record)
    parsed = fastavro.parse_schema(record, named_schemas={})
    values = [*_DECIMALS, "9999999999.99", "-9999999999.99", "0.5E+1", "-1E+1"]
    for text in values:
        row: dict[str, object] = {"n": Decimal(text), "z": Decimal(text).quantize(Decimal(1))}
        m = Modification(T, 0, 1, 2, Operation.INSERT, "public", "dec", None, row)
        # fastavro wants exactly the scale's digits: the same number, as PostgreSQL sends it
        same = {"n": Decimal(text).quantize(Decimal("0.01")), "z": row["z"]}
        expected = io.BytesIO()
        fastavro.schemaless_writer(expected, parsed, same)
        # the row is the envelope's `after`, after its union branch, before the tail
        assert expected.getvalue() + b"\x00\x00" in encoder.encode_value(m), text
    for bad in ("1.505", "10000000000.00", "-10000000000", "1E+10"):
        with pytest.raises(UnrepresentableValueError, match="does not fit Avro decimal"):
            encoder.encode_value(
                Modification(
                    T, 0, 1, 2, Operation.INSERT, "public", "dec", None, {"n": Decimal(bad)}
                )
            )


def test_avro_long_and_string_are_fastavros() -> None:
    """The hand-written long and string the C encoder is given: every varint length,
    both signs; strings around the one-byte length."""
    values = {0, -1, 2**63 - 1, -(2**63)}
    for bits in range(63):
        for base in (
            1 << bits,
            (1 << bits) - 1,
            (1 << bits) + 1,
            0x2AAAAAAAAAAAAAAA >> (62 - bits),
        ):
            values |= {base, -base}
    long_schema = fastavro.parse_schema("long")
    for n in sorted(values):
        expected = io.BytesIO()
        fastavro.schemaless_writer(expected, long_schema, n)
        assert avro_long(n) == expected.getvalue(), n
    string_schema = fastavro.parse_schema("string")
    for text in _STRINGS:
        expected = io.BytesIO()
        fastavro.schemaless_writer(expected, string_schema, text)
        assert avro_string(text) == expected.getvalue(), text
