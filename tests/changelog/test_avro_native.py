"""formats.avro_native: the C encoder gives the Python path's bytes, or declines.

The pgoutput messages come from a real PostgreSQL 15 slot
(pg_logical_slot_get_binary_changes, protocol 1) read in a session with pg2sink's
replication settings, so the value texts are those the stream gets. Each Insert/Update
goes through the real ChangelogBuilder (typed values, Modification) and
TableEncoder.encode_value/encode_key with wire headers: the reference bytes. The C
encoder must give the same (key, value) from the raw message, or None where it declines.

They run where the process runs the C encoder (PG2SINK_IMPL=c, or unset with the
extension built); under PG2SINK_IMPL=python the C module is not loaded and they are
skipped (test_impl.py checks the choice itself, and that the extension is built here).
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import fastavro
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.catalog.catalog import Catalog
from pg2sink.catalog.server import REPLICATION_SESSION_SETTINGS
from pg2sink.changelog import _cmodule
from pg2sink.changelog.builder import ChangelogBuilder
from pg2sink.changelog.records import Modification, Operation, Record, Schema
from pg2sink.formats.avro import TableEncoder, _primitive
from pg2sink.formats.avro_native import NativeRowEncoder
from pg2sink.schema_registry import wire_header
from tests.conftest import Database

KEY_HEADER = wire_header(41)
VALUE_HEADER = wire_header(42)

pytestmark = pytest.mark.skipif(
    _cmodule.IMPL != "c", reason="PG2SINK_IMPL=python: the C encoder is not loaded"
)

# Every type the C encoder handles, in one table; "k" is the key (int8).
TYPES = """
    CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
    CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
    CREATE DOMAIN label AS text;
    CREATE TABLE t (
        k int8 PRIMARY KEY,
        i2 int2, i4 int4, i8 int8, o oid, b bool,
        t text, vc varchar(20), bp bpchar(5), nm name, js json, jb jsonb, u uuid,
        en mood, dp posint, dl label, mo money, x8 xid8, iv interval, nu numeric,
        by bytea, f4 float4, f8 float8,
        n102 numeric(10,2), n180 numeric(18,0), n190 numeric(19,0), n5m2 numeric(5,-2),
        n35 numeric(3,5), n3810 numeric(38,10),
        d date, tm time, tm3 time(3), ts timestamp, tstz timestamptz,
        ai int4[], a8 int8[], ab bool[], af4 float4[], af8 float8[], an numeric(6,3)[],
        ad date[], atm time[], ats timestamp[], atz timestamptz[], adp posint[]
    )
