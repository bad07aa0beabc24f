"""A source table in BigQuery: the DuckDB sink's Layout (its columns, names, evolution)
given BigQuery types, as a table schema, and the latest-state view in BigQuery's SQL.

The layout is engine-independent and kept as the DuckDB sink keeps it
(pg2sink.sinks.warehouse.layout: `new_layout`, `evolve`); its DuckDB types are mapped here
(`bigquery_type`), and its DuckDB DDL is not used: the raw table is created and widened
through the tables API (`table_schema`), the view with `view_sql`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pg2sink.sinks.warehouse.layout import (
    META,
    OPERATION,
    POSITION,
    Column,
    Dialect,
    Layout,
    keyed_view_sql,
    view_names,
)

__all__ = [
    "CLUSTERABLE",
    "Field",
    "alter_sql",
    "bigquery_type",
    "clustering",
    "quote",
    "retyped",
    "table_fields",
    "view_sql",
    "widens",
]

_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")

#: BigQuery types by DuckDB type (layout.duckdb_type); a list is REPEATED
_BY_DUCKDB: Mapping[str, str] = {
    "BOOLEAN": "BOOL",
    "SMALLINT": "INT64",
    "INTEGER": "INT64",
    "BIGINT": "INT64",
    "VARCHAR": "STRING",
    # PostgreSQL's text, exactly: BigQuery's JSON rewrites numbers (2.50 is 2.5), drops
    # json's key order and duplicate keys, and refuses numbers beyond FLOAT64 in a load;
    # its JSON functions take STRING too
    "JSON": "STRING",
    "UUID": "STRING",
    "BLOB": "BYTES",
    "FLOAT": "FLOAT64",
    "DOUBLE": "FLOAT64",
    "DATE": "DATE",
    "TIME": "TIME",
    "TIMESTAMP": "DATETIME",
    "TIMESTAMPTZ": "TIMESTAMP",
    # the map of PostgreSQL's text for values a type cannot hold: BigQuery has no MAP
    "MAP(VARCHAR, VARCHAR)": "JSON",
}

#: types BigQuery clusters by (https://cloud.google.com/bigquery/docs/clustered-tables)
CLUSTERABLE = frozenset(
    {"BIGNUMERIC", "BOOL", "DATE", "DATETIME", "INT64", "NUMERIC", "STRING", "TIMESTAMP"}
)
#: BigQuery clusters by at most this many columns
MAX_CLUSTERING = 4


@dataclass(frozen=True)
class Field:
    """A raw table column in BigQuery."""

    name: str
    type: str
    """NUMERIC, BIGNUMERIC (with `precision`, `scale`), INT64, STRING..."""
    repeated: bool = False
    precision: int | None = None
    scale: int | None = None

    def sql_type(self) -> str:
        """The type in a CAST, which takes no parameters (NUMERIC, not NUMERIC(10, 2))."""
        return f"ARRAY<{self.type}>" if self.repeated else self.type

    def ddl_type(self) -> str:
        """The type in DDL, with its parameters: NUMERIC(12, 4), ARRAY<BIGNUMERIC(40, 20)>."""
        base = self.type
        if self.precision is not None and self.scale is not None:
            base = f"{base}({self.precision}, {self.scale})"
        return f"ARRAY<{base}>" if self.repeated else base


#: NUMERIC and BIGNUMERIC: their (precision, scale) without parameters
_DECIMAL_TYPES = {"NUMERIC": (38, 9), "BIGNUMERIC": (76, 38)}


def _digits(field: Field) -> tuple[int, int]:
    """A decimal field's digits before and after the point."""
    precision, scale = _DECIMAL_TYPES[field.type]
    if field.precision is not None and field.scale is not None:
        precision, scale = field.precision, field.scale
    return precision - scale, scale


