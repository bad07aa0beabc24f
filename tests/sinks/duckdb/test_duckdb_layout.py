"""The DuckDB sink on its own (a real embedded DuckDB, records made here): names that
never collide, widening rules, acknowledgements only after the commit, and transactions
the file already holds skipped."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pg2sink.changelog.pgvalues import PgText
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.errors import SinkError
from pg2sink.logical.messages import UNCHANGED_TOAST
from pg2sink.sinks.duckdb.config import DuckDBConfig
from pg2sink.sinks.duckdb.sink import DuckDBSink
from pg2sink.sinks.warehouse.layout import widens

NOW = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
INT = {"type": "int", "pg.type": "int4"}
TEXT = {"type": "string", "pg.type": "text"}


def schema(
    namespace: str, name: str, *columns: tuple[str, dict[str, Any]], key: str = "id"
) -> Schema:
    fields = [
        {"name": c, "type": ["null", t], "pg.column": c, "pg.key": c == key} for c, t in columns
    ]
    keys = (key,) if key in {c for c, _ in columns} else ()
    return Schema(NOW, 1, namespace, name, {"type": "record", "fields": fields}, 1, keys)


def insert(namespace: str, name: str, sequence: int, **after: object) -> Modification:
    return Modification(NOW, sequence, 100, 7, Operation.INSERT, namespace, name, None, after)


def opened(path: Path) -> DuckDBSink:
    sink = DuckDBSink(DuckDBConfig(str(path)))
    sink.open()
    return sink


def query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_names_never_collide(tmp_path: Path) -> None:
    path = tmp_path / "names.duckdb"
    sink = opened(path)
    # public.a_b and public_a.b are both "public_a_b"; "T" and "t" are one name to DuckDB;
    # x's raw table and x_raw's view are both "public_x_raw"; the columns "A" and "a" are
    # one name to DuckDB, and "_pg2sink_lsn" is a metadata column's
    tables = [("public", "a_b"), ("public_a", "b"), ("public", "T"), ("public", "t")]
    for i, (ns, name) in enumerate(tables):
        sink.write(schema(ns, name, ("id", INT), ("A", TEXT), ("a", TEXT), ("_pg2sink_lsn", INT)))
        sink.write(insert(ns, name, i, id=i, A="upper", a="lower", _pg2sink_lsn=5))
    sink.write(schema("public", "x", ("id", INT)))
    sink.write(schema("public", "x_raw", ("id", INT)))
    sink.checkpoint(200)
    assert sink.flush() == 200
    sink.close()
    layouts = dict(
        ((ns, name), (view, raw))
        for ns, name, view, raw in query(
            path,
            "SELECT namespace, name, layout->>'view', layout->>'raw' FROM pg2sink_tables",
        )
    )
    names = [n.lower() for pair in layouts.values() for n in pair]
    assert len(names) == len(set(names)) == 12
    assert layouts["public", "a_b"] == ("public_a_b", "public_a_b_raw")
    assert layouts["public_a", "b"] == ("public_a_b_2", "public_a_b_raw_2")
    assert layouts["public", "x_raw"] == ("public_x_raw_2", "public_x_raw_raw")
    for i, (ns, name) in enumerate(tables):
        view = layouts[ns, name][0]
        cursor_rows = query(path, f'SELECT * FROM "{view}"')
        assert cursor_rows == [(i, "upper", "lower", 5)]

    def columns(table: str) -> list[str]:
        rows = query(
            path,
            "SELECT column_name FROM information_schema.columns "
            f"WHERE table_name = '{table}' ORDER BY ordinal_position",
        )
        return [c for (c,) in rows]

    # the view has the source's names (made unique without case), the raw table may not
    assert columns("public_T") == ["id", "A", "a_2", "_pg2sink_lsn"]
    # (a key column's before-image follows it: columns are added as they appear)
    raw = ["id", "_pg2sink_before_id", "A", "a_2", "_pg2sink_lsn_2"]
    assert columns("public_T_raw")[-5:] == raw


def test_names_taken_carry_over_commits_and_reopens(tmp_path: Path) -> None:
    """The sink reads the file's table and view names once and keeps them as it creates
    tables: a table first seen in a later commit, or after the file is opened again,
    still gets a name nothing holds (a user's own table included)."""
    path = tmp_path / "later.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE public_mine (x INTEGER)")
    sink = opened(path)
    sink.write(schema("public", "a_b", ("id", INT)))
    sink.checkpoint(200)
    assert sink.flush() == 200
    sink.write(schema("public_a", "b", ("id", INT)))
    sink.write(schema("public", "mine", ("id", INT)))
    sink.checkpoint(300)
    assert sink.flush() == 300
    sink.close()
    sink = opened(path)
    sink.write(schema("public_a", "b_raw", ("id", INT)))
    sink.checkpoint(400)
    assert sink.flush() == 400
    sink.close()
    layouts = {
        (ns, name): (view, raw)
        for ns, name, view, raw in query(
            path, "SELECT namespace, name, layout->>'view', layout->>'raw' FROM pg2sink_tables"
        )
    }
    assert layouts == {
        ("public", "a_b"): ("public_a_b", "public_a_b_raw"),
        ("public_a", "b"): ("public_a_b_2", "public_a_b_raw_2"),
        ("public", "mine"): ("public_mine_2", "public_mine_raw"),
        ("public_a", "b_raw"): ("public_a_b_raw_3", "public_a_b_raw_raw"),
    }