"""

# column -> values (SQL literals) the C encoder writes exactly as the Python path
VALUES: dict[str, list[str]] = {
    "i2": ["0", "-32768", "32767", "1", "-1"],
    "i4": ["0", "-2147483648", "2147483647", "63", "64", "-64", "-65", "8191", "8192"],
    "i8": ["0", "-9223372036854775808", "9223372036854775807", "4294967296", "-1"],
    "o": ["0", "4294967295", "12345"],
    "b": ["true", "false"],
    "t": [
        "''",
        "'plain ascii'",
        "'größe ✓ 😀 日本語'",
        "repeat('x', 63)",
        "repeat('y', 64)",
        "repeat('é', 100)",
        "repeat('z', 8191)",
        "repeat('w', 8192)",
        "E'tab\\tnew\\nline \\\\ quote'' \"'",
    ],
    "vc": ["''", "'varchar ü'", "repeat('v', 20)"],
    "bp": ["'ab'", "'abcde'", "''", "'ñ'"],
    "nm": ["'a_name'", "repeat('n', 63)"],
    "js": ['\'{"a": [1, 2.50, null], "b": "ü"}\'', "'[]'", "'  {\"spaces\" : 1}  '"],
    "jb": ['\'{"a": [1, 2.50, null], "b": "ü"}\'', "'\"str\"'", "'12.5e3'"],
    "u": ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'"],
    "en": ["'sad'", "'happy'"],
    "dp": ["1", "2147483647"],
    "dl": ["'domain text'", "''"],
    "mo": ["'12.50'", "'-1234567.89'"],
    "x8": ["'18446744073709551615'", "'0'"],
    "iv": ["'1 year 2 mons 3 days 04:05:06.789'", "'-1 day'"],
    "nu": [
        "0",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        "0.00000001",
        "-123456789012345678901234567890.123456789",
        "1.50",
        "1e20",
        "100",
    ],
    "by": ["''", "'\\xdeadbeef'", "'\\x00ff'", "decode(repeat('ab', 100), 'hex')"],
    "f4": [
        "0",
        "'-0'",
        "1.5",
        "0.1",
        "3.4028235e38",
        "-3.4028235e38",
        "1e-45",
        "1.17549435e-38",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        "123456.789",
    ],
    "f8": [
        "0",
        "'-0'",
        "0.1",
        "1.7976931348623157e308",
        "-1.7976931348623157e308",
        "5e-324",
        "2.2250738585072014e-308",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        "1e20",
        "123456789.123456789",
        "1e100",
    ],
    "n102": ["0", "12345678.50", "-99999999.99", "99999999.99", "0.01", "-0.01", "1.5", "-128"],
    "n180": ["999999999999999999", "-999999999999999999", "0", "127", "128", "-129", "255"],
    "n190": ["9223372036854775807", "-9223372036854775808", "-9223372036854775807", "1"],
    "n5m2": ["12300", "-9999900", "0"],
    "n35": ["0.00123", "-0.00999", "0"],
    "n3810": ["1.0000000001", "-922337203.6854775808", "922337203.6854775807", "0"],
    "d": [
        "'1970-01-01'",
        "'1969-12-31'",
        "'1970-01-02'",
        "'0001-01-01'",
        "'9999-12-31'",
        "'2000-02-29'",
        "'2024-02-29'",
        "'1900-03-01'",
    ],
    "tm": ["'00:00:00'", "'23:59:59.999999'", "'12:34:56.5'", "'01:02:03.000001'", "'12:00'"],
    "tm3": ["'12:34:56.789'", "'12:34:56.1234'", "'00:00:00.001'"],
    "ts": [
        "'1970-01-01 00:00:00'",
        "'1969-12-31 23:59:59.999999'",
        "'0001-01-01 00:00:00'",
        "'9999-12-31 23:59:59.999999'",
        "'2026-11-21 10:11:12.5'",
        "'1600-02-29 12:00:00.000001'",
    ],
    "tstz": [
        "'1970-01-01 00:00:00+00'",
        "'2026-11-21 10:00:00.123456+05:30'",
        "'2026-11-21 10:00:00-08'",
        "'1969-12-31 23:59:59.999999+00'",
        "'0001-01-01 00:00:00+00'",
        "'9999-12-31 23:59:59.999999+00'",
        "'1900-01-01 00:00:00+01:02:03'",
    ],
    # arrays: empty, NULL elements, many elements (a multi-byte count), each type's bounds
    "ai": [
        "'{}'",
        "'{1,2,3}'",
        "'{NULL,-2147483648,2147483647,NULL}'",
        "ARRAY[NULL]::int4[]",
        "array_fill(7, ARRAY[100])",
    ],
    "a8": ["'{-9223372036854775808,9223372036854775807,0}'"],
    "ab": ["'{t,f,NULL}'", "'{}'"],
    "af4": ["'{NaN,Infinity,-Infinity,-0,0.1,3.4028235e38}'"],
    "af8": ["'{NaN,-0,0.1,1.7976931348623157e308,5e-324}'"],
    "an": ["'{1.5,-999.999,0,NULL}'"],
    "ad": ["'{2020-02-29,0001-01-01,9999-12-31}'"],
    "atm": ["'{00:00:00,23:59:59.999999,12:00:00.5}'"],
    "ats": ["ARRAY['2020-01-01 10:00:00.5', '1969-12-31 23:59:59', NULL]::timestamp[]"],
    "atz": ["ARRAY['2026-11-21 10:00:00.123+05:30', '0001-01-01 00:00:00+00']::timestamptz[]"],
    "adp": ["'{1,2}'"],
}

# column -> values the Python path writes (as the "string" branch or otherwise) and the C
# encoder must decline
DECLINED: dict[str, list[str]] = {
    "n102": ["'NaN'"],
    "n190": ["9999999999999999999", "-9223372036854775809"],
    "n3810": ["922337203.6854775808", "1234567890123456789012345678.1"],
    "d": ["'infinity'", "'-infinity'", "'0044-03-15 BC'", "'12345-01-01'"],
    "tm": ["'24:00:00'"],
    "ts": ["'infinity'", "'-infinity'", "'0044-03-15 10:00:00 BC'", "'10000-01-01 00:00:00'"],
    "tstz": ["'infinity'", "'-infinity'", "'0044-03-15 10:00:00+00 BC'"],
    # several dimensions, a lower bound other than 1, an element the item type cannot hold
    "ai": ["'{{1,2},{3,4}}'", "'[0:1]={1,2}'"],
    "ad": ["'{2020-01-01,infinity}'", "'{0044-03-15 BC}'"],
    "an": ["'{NaN}'"],
    "atm": ["'{24:00:00}'"],
}


@dataclass
class Change:
    """An Insert/Update message and the Modification the Python path made of it."""

    data: bytes
    modification: Modification


def _session(db: Database) -> psycopg.Connection[TupleRow]:
    """A connection rendering values as pg2sink's walsender does (same settings)."""
    options = " ".join(f"-c {k}={v}" for k, v in REPLICATION_SESSION_SETTINGS.items())
    conn = db.connect(options=options)
    conn.execute("SET synchronous_commit = on")  # decoding reads flushed WAL only
    return conn