def widens(old: Field, new: Field) -> bool:
    """Whether column `old` may become `new` by BigQuery's ALTER COLUMN SET DATA TYPE, every
    stored value kept: a NUMERIC or BIGNUMERIC whose digits before and after the point
    both stay or grow (NUMERIC to BIGNUMERIC included, never back), in the same mode.
    https://cloud.google.com/bigquery/docs/reference/standard-sql/data-definition-language#alter_column_set_data_type_statement
    (INT64 to NUMERIC is one too, but a PostgreSQL integer never becomes a numeric in
    the layout: pg2sink.sinks.warehouse.layout.widens)."""
    if old.type not in _DECIMAL_TYPES or new.type not in _DECIMAL_TYPES:
        return False
    if old.repeated != new.repeated or (old.type, new.type) == ("BIGNUMERIC", "NUMERIC"):
        return False
    (old_int, old_scale), (new_int, new_scale) = _digits(old), _digits(new)
    return new_int >= old_int and new_scale >= old_scale


def retyped(table: Sequence[Field], wanted: Sequence[Field]) -> list[tuple[Field, Field]]:
    """The columns of `table` (a raw table's, as BigQuery has them) whose type `wanted`
    changes, as (old, new): those of a NUMERIC or BIGNUMERIC type on either side (other
    types are the same for every change the layout accepts, and BigQuery may name them
    otherwise: INTEGER for INT64)."""
    have = {f.name: f for f in table}
    out = []
    for field in wanted:
        old = have.get(field.name)
        if old is None or (old.type not in _DECIMAL_TYPES and field.type not in _DECIMAL_TYPES):
            continue
        if (old.type, old.repeated, _digits(old) if old.type in _DECIMAL_TYPES else None) != (
            field.type,
            field.repeated,
            _digits(field) if field.type in _DECIMAL_TYPES else None,
        ):
            out.append((old, field))
    return out


def alter_sql(dataset: str, raw: str, field: Field) -> str:
    """The DDL that gives column `field.name` of raw table `raw` the type of `field`."""
    return (
        f"ALTER TABLE {quote(f'{dataset}.{raw}')} ALTER COLUMN {quote(field.name)} "
        f"SET DATA TYPE {field.ddl_type()}"
    )


def bigquery_type(name: str, duck: str) -> Field:
    """Column `name` of DuckDB type `duck` in BigQuery. numeric(p,s) is NUMERIC(p,s) when
    NUMERIC holds it (scale up to 9, 29 digits before the point), else BIGNUMERIC(p,s)
    (scale up to 38, 38 digits before the point); a numeric beyond that is text already
    (DuckDB's 38 digits)."""
    if duck.endswith("[]"):
        element = bigquery_type(name, duck[:-2])
        return Field(name, element.type, True, element.precision, element.scale)
    match = _DECIMAL.fullmatch(duck)
    if match:
        precision, scale = int(match[1]), int(match[2])
        fits = scale <= 9 and precision - scale <= 29
        return Field(name, "NUMERIC" if fits else "BIGNUMERIC", False, precision, scale)
    return Field(name, _BY_DUCKDB[duck])


def table_fields(layout: Layout) -> list[Field]:
    """Every raw table column in the order of the DuckDB sink's Arrow batches
    (layout.raw_columns): metadata, before-images, then the source's columns."""
    fields = [bigquery_type(n, t) for n, t in META]
    fields += [bigquery_type(c.before, c.type) for c in layout.columns if c.before is not None]
    fields += [bigquery_type(c.raw, c.type) for c in layout.columns]
    return fields


def clustering(layout: Layout) -> list[str]:
    """The raw table's clustering columns: the key's first columns of types BigQuery
    clusters by (at most four); none without a key."""
    out = []
    for c in layout.key_columns():
        if bigquery_type(c.raw, c.type).type not in CLUSTERABLE or c.type.endswith("[]"):
            break
        out.append(c.raw)
    return out[:MAX_CLUSTERING]


def quote(identifier: str) -> str:
    """A BigQuery identifier in backticks."""
    return "`" + identifier.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _read(column: Column, position: str, raw: str | None = None) -> str:
    """`column`'s value in the view, in a row at `position` (layout.read, in BigQuery's
    SQL): its raw column, or what rows from before the column read (Column.since)."""
    value = quote(raw or column.raw)
    if not column.since:
        return value
    missing = "NULL"
    if column.missing is not None:
        field = bigquery_type(column.raw, column.type)
        missing = f"SAFE_CAST({_literal(column.missing)} AS {field.sql_type()})"
    return f"CASE WHEN {position} <= {column.since} THEN {missing} ELSE {value} END"