def test_nothing_is_acknowledged_before_its_commit(tmp_path: Path) -> None:
    sink = opened(tmp_path / "ack.duckdb")
    sink.write(schema("public", "t", ("id", INT)))
    sink.write(insert("public", "t", 0, id=1))
    assert sink.acknowledged() is None
    sink.checkpoint(300)
    assert sink.acknowledged() is None and sink.pending_bytes() > 0
    sink.start_flush()
    assert sink.flush() == 300 and sink.pending_bytes() == 0
    sink.write(insert("public", "t", 0, id=2))  # no checkpoint: not committed at close
    sink.close()
    assert query(tmp_path / "ack.duckdb", "SELECT id FROM public_t") == [(1,)]


def test_transactions_the_file_holds_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "skip.duckdb"
    sink = opened(path)
    sink.write(schema("public", "t", ("id", INT)))
    sink.write(insert("public", "t", 0, id=1))
    sink.checkpoint(300)
    sink.close()
    again = opened(path)  # the stream replays from the slot's older position
    again.write(schema("public", "t", ("id", INT)))
    again.write(insert("public", "t", 0, id=1))
    again.checkpoint(300)
    assert again.acknowledged() == 300  # in the file already
    again.write(insert("public", "t", 0, id=2))
    again.write(insert("public", "t", 1, id=3))
    again.write(insert("public", "t", 0, id=2))  # a reconnect replays the torn transaction
    again.write(insert("public", "t", 1, id=3))
    again.checkpoint(400)
    assert again.flush() == 400
    again.close()
    assert query(path, "SELECT id FROM public_t_raw ORDER BY id") == [(1,), (2,), (3,)]
    assert query(path, "SELECT slot, lsn FROM pg2sink_state") == [("pg2sink", 400)]


def test_a_failed_commit_confirms_nothing(tmp_path: Path) -> None:
    path = tmp_path / "fail.duckdb"
    sink = opened(path)
    sink.write(schema("public", "t", ("id", INT), ("a", INT)))
    sink.checkpoint(100)
    assert sink.flush() == 100
    sink.write(schema("public", "t", ("id", INT), ("a", TEXT)))
    sink.write(insert("public", "t", 0, id=1, a="x"))
    sink.checkpoint(200)
    with pytest.raises(SinkError, match="changed from DuckDB INTEGER to VARCHAR"):
        sink.flush()
    with pytest.raises(SinkError):
        sink.acknowledged()
    sink.close()
    assert query(path, "SELECT lsn FROM pg2sink_state") == [(100,)]
    assert query(path, "SELECT count(*) FROM public_t_raw") == [(0,)]