def _start(conn: psycopg.Connection[TupleRow], db: Database) -> None:
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(db.publication))
    )
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot,))


def _changes(
    conn: psycopg.Connection[TupleRow],
    db: Database,
    builder: ChangelogBuilder | None = None,
    out: list[Record] | None = None,
) -> tuple[list[Schema], list[Change]]:
    """The Schema records and Insert/Update changes in the slot, through the real builder
    (`builder`, emitting to `out`, if given)."""
    rows = conn.execute(
        "SELECT lsn - '0/0', data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL,"
        " 'proto_version', '1', 'publication_names', %s)",
        (db.slot, db.publication),
    ).fetchall()
    if out is None or builder is None:
        out = []
        builder = ChangelogBuilder(Catalog(conn), out.append)
    changes: list[Change] = []
    for lsn, raw in rows:
        data = bytes(raw)
        emitted = len(out)
        builder.feed(data, int(lsn))
        if data[:1] in (b"I", b"U") and len(out) > emitted:
            m = out[-1]
            assert isinstance(m, Modification)
            changes.append(Change(data, m))
    return [r for r in out if isinstance(r, Schema)], changes


def _encoders(schemas: Sequence[Schema]) -> dict[str, tuple[TableEncoder, NativeRowEncoder]]:
    encoders: dict[str, tuple[TableEncoder, NativeRowEncoder]] = {}
    for s in schemas:
        encoder = TableEncoder(s.namespace, s.name, s.schema, s.primary_key)
        native = NativeRowEncoder.build(encoder, KEY_HEADER, VALUE_HEADER)
        assert native is not None, f"no native encoder for {s.name}"
        encoders[s.name] = (encoder, native)
    return encoders


def _python_path(encoder: TableEncoder, m: Modification) -> tuple[bytes | None, bytes]:
    assert m.after is not None
    return encoder.encode_key(m.after, KEY_HEADER), encoder.encode_value(m, VALUE_HEADER)


def _native(native: NativeRowEncoder, change: Change) -> tuple[bytes | None, bytes] | None:
    m = change.modification
    return native.encode(change.data, m.timestamp, m.sequence, m.lsn, m.xid, m.operation)


def _rows(values: dict[str, list[str]]) -> Iterator[dict[str, str]]:
    """Rows covering every value of every column (the other columns cycle through theirs)."""
    longest = max(len(v) for v in values.values())
    for i in range(longest):
        yield {column: vs[i % len(vs)] for column, vs in values.items()}