def view_sql(layout: Layout, dataset: str) -> str:
    """CREATE OR REPLACE VIEW of the table's latest state: the DuckDB sink's view
    (layout.keyed_view_sql, docs/sinks/duckdb.md "The view") in BigQuery's SQL, over the
    raw rows deduplicated by position (a batch loaded again after a crash holds the same
    rows at the same positions: docs/sinks/bigquery.md "Delivery")."""
    raw = quote(f"{dataset}.{layout.raw}")
    view = quote(f"{dataset}.{layout.view}")
    rows = f"SELECT * FROM {raw} WHERE TRUE QUALIFY ROW_NUMBER() OVER (PARTITION BY {POSITION}) = 1"
    if layout.key_columns():
        return keyed_view_sql(layout, BIGQUERY, view, rows)
    since = (
        f"{POSITION} > COALESCE((SELECT MAX({POSITION}) FROM {raw} "
        f"WHERE {OPERATION} = 'TRUNCATE'), -1)"
    )
    return _multiset_sql(layout, view, rows, since)


#: the keyed view's SQL in BigQuery: backticks, SAFE_CAST of missing values, NULLs cast
#: to the column's BigQuery type
BIGQUERY = Dialect(
    quote, _read, lambda c: f"CAST(NULL AS {bigquery_type(c.raw, c.type).sql_type()})"
)


def _multiset_sql(layout: Layout, view: str, rows: str, since: str) -> str:
    """The view of a table without a key (layout._multiset_sql in BigQuery's SQL): each
    INSERT, UPDATE and IMPORT row adds its new row, each UPDATE and DELETE takes one copy
    of its old row (REPLICA IDENTITY FULL) away."""
    live = [c for c in layout.live() if c.before is not None]
    if not live:
        return (
            f"CREATE OR REPLACE VIEW {view} AS WITH deduplicated AS ({rows}) SELECT NULL AS _ "
            f"FROM deduplicated WHERE {OPERATION} IN ('INSERT', 'IMPORT') AND {since}"
        )
    names = view_names(live)
    slots = [f"_c{i}" for i in range(len(live))]
    new = ", ".join(f"{_read(c, POSITION)} AS {s}" for c, s in zip(live, slots, strict=True))
    old = ", ".join(
        f"{_read(c, POSITION, c.before)} AS {s}" for c, s in zip(live, slots, strict=True)
    )
    # BigQuery groups by neither arrays nor JSON: rows are compared by their JSON text.
    # A row added a times and taken away r times is there a - r times: its additions
    # numbered 1..a, those after the r-th.
    key = "TO_JSON_STRING(STRUCT(" + ", ".join(slots) + "))"
    return f"""CREATE OR REPLACE VIEW {view} AS
WITH deduplicated AS ({rows}),
changes AS (SELECT * FROM deduplicated WHERE {since}),
events AS (
    SELECT 1 AS _n, {new} FROM changes WHERE {OPERATION} IN ('INSERT', 'UPDATE', 'IMPORT')
    UNION ALL
    SELECT -1, {old} FROM changes WHERE {OPERATION} IN ('UPDATE', 'DELETE')
),
keyed AS (SELECT *, {key} AS _key FROM events),
added AS (
    SELECT *, ROW_NUMBER() OVER (PARTITION BY _key) AS _k FROM keyed WHERE _n = 1
),
removed AS (SELECT _key, COUNT(*) AS _r FROM keyed WHERE _n = -1 GROUP BY _key)
SELECT {", ".join(f"added.{s} AS {quote(n)}" for s, n in zip(slots, names, strict=True))}
FROM added LEFT JOIN removed ON added._key = removed._key
WHERE added._k > COALESCE(removed._r, 0)"""