@pytest.mark.parametrize(
    ("old", "new", "applies"),
    [
        ("SMALLINT", "INTEGER", True),
        ("INTEGER", "BIGINT", True),
        ("BIGINT", "INTEGER", False),
        ("FLOAT", "DOUBLE", True),
        ("DECIMAL(10,2)", "DECIMAL(12,4)", True),
        ("DECIMAL(10,2)", "DECIMAL(10,4)", False),  # fewer digits before the point
        ("DECIMAL(10,2)", "DECIMAL(12,1)", False),  # fewer after it
        ("DECIMAL(10,2)", "VARCHAR", True),  # numeric(50,2): its digits as text
        ("INTEGER", "VARCHAR", False),
        ("TIMESTAMP", "TIMESTAMPTZ", False),
        ("INTEGER[]", "BIGINT[]", False),
    ],
)
def test_widening(old: str, new: str, applies: bool) -> None:
    assert widens(old, new) is applies


def test_an_array_kept_as_text_alone_in_its_batch(tmp_path: Path) -> None:
    # Arrow would take the text '[0:1]={a,b}' for a list of its characters
    path = tmp_path / "array.duckdb"
    sink = opened(path)
    texts = {"type": "array", "items": ["null", TEXT], "pg.type": "text[]"}
    sink.write(schema("public", "t", ("id", INT), ("a", texts)))
    sink.write(insert("public", "t", 0, id=1, a=PgText("[0:1]={a,b}")))
    sink.checkpoint(100)
    sink.write(insert("public", "t", 0, id=2, a=["x", None]))
    sink.checkpoint(200)
    assert sink.flush() == 200
    sink.close()
    rows = query(path, "SELECT id, a, _pg2sink_text FROM public_t_raw ORDER BY id")
    assert rows == [(1, None, {"a": "[0:1]={a,b}"}), (2, ["x", None], None)]


def test_a_table_without_a_key_is_a_multiset(tmp_path: Path) -> None:
    path = tmp_path / "keyless.duckdb"
    sink = opened(path)
    sink.write(schema("public", "t", ("line", TEXT), key=""))
    sink.write(schema("public", "none", key=""))  # a table without columns
    for i, line in enumerate(["a", "a", "b", None]):
        sink.write(insert("public", "t", i, line=line))
    sink.write(insert("public", "none", 4))
    sink.write(insert("public", "none", 5))
    changes: list[tuple[Operation, str, dict[str, object], dict[str, object] | None]] = [
        (Operation.DELETE, "t", {"line": "a"}, None),
        (Operation.UPDATE, "t", {"line": "b"}, {"line": "c"}),
        (Operation.DELETE, "t", {"line": None}, None),
        (Operation.DELETE, "none", {}, None),
    ]
    for i, (op, table, before, after) in enumerate(changes, start=6):
        sink.write(Modification(NOW, i, 100, 7, op, "public", table, before, after))
    sink.checkpoint(100)
    assert sink.flush() == 100
    sink.close()
    assert query(path, "SELECT line FROM public_t ORDER BY line") == [("a",), ("c",)]
    assert query(path, "SELECT count(*) FROM public_none") == [(1,)]