def _insert(conn: psycopg.Connection[TupleRow], key: int, row: dict[str, str]) -> None:
    columns = ["k", *row]
    literals = [str(key), *row.values()]
    # the values are this file's SQL literals (test data), the names quoted identifiers
    conn.execute(
        sql.SQL("INSERT INTO t ({}) VALUES ({})").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            sql.SQL(", ").join(sql.SQL(v) for v in literals),
        )
    )


def test_the_c_encoder_is_documented() -> None:
    assert _cmodule.ROW_ENCODER is not None
    assert NativeRowEncoder.build.__doc__ and _cmodule.ROW_ENCODER.encode.__doc__


def test_every_supported_value_gives_the_python_paths_bytes(db: Database) -> None:
    conn = _session(db)
    conn.execute(TYPES)
    _start(conn, db)
    key = 0
    for row in _rows(VALUES):
        key += 1
        _insert(conn, key, row)
    # several rows in one transaction, with NULLs in every column but the key
    with conn.transaction():
        for _ in range(3):
            key += 1
            conn.execute("INSERT INTO t (k) VALUES (%s)", (key,))
        conn.execute("UPDATE t SET t = 'updated', b = NULL WHERE k <= 3")
    conn.execute("INSERT INTO t (k) VALUES (-9223372036854775808), (9223372036854775807)")
    schemas, changes = _changes(conn, db)
    ((encoder, native),) = _encoders(schemas).values()
    ops = {c.modification.operation for c in changes}
    assert ops == {Operation.INSERT, Operation.UPDATE}
    assert len(changes) == len(list(_rows(VALUES))) + 3 + 3 + 2
    for change in changes:
        expected = _python_path(encoder, change.modification)
        assert _native(native, change) == expected, change.modification.after
    # and the bytes are the registered schemas' Avro (as a consumer reads them)
    first = _native(native, changes[0])
    assert first is not None and first[0] is not None
    value_schema = fastavro.parse_schema(_primitive(encoder.value), named_schemas={})
    read = fastavro.schemaless_reader(io.BytesIO(first[1][5:]), value_schema, None)
    assert isinstance(read, dict) and read["after"]["k"] == 1 and read["after"]["i2"] == 0


# 3,000 rows of random values over each type's range (seeded: the same rows every run),
# NULLs sprinkled in: a wider net than the hand-picked values above
RANDOM_ROWS = """
    SELECT setseed(0.42);
    INSERT INTO t (k, i2, i4, i8, b, t, vc, by, u, jb, f4, f8, n102, n180, n3810, nu,
                   d, tm, ts, tstz, ai, af8, atz)
    SELECT g,
        (random() * 65535 - 32768)::int2,
        (random() * 4294967295 - 2147483648)::int8::int4,
        ((random() - 0.5) * 1.8e19)::numeric::int8,
        CASE WHEN g % 11 = 0 THEN NULL ELSE random() < 0.5 END,
        repeat(chr(33 + g % 90), g % 7) || repeat(chr(160 + (g * 7919) % 30000), g % 50)
            || repeat(chr(128512 + g % 80), g % 3),
        CASE WHEN g % 13 = 0 THEN NULL ELSE left(md5(g::text), g % 21) END,
        decode(repeat(md5(g::text), g % 5), 'hex'),
        md5(g::text)::uuid,
        jsonb_build_object('g', g, 'r', random(), 's', chr(200 + g % 500)),
        ((random() - 0.5) * 10 ^ (random() * 70 - 35))::float4,
        (random() - 0.5) * 10 ^ (random() * 600 - 300),
        round(((random() - 0.5) * 1.999e8)::numeric, 2),
        ((random() - 0.5) * 1.9e18)::numeric(18, 0),
        round(((random() - 0.5) * 1.8e9)::numeric, 10),
        CASE WHEN g % 7 = 0 THEN NULL
            ELSE ((random() - 0.5) * 10 ^ (random() * 40 - 20))::numeric END,
        date '0001-01-01' + (random() * 3652058)::int,
        time '00:00' + random() * interval '23 hours 59 minutes',
        timestamp '0001-01-01' + random() * (timestamp '9999-12-30' - timestamp '0001-01-01'),
        timestamptz '0001-01-02 00:00+00'
            + random() * (timestamptz '9999-12-30+00' - timestamptz '0001-01-02+00'),
        (SELECT array_agg(CASE WHEN i % 4 = 0 THEN NULL ELSE (random() * 4e9 - 2e9)::int END)
            FROM generate_series(1, g % 6 + g % 100 / 90 * 70) AS i),
        ARRAY[(random() - 0.5) * 10 ^ (random() * 600 - 300), g],
        ARRAY[timestamptz '2000-01-01 00:00+00' + random() * interval '100 years', NULL]
    FROM generate_series(1, 3000) AS g
"""


