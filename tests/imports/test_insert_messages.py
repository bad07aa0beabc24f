"""changelog.batches.insert_messages / write_raw: the Kafka import's native path.

The import feeds the stream's C encoder (formats.avro_native) the pgoutput Insert
message of each row it read as text. Against a real PostgreSQL: a table of every type
the C encoder writes (tests/changelog/test_avro_native.py's), with values it writes,
values it declines, its 3,000 random rows and NULLs, is read as the import reads it
(reads.text_query in a session with the stream's settings) into Arrow batches; each
row's message must be the Insert message PostgreSQL's own pgoutput sent for that row
(but its relation id), and `write_raw` through the C encoder, with the Python path for
the rows it declines, must give the very keys and values of the Python path alone
(`write_modifications`).
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from psycopg import sql

from pg2sink.catalog.catalog import unknown_type
from pg2sink.catalog.types import TypeCache
from pg2sink.changelog import _cmodule
from pg2sink.changelog.batches import ImportTable, insert_messages, write_modifications, write_raw
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for
from pg2sink.formats.avro import TableEncoder
from pg2sink.formats.avro_native import NativeRowEncoder
from pg2sink.imports.plan import plan_import
from pg2sink.imports.reads import text_query
from tests.changelog.test_avro_native import (
    DECLINED,
    KEY_HEADER,
    RANDOM_ROWS,
    TYPES,
    VALUE_HEADER,
    VALUES,
    _changes,
    _insert,
    _rows,
    _session,
    _start,
)
from tests.conftest import Database
from tests.sinks.file.test_file_arrow_lines import batches_of

pytestmark = pytest.mark.skipif(
    _cmodule.IMPL != "c", reason="PG2SINK_IMPL=python: the C encoder is not loaded"
)


def _fill(db: Database) -> tuple[list[bytes], ImportTable, list[list[str | None]]]:
    """The slot's Insert messages of the rows, the import's table and its rows as text."""
    conn = _session(db)
    conn.execute(TYPES)
    _start(conn, db)
    conn.execute(RANDOM_ROWS)  # keys 1 to 3,000
    key = 10_000
    for row in [*_rows(VALUES), *_rows(DECLINED)]:
        key += 1
        _insert(conn, key, row)
    conn.execute("INSERT INTO t (k) VALUES (-1), (-2)")  # NULL in every column but the key
    _, changes = _changes(conn, db)
    plan = plan_import(conn, "public", "t", target_partitions=1)
    query = text_query(conn, plan, "TRUE")
    rows = [list(r) for r in conn.execute(sql.SQL(query + " ORDER BY k").as_string(conn))]
    cache = TypeCache(conn)
    types = tuple(cache.get(c.type_oid) or unknown_type(c.type_oid) for c in plan.columns)
    columns = [
        RowColumn(c.name, codec_for(t, c.typmod), c.name == "k")
        for c, t in zip(plan.columns, types, strict=True)
    ]
    schema = avro_row_schema("public", "t", columns, primary_key=("k",))
    s = changes[0].modification
    record = Schema(s.timestamp, 77, "public", "t", schema, primary_key=("k",))
    table = ImportTable(record, types, tuple(c.typmod for c in plan.columns))
    # the slot's messages in the same order
    by_key = {int(str(c.modification.after["k"])): c.data for c in changes if c.modification.after}
    return [by_key[k] for k in sorted(by_key)], table, rows


def test_messages_are_pgoutputs_and_encode_as_the_python_path(db: Database) -> None:
    sent, table, rows = _fill(db)
    assert len(rows) == len(sent) > 3_000
    # batches of one row, a few rows, and the rest (offsets within a batch's buffers)
    batches = batches_of(rows, [1, 5, 11, 1000])
    built = [m for b in batches for m in insert_messages(b)]
    assert built == [m[:1] + b"\0\0\0\0" + m[5:] for m in sent]

    encoder = TableEncoder("public", "t", table.schema.schema, ("k",))
    native = NativeRowEncoder.build(encoder, KEY_HEADER, VALUE_HEADER)
    assert native is not None

    def python_path(m: Modification) -> tuple[bytes | None, bytes]:
        assert m.after is not None and m.operation is Operation.IMPORT
        return encoder.encode_key(m.after, KEY_HEADER), encoder.encode_value(m, VALUE_HEADER)

    reference: list[tuple[bytes | None, bytes]] = []
    count = write_modifications(table, iter(batches), lambda m: reference.append(python_path(m)))
    assert count == len(rows)

    out: list[tuple[bytes | None, bytes]] = []
    declined = 0

    def raw(data: bytes, *change: object) -> bool:
        encoded = native.encode(data, *change)  # type: ignore[arg-type]
        if encoded is not None:
            out.append(encoded)
        return encoded is not None

    def fallback(m: Modification) -> None:
        nonlocal declined
        declined += 1
        out.append(python_path(m))

    flushes: list[int] = []
    count = write_raw(table, iter(batches), raw, fallback, lambda: flushes.append(len(out)))
    assert count == len(rows)
    assert out == reference
    assert flushes == [1, 6, 17, 1017, len(rows)]  # after each batch
    # the C encoder wrote most rows, the Python path the values it declines
    assert 0 < declined < len(rows) // 2


def test_empty_batch_and_large_string_columns() -> None:
    large = pa.RecordBatch.from_arrays(
        [pa.array(["1", None], pa.large_string()), pa.array(["é", ""], pa.large_string())],
        names=["c0", "c1"],
    )
    assert insert_messages(large) == [
        b"I\0\0\0\0N\0\x02t\0\0\0\x011t\0\0\0\x02\xc3\xa9",
        b"I\0\0\0\0N\0\x02nt\0\0\0\0",
    ]
    assert insert_messages(large.slice(2)) == []
