"""The type zoo converges in DuckDB: after a workload on tests/test_type_fidelity.py's
table (every type and its array), the latest-state view equals the PostgreSQL table value
for value (docs/sinks/duckdb.md "Types").

The workload: the rows inserted, a TRUNCATE and the rows again, half of them updated to
another row's values, a key changed and changed back, a row deleted and inserted again,
then a column of every type but two (and a few arrays) added with a DEFAULT, whose missing
value the rows not changed since read, and one row updated after it.

The mapping, column by column: a view value is rendered as PostgreSQL input text by the
fidelity test's renderer, cast to the column's type and compared with the table's own
`::text`; where the view reads NULL and the table does not, the value is one DuckDB's type
cannot hold, and PostgreSQL's text in `_pg2sink_text` of the raw row the view took is
compared instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
from psycopg import sql

from tests.conftest import Database
from tests.sinks.duckdb.test_duckdb import caught_up, start
from tests.sinks.duckdb.test_duckdb_types import _value
from tests.support import Proc
from tests.test_type_fidelity import (
    CASES,
    SETUP,
    column_info,
    create_fidelity_table,
    insert_fidelity_rows,
    mismatches,
    row_count,
)

#: cases whose ADD COLUMN ... DEFAULT rewrites the table (a domain with a CHECK
#: constraint), which logs nothing and clears the other columns' missing values
#: (docs/sinks/duckdb.md, "ADD COLUMN ... DEFAULT": the limits): no d_ column
REWRITING = {"posint", "price"}

#: array columns added with a DEFAULT besides one column of every other case's type
ARRAY_DEFAULTS = [
    ("e_int4", "int4[]", "'{1,NULL,-3}'"),
    ("e_date", "date[]", "'{2024-02-29,NULL}'"),
    ("e_text", "text[]", '\'{"a,b","",NULL}\''),
]


def workload(conn: psycopg.Connection[Any]) -> None:
    n = row_count()
    with conn.transaction():
        insert_fidelity_rows(conn)
    conn.execute("CREATE TEMP TABLE zoo_copy AS SELECT * FROM fidelity")  # not published
    conn.execute("TRUNCATE fidelity")
    conn.execute("INSERT INTO fidelity SELECT * FROM zoo_copy")
    names = [c for (c,) in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'fidelity'::regclass"
        " AND attnum > 0 AND NOT attisdropped AND attname <> 'id' ORDER BY attnum"
    ).fetchall()]  # fmt: skip
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in names)
    conn.execute(
        sql.SQL(
            "UPDATE fidelity f SET ({c}) = "
            "(SELECT {c} FROM zoo_copy z WHERE z.id = (f.id + 1) % {n}) WHERE f.id % 2 = 0"
        ).format(c=columns, n=sql.Literal(n))
    )
    conn.execute("UPDATE fidelity SET id = 100 WHERE id = 3")
    conn.execute("UPDATE fidelity SET id = 3 WHERE id = 100")
    conn.execute("DELETE FROM fidelity WHERE id = 5")
    conn.execute("INSERT INTO fidelity SELECT * FROM zoo_copy WHERE id = 5")
    added = [
        sql.SQL("ADD COLUMN {} {} DEFAULT ({})::{}").format(
            sql.Identifier(f"d_{case}"), sql.SQL(typ), sql.SQL(values[0]), sql.SQL(typ)
        )
        for case, typ, values in CASES
        if case not in REWRITING
    ]
    added += [
        sql.SQL("ADD COLUMN {} {} DEFAULT {}").format(
            sql.Identifier(name), sql.SQL(typ), sql.SQL(default)
        )
        for name, typ, default in ARRAY_DEFAULTS
    ]
    conn.execute(sql.SQL("ALTER TABLE fidelity {}").format(sql.SQL(", ").join(added)))
    conn.execute("UPDATE fidelity SET d_int4 = 7 WHERE id = 1")  # carries every default


def view_by_id(path: Path) -> dict[int, dict[str, Any]]:
    """The view's rows by id, each value mapped as the module docstring says."""
    with duckdb.connect(str(path), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        cursor = con.execute("SELECT * FROM public_fidelity")
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        texts = dict(
            con.execute(
                "SELECT id, _pg2sink_text FROM public_fidelity_raw "
                "WHERE _pg2sink_operation IN ('INSERT', 'UPDATE', 'IMPORT') "
                "QUALIFY row_number() OVER (PARTITION BY id ORDER BY _pg2sink_position DESC) = 1"
            ).fetchall()
        )
    out = {}
    for row in rows:
        kept = texts.get(row["id"]) or {}
        out[row["id"]] = {
            n: _value(v, kept.get(n) if v is None else None, n.startswith(("a_", "e_")))
            for n, v in row.items()
        }
    return out


@pytest.mark.slow
def test_the_type_zoo_converges(db: Database, pg2sink_proc: Proc, tmp_path: Path) -> None:
    conn = db.connect()
    for statement in SETUP:
        conn.execute(statement)
    create_fidelity_table(conn)
    path = tmp_path / "zoo.duckdb"
    p = start(pg2sink_proc, path)
    workload(conn)
    caught_up(db)
    assert p.stop() == 0
    view = view_by_id(path)
    assert sorted(view) == list(range(row_count()))
    columns = column_info(conn)
    assert len(columns) == 1 + 3 * len(CASES) - len(REWRITING) + len(ARRAY_DEFAULTS)
    found = []
    for name, column in sorted(columns.items()):
        got = {row_id: row[name] for row_id, row in view.items()}
        found += mismatches(conn, column, got, base64_bytea=False)
    assert found == []