def test_random_values_give_the_python_paths_bytes(db: Database) -> None:
    conn = _session(db)
    conn.execute(TYPES)
    _start(conn, db)
    conn.execute(RANDOM_ROWS)
    conn.execute("UPDATE t SET t = t || 'ü', f8 = -f8, d = d - 1 WHERE k % 3 = 0")
    schemas, changes = _changes(conn, db)
    ((encoder, native),) = _encoders(schemas).values()
    assert len(changes) == 4000
    for change in changes:
        expected = _python_path(encoder, change.modification)
        assert _native(native, change) == expected, change.modification.after


# bytes a mutation puts into a value's text: digits, signs, kind bytes, the letters of the
# special values, separators, hex, array syntax, a NUL, invalid and valid UTF-8
MUTATIONS = b'0123456789-+.:eE tfuNaInfinityx\\abcdefABCDEF{},"NULL\x00\xff\xc3\xa9 BC'


def test_mutated_messages_are_declined_or_written_as_the_python_path(db: Database) -> None:
    """Differential fuzzing (seeded): real messages with a few bytes changed, removed or
    added. Whatever the C encoder accepts, the Python path (the builder on the same
    bytes, then TableEncoder) writes identically; everything else it declines."""
    conn = _session(db)
    conn.execute(TYPES)
    _start(conn, db)
    for key, row in enumerate(_rows(VALUES), 1):
        _insert(conn, key, row)
    out: list[Record] = []
    builder = ChangelogBuilder(Catalog(conn), out.append)
    schemas, changes = _changes(conn, db, builder, out)
    ((encoder, native),) = _encoders(schemas).values()
    rng = random.Random(20261121)
    accepted = 0
    for _ in range(20_000):
        change = rng.choice(changes)
        m = change.modification
        data = bytearray(change.data)
        for _ in range(rng.randint(1, 3)):
            at, how = rng.randrange(8, len(data)), rng.random()
            if how < 0.6:
                data[at] = rng.choice(MUTATIONS)
            elif how < 0.8:
                del data[at]
            else:
                data.insert(at, rng.choice(MUTATIONS))
        got = native.encode(bytes(data), m.timestamp, m.sequence, m.lsn, m.xid, m.operation)
        if got is None:
            continue
        accepted += 1
        emitted = len(out)
        builder.sequence, builder.xid, builder.commit_time = m.sequence, m.xid, m.timestamp
        builder.feed(bytes(data), m.lsn)
        assert len(out) == emitted + 1, bytes(data)
        mutated = out[-1]
        assert isinstance(mutated, Modification)
        assert got == _python_path(encoder, mutated), bytes(data)
    assert accepted > 1000  # the net catches something


def test_declines_what_it_does_not_write_exactly(db: Database) -> None:
    conn = _session(db)
    conn.execute(TYPES)
    _start(conn, db)
    key = 0
    expected_declines = 0
    for column, values in DECLINED.items():
        for value in values:
            key += 1
            try:
                with conn.transaction():
                    _insert(conn, key, {column: value})
                expected_declines += 1
            except psycopg.errors.DataException:
                pass  # out of the column's range in PostgreSQL itself
    schemas, changes = _changes(conn, db)
    ((encoder, native),) = _encoders(schemas).values()
    assert expected_declines >= 15
    assert len(changes) == expected_declines
    for change in changes:
        m = change.modification
        assert _native(native, change) is None, m.after
        # the Python path writes them (the "string" branch, or a decimal beyond int64)
        _python_path(encoder, m)