def test_the_multiset_view_follows_random_changes(tmp_path: Path) -> None:
    """Random inserts, updates, deletes and TRUNCATEs of a keyless table, checkpointed in
    random batches: after each commit the view is the multiset a Counter keeps."""
    path = tmp_path / "random.duckdb"
    rng = random.Random(3)
    kept: Counter[tuple[str, int | None]] = Counter()
    sink = opened(path)
    sink.write(schema("public", "m", ("s", TEXT), ("n", INT), key=""))
    lsn = sequence = 0
    for _ in range(300):
        s, n = rng.choice("abc"), rng.choice([1, 2, None])
        row: dict[str, object] = {"s": s, "n": n}
        before: dict[str, object] | None
        after: dict[str, object] | None
        rows = sorted(kept.elements(), key=repr)
        old = rng.choice(rows) if rows else None
        choice = rng.random()
        if choice < 0.5 or old is None:
            op, before, after = Operation.INSERT, None, row
        elif choice < 0.75:
            op, before, after = Operation.UPDATE, dict(zip("sn", old, strict=True)), row
        elif choice < 0.97:
            op, before, after = Operation.DELETE, dict(zip("sn", old, strict=True)), None
        else:
            op, before, after = Operation.TRUNCATE, None, None
            kept.clear()
        if before is not None:
            kept[old] -= 1  # type: ignore[index]
        if after is not None:
            kept[s, n] += 1
        sink.write(Modification(NOW, sequence, lsn, 7, op, "public", "m", before, after))
        sequence += 1
        if rng.random() < 0.2:
            lsn, sequence = lsn + 10, 0
            sink.checkpoint(lsn)
        if rng.random() < 0.05:
            lsn, sequence = lsn + 10, 0
            sink.checkpoint(lsn)
            sink.close()
            view = query(path, "SELECT s, n FROM public_m")
            assert Counter(view) == +kept
            sink = opened(path)
    sink.close()


#: a column of each kind of DuckDB type, and a value: Arrow refuses UNCHANGED_TOAST in
#: every one of them, which is how the sink finds the rows to fill (values.UnfilledError)
TOAST_COLUMNS: dict[str, tuple[dict[str, Any], object]] = {
    "i": ({"type": "long", "pg.type": "int8"}, 5),
    "t": (TEXT, "text"),
    "n": (
        {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        Decimal("12.50"),
    ),
    "w": ({"type": "string", "pg.type": "numeric"}, Decimal("1e40")),  # digits as text
    "at": ({"type": "long", "logicalType": "timestamp-micros"}, NOW),
    "j": ({"type": "string", "pg.type": "jsonb"}, '{"a": [1, 2]}'),
    "b": ({"type": "boolean"}, True),
    "by": ({"type": "bytes", "pg.type": "bytea"}, b"\x00\x01"),
    "f": ({"type": "double"}, 0.5),
    "a": ({"type": "array", "items": ["null", TEXT], "pg.type": "text[]"}, ["p", None]),
}


def test_unchanged_toasted_values_of_every_type_are_filled_in(tmp_path: Path) -> None:
    path = tmp_path / "toast.duckdb"
    sink = opened(path)
    columns = [(c, t) for c, (t, _) in TOAST_COLUMNS.items()]
    sink.write(schema("public", "t", ("id", INT), *columns))
    values = {c: v for c, (_, v) in TOAST_COLUMNS.items()}
    sink.write(insert("public", "t", 0, id=1, **values))
    sink.checkpoint(100)
    assert sink.flush() == 100  # the first UPDATEs read the key's row from the file
    lsn = 100
    for same_batch in (False, True):  # then from the batch: the key's row comes first
        for column in TOAST_COLUMNS:
            lsn += 10
            after = {"id": 1, **values, column: UNCHANGED_TOAST}
            update = Modification(NOW, 0, lsn, 8, Operation.UPDATE, "public", "t", None, after)
            sink.write(update)
            sink.checkpoint(lsn)
            if not same_batch:
                assert sink.flush() == lsn
    assert sink.flush() == lsn
    sink.close()
    names = ", ".join(f'"{c}"' for c in TOAST_COLUMNS)
    rows = query(path, f"SELECT {names}, _pg2sink_unchanged_toast FROM public_t_raw ORDER BY 1")
    stored = [v if c != "w" else format(v, "f") for c, v in values.items()]
    filled = [[c] for c in TOAST_COLUMNS for _ in (False, True)]
    assert sorted(rows, key=str) == sorted(
        [(*stored, None), *((*stored, f) for f in filled)], key=str
    )
