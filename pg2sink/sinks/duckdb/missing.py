"""ADD COLUMN ... DEFAULT: the values that rows stored before a column read, as DuckDB text.

PostgreSQL keeps a non-volatile default of a column added to a table with rows as the
column's missing value (pg_attribute.attmissingval) and logs no change of those rows.
The builder reads it from the catalog when it emits the Schema record (Schema.missing);
the layout keeps it per column (layout.Column.missing, .since) and the view reads it for
the raw rows written before the column was added, as `CAST('text' AS type)`: DuckDB's
own text of the value, whose VARCHAR cast gives the same value back for every type the
sink uses (tests/sinks/duckdb/test_duckdb_zoo.py adds a column of each with a DEFAULT).
"""

from __future__ import annotations

import duckdb

from pg2sink.changelog.records import Schema
from pg2sink.sinks.warehouse.values import missing_arrays

__all__ = ["missing_texts"]


def missing_texts(con: duckdb.DuckDBPyConnection, schema: Schema) -> dict[str, str]:
    """Per column of `schema` with a missing value DuckDB's type holds, its DuckDB text (a
    value the type cannot hold is left out: the view reads NULL there, as it does for
    such values in the rows)."""
    import pyarrow as pa  # type: ignore[import-untyped]

    out: dict[str, str] = {}
    for name, duck, array in missing_arrays(schema):
        con.register("_pg2sink_missing", pa.table({"v": array}))
        try:
            found = con.execute(
                f"SELECT CAST(CAST(v AS {duck}) AS VARCHAR) FROM _pg2sink_missing"
            ).fetchall()
        finally:
            con.unregister("_pg2sink_missing")
        out[name] = str(found[0][0])
    return out