def test_unchanged_toast_and_declines_old_tuples_and_malformed_messages(db: Database) -> None:
    conn = _session(db)
    conn.execute("CREATE TABLE f (id int PRIMARY KEY, v text)")
    conn.execute("ALTER TABLE f REPLICA IDENTITY FULL")
    conn.execute('CREATE TABLE big (id int PRIMARY KEY, n int, blob text, "2nd blob" text)')
    # stored out of line as they are (no compression): TOASTed, hence 'u' when unchanged
    conn.execute("ALTER TABLE big ALTER COLUMN blob SET STORAGE EXTERNAL")
    conn.execute('ALTER TABLE big ALTER COLUMN "2nd blob" SET STORAGE EXTERNAL')
    _start(conn, db)
    conn.execute("INSERT INTO f VALUES (1, 'a')")
    conn.execute("UPDATE f SET v = 'b'")  # carries the old row ('O')
    conn.execute("UPDATE f SET id = 2")
    conn.execute("INSERT INTO big VALUES (1, 0, repeat('x', 10000), repeat('y', 9000))")
    conn.execute("UPDATE big SET n = 1")  # both blobs unchanged and TOASTed: 'u'
    conn.execute("UPDATE big SET n = 2, blob = 'short'")  # the second one unchanged
    conn.execute("UPDATE big SET id = 2, blob = 'short'")  # a new key: the old one ('K')
    schemas, changes = _changes(conn, db)
    encoders = _encoders(schemas)
    by_table = {name: [c for c in changes if c.modification.name == name] for name in encoders}
    f_insert, *f_updates = by_table["f"]
    big_insert, big_update, big_update_2, big_new_key = by_table["big"]
    f_encoder, f_native = encoders["f"]
    big_encoder, big_native = encoders["big"]
    # REPLICA IDENTITY FULL: no key, and its updates carry the old tuple
    assert _native(f_native, f_insert) == _python_path(f_encoder, f_insert.modification)
    assert _native(f_native, f_insert) is not None
    assert [_native(f_native, c) for c in f_updates] == [None, None]
    assert _native(big_native, big_insert) == _python_path(big_encoder, big_insert.modification)
    # unchanged TOAST: null in `after`, the fields listed in unchanged_toast
    for update, unchanged in ((big_update, ["blob", "_2nd_blob"]), (big_update_2, ["_2nd_blob"])):
        assert update.data.count(b"u") == len(unchanged)
        got = _native(big_native, update)
        assert got == _python_path(big_encoder, update.modification)
        assert got is not None and got[1].endswith(
            bytes([len(unchanged) * 2])
            + b"".join(bytes([len(f) * 2]) + f.encode() for f in unchanged)
            + b"\x00\x00"
        )
    assert big_new_key.data[5:6] == b"K" and _native(big_native, big_new_key) is None
    # another table's message (column count), trailing bytes, a cut message, binary
    data = big_insert.data
    m = big_insert.modification

    def encode(raw: bytes) -> tuple[bytes | None, bytes] | None:
        return big_native.encode(raw, m.timestamp, m.sequence, m.lsn, m.xid, m.operation)

    assert encode(data) is not None
    assert encode(f_insert.data) is None
    assert encode(data + b"\x00") is None
    assert all(encode(data[:cut]) is None for cut in range(len(data)))
    binary = data[:8] + b"b" + data[9:]  # the first column's kind 't' -> 'b'
    assert data[8:9] == b"t" and encode(binary) is None
    assert encode(b"D" + data[1:]) is None
    assert encode(b"") is None
    # arguments the Python path would reject: declined too (it then says what is wrong)
    assert big_native.encode(data, datetime(2026, 1, 1), 0, m.lsn, m.xid, m.operation) is None
    assert big_native.encode(data, m.timestamp, 0, m.lsn, 1 << 64, m.operation) is None
    assert big_native.encode(data, m.timestamp, 0, m.lsn, m.xid, 5) is None  # type: ignore[arg-type]
    with pytest.raises(TypeError):  # a programming error, not a value
        big_native.encode(memoryview(data), m.timestamp, 0, m.lsn, m.xid, m.operation)  # type: ignore[arg-type]


