"""The Avro writers of a change side by side, in microseconds per record (no server).

Encodes the same changes of bench-stream's table (id int8 primary key, name text,
amount numeric(12,2), at timestamptz, flag bool, doc jsonb) and of an 18-column table
with every Avro type of the mapping, with each writer the package has:

- `reference`: the Python reference, TableEncoder's converters then fastavro
  (`TableEncoder.encode_value` / `encode_key`);
- `compiled`: the exec-compiled row writer, when this checkout still has one
  (`TableEncoder` with `_fast_row`; session 5 measured it and removed it: run this
  file from a worktree of 4c68a15 to see it);
- `c`: the C encoder (formats.avro_native), from the raw pgoutput Insert message to
  the key and value with their wire headers, decoding included.

It also times the value of a DELETE (key columns only), which takes the Python writer
whatever PG2SINK_IMPL says, and the whole Python path of one Insert the way the
Kafka sink runs it without the C encoder: the fast row reader (bytes -> typed dict),
the Modification, then value and key. Each figure is the best of `--repeat` timeit runs
of `--number` records, which a busy machine disturbs least.

    .venv/bin/python bench/avro_writers.py [--number 20000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from pg2sink.catalog.types import PgType
from pg2sink.changelog import _cmodule
from pg2sink.changelog.records import Modification, Operation
from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for
from pg2sink.formats.avro import TableEncoder
from pg2sink.formats.avro_native import NativeRowEncoder
from pg2sink.logical.fastpath import compile_row_reader

T = datetime(2026, 11, 24, 4, 0, 0, 123456, tzinfo=UTC)
HEADER = b"\x00\x00\x00\x00\x2a"


def _type(name: str) -> PgType:
    return PgType(0, name, "pg_catalog", "b", "U")


def _array(element: str) -> PgType:
    return PgType(0, "_" + element, "pg_catalog", "b", "A", element=_type(element))


def _numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


#: (column, type, typmod, key, text PostgreSQL sends)
BENCH = [
    ("id", _type("int8"), -1, True, b"123456"),
    ("name", _type("text"), -1, False, b"name-123456"),
    ("amount", _type("numeric"), _numeric(12, 2), False, b"1234.56"),
    ("at", _type("timestamptz"), -1, False, b"2026-11-24 04:00:00.123456+00"),
    ("flag", _type("bool"), -1, False, b"t"),
    ("doc", _type("jsonb"), -1, False, b'{"k": 123456, "v": "x"}'),
]
WIDE = [
    ("id", _type("int8"), -1, True, b"9000000000"),
    ("i4", _type("int4"), -1, False, b"-2147483648"),
    ("b", _type("bool"), -1, False, b"t"),
    ("f8", _type("float8"), -1, False, b"0.1"),
    ("f4", _type("float4"), -1, False, b"1.5"),
    ("n", _type("numeric"), _numeric(10, 2), False, b"12345678.50"),
    ("nu", _type("numeric"), -1, False, b"0.00000001"),
    ("t", _type("text"), -1, False, b"Zo\xc3\xab"),
    ("by", _type("bytea"), -1, False, b"\\xdeadbeef"),
    ("u", _type("uuid"), -1, False, b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("d", _type("date"), -1, False, b"2024-02-29"),
    ("tm", _type("time"), -1, False, b"10:00:00.5"),
    ("ts", _type("timestamp"), -1, False, b"2024-05-01 10:00:00.123456"),
    ("tstz", _type("timestamptz"), -1, False, b"2024-05-01 10:00:00+00"),
    ("j", _type("jsonb"), -1, False, b'{"a": [1, 2.50]}'),
    ("ai", _array("int4"), -1, False, b"{1,NULL,3}"),
    ("an", _array("numeric"), _numeric(6, 3), False, b"{1.500,-2.250}"),
    ("order id", _type("int4"), -1, True, b"7"),
]


def _insert_message(texts: Sequence[bytes]) -> bytes:
    """A pgoutput Insert of relation 1 whose new tuple holds `texts` (text format)."""
    out = bytearray(b"I" + (1).to_bytes(4, "big") + b"N" + len(texts).to_bytes(2, "big"))
    for text in texts:
        out += b"t" + len(text).to_bytes(4, "big") + text
    return bytes(out)


def _best(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Microseconds per call, best of `repeat` runs of `number` calls."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def bench_table(
    label: str, table: list[tuple[str, PgType, int, bool, bytes]], args: argparse.Namespace
) -> None:
    codecs = [codec_for(t, m) for _, t, m, _, _ in table]
    names = [c for c, *_ in table]
    key = tuple(c for c, _, _, k, _ in table if k)
    columns = [RowColumn(n, codec, n in key) for n, codec in zip(names, codecs, strict=True)]
    row_schema = avro_row_schema("public", label, columns, primary_key=key)
    encoder = TableEncoder("public", label, row_schema, key)
    data = _insert_message([text for *_, text in table])
    reader = compile_row_reader(names, [c.decode for c in codecs])
    row = reader(data)
    assert row is not None, "the fast reader declined the benchmark's row"
    m = Modification(T, 3, 0x16B3F48, 1234567, Operation.INSERT, "public", label, None, row)

    # a DELETE under REPLICA IDENTITY DEFAULT: the key columns only; the C encoder never
    # writes one (it handles an Insert's or Update's new row)
    delete = Modification(
        T, 4, 0x16B3F48, 1234567, Operation.DELETE, "public", label, {c: row[c] for c in key}, None
    )

    n, r = args.number, args.repeat
    figures: dict[str, float] = {}
    compiled = getattr(encoder, "_fast_row", None) is not None
    generic: Callable[[Modification], bytes] | None = getattr(encoder, "_generic_value", None)
    if compiled and generic is not None:
        # this checkout still has the exec-compiled writer: encode_value takes it first
        figures["compiled: value"] = _best(lambda: encoder.encode_value(m, HEADER), n, r)
        figures["reference: value"] = _best(lambda: HEADER + generic(m), n, r)
        figures["compiled: DELETE value"] = _best(
            lambda: encoder.encode_value(delete, HEADER), n, r
        )
        figures["reference: DELETE value"] = _best(lambda: HEADER + generic(delete), n, r)
    else:
        figures["reference: value"] = _best(lambda: encoder.encode_value(m, HEADER), n, r)
        figures["reference: DELETE value"] = _best(
            lambda: encoder.encode_value(delete, HEADER), n, r
        )
    figures["python writer: key"] = _best(lambda: encoder.encode_key(row, HEADER), n, r)

    def python_path() -> tuple[bytes | None, bytes]:
        after = reader(data)
        assert after is not None
        change = Modification(
            T, 3, 0x16B3F48, 1234567, Operation.INSERT, "public", label, None, after
        )
        return encoder.encode_key(after, HEADER), encoder.encode_value(change, HEADER)

    figures["python path: read + record + key + value"] = _best(python_path, n, r)
    native = NativeRowEncoder.build(encoder, HEADER, HEADER)
    if native is not None:
        encode = native.encode
        assert encode(data, T, 3, 0x16B3F48, 1234567, Operation.INSERT) is not None
        figures["c: raw Insert -> key + value"] = _best(
            lambda: encode(data, T, 3, 0x16B3F48, 1234567, Operation.INSERT), n, r
        )
    print(f"{label} ({len(table)} columns), PG2SINK_IMPL={_cmodule.IMPL}:")
    for what, us in figures.items():
        print(f"  {what:<45} {us:8.2f} us/record")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000, help="records per timing run")
    parser.add_argument("--repeat", type=int, default=7, help="timing runs (the best counts)")
    args = parser.parse_args()
    bench_table("bench", BENCH, args)
    bench_table("wide", WIDE, args)


if __name__ == "__main__":
    main()