def test_key_in_key_order_and_tables_without_key(db: Database) -> None:
    conn = _session(db)
    # the primary key's order (b, a) is not the table's (a, b)
    conn.execute("CREATE TABLE ck (a text, z int, b int4, PRIMARY KEY (b, a))")
    conn.execute("CREATE TABLE nokey (a int, b text)")
    conn.execute("CREATE TABLE nothing ()")
    _start(conn, db)
    conn.execute("INSERT INTO ck VALUES ('x', 1, 2), ('ü', NULL, -2147483648)")
    conn.execute("UPDATE ck SET z = 5 WHERE b = 2")
    conn.execute("INSERT INTO nokey VALUES (1, 'one'), (NULL, NULL)")
    conn.execute("INSERT INTO nothing DEFAULT VALUES")
    schemas, changes = _changes(conn, db)
    encoders = _encoders(schemas)
    assert encoders["nokey"][0].key is None
    assert len(changes) == 6
    for change in changes:
        encoder, native = encoders[change.modification.name]
        expected = _python_path(encoder, change.modification)
        got = _native(native, change)
        assert got == expected
        assert (got[0] is None) == (change.modification.name in ("nokey", "nothing"))
    # key record: b then a, each the union branch byte and the value
    ck_first = next(c for c in changes if c.modification.name == "ck")
    got = _native(encoders["ck"][1], ck_first)
    assert got is not None and got[0] == KEY_HEADER + b"\x02\x04" + b"\x02\x02x"


def test_transactions_and_operations_are_cached_apart(db: Database) -> None:
    conn = _session(db)
    conn.execute("CREATE TABLE c (id int PRIMARY KEY, v int)")
    _start(conn, db)
    for i in range(3):
        with conn.transaction():
            conn.execute("INSERT INTO c VALUES (%s, 0)", (i,))
            conn.execute("UPDATE c SET v = v + 1 WHERE id = %s", (i,))
            conn.execute("INSERT INTO c VALUES (%s, 0)", (100 + i,))
    schemas, changes = _changes(conn, db)
    ((encoder, native),) = _encoders(schemas).values()
    assert len({c.modification.xid for c in changes}) == 3
    for change in changes:
        assert _native(native, change) == _python_path(encoder, change.modification)


@pytest.mark.parametrize("column", ["text[]", "varchar(3)[]", "numeric[]", "bytea[]", "uuid[]"])
def test_tables_with_arrays_of_strings_stay_on_the_python_path(db: Database, column: str) -> None:
    # their elements are quoted and escaped by array_out: the Python parser's job
    conn = _session(db)
    conn.execute(sql.SQL("CREATE TABLE a (id int PRIMARY KEY, xs {})").format(sql.SQL(column)))
    _start(conn, db)
    conn.execute("INSERT INTO a VALUES (1, '{}')")
    schemas, _ = _changes(conn, db)
    (s,) = schemas
    encoder = TableEncoder(s.namespace, s.name, s.schema, s.primary_key)
    assert NativeRowEncoder.build(encoder, KEY_HEADER, VALUE_HEADER) is None


@pytest.mark.parametrize(
    "text",
    [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ab\xe2\x82", b"\x80"],
)
def test_invalid_utf8_is_declined(db: Database, text: bytes) -> None:
    # PostgreSQL (UTF8) never sends these; bytes.decode() would reject them, so must the C
    # code. The message is a real one with the text's bytes replaced.
    conn = _session(db)
    conn.execute("CREATE TABLE s (id int PRIMARY KEY, v text)")
    _start(conn, db)
    conn.execute("INSERT INTO s VALUES (1, 'abcd')")
    schemas, (change,) = _changes(conn, db)
    ((_, native),) = _encoders(schemas).values()
    assert _native(native, change) is not None
    data = change.data
    at = data.index(b"abcd")
    forged = data[: at - 4] + len(text).to_bytes(4, "big") + text + data[at + 4 :]
    m = change.modification
    assert native.encode(forged, m.timestamp, m.sequence, m.lsn, m.xid, m.operation) is None
