"""A source table in DuckDB: its raw changelog table, its latest-state view, their names,
column types, the DDL that follows the table's Schema records and the view's SQL.

A `Layout` is what the sink knows of one source table; it is kept (as JSON) in the
database's `pg2sink_tables`, so a restarted stream finds the same names and columns.
`evolve` turns a Schema record into the next Layout and the statements that get the raw
table and the view there (docs/sinks/duckdb.md "Schema evolution").

Raw table: the metadata columns of `META`, a before-image column per key column (the old
key of a DELETE or of a key-changing UPDATE; every column of a table without a key, whose
UPDATEs and DELETEs name the whole old row under REPLICA IDENTITY FULL), then one column
per source column, in the order they appeared. Names are compared without case, as
DuckDB does (PostgreSQL's "A" and "a" are two columns, DuckDB's are one): a name already
taken gets `_2`, `_3`...
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pg2sink.changelog.codecs import Kind, kind_of
from pg2sink.changelog.records import Schema
from pg2sink.errors import SinkError

__all__ = [
    "DUCKDB",
    "FENCE",
    "META",
    "Column",
    "Dialect",
    "Layout",
    "duckdb_type",
    "evolve",
    "keyed_view_sql",
    "non_null",
    "quote",
    "read",
    "unique_name",
    "view_sql",
]

#: DuckDB's DECIMAL holds at most 38 digits; a wider numeric(p,s) is text
MAX_DECIMAL_DIGITS = 38

#: the metadata columns of every raw table, in order, and their DuckDB types
META: tuple[tuple[str, str], ...] = (
    ("_pg2sink_position", "BIGINT"),
    ("_pg2sink_timestamp", "TIMESTAMPTZ"),
    ("_pg2sink_lsn", "BIGINT"),
    ("_pg2sink_sequence", "BIGINT"),
    ("_pg2sink_xid", "BIGINT"),
    ("_pg2sink_operation", "VARCHAR"),
    ("_pg2sink_unchanged_toast", "VARCHAR[]"),
    ("_pg2sink_text", "MAP(VARCHAR, VARCHAR)"),
)
POSITION, OPERATION = "_pg2sink_position", "_pg2sink_operation"

#: the fence: the last raw row of a committed transaction (sink.py); rows beyond it are
#: a transaction written in chunks and not committed yet
FENCE = "SELECT coalesce(max(position), 0) FROM pg2sink_state"

#: DuckDB types by value kind (codecs.KINDS); decimal, int and text depend on the column
_BY_KIND: Mapping[Kind, str] = {
    Kind.BOOLEAN: "BOOLEAN",
    Kind.LONG: "BIGINT",
    Kind.UUID: "UUID",
    Kind.BYTES: "BLOB",
    Kind.FLOAT: "FLOAT",
    Kind.DOUBLE: "DOUBLE",
    Kind.DATE: "DATE",
    Kind.TIME: "TIME",
    Kind.TIMESTAMP: "TIMESTAMP",
    Kind.TIMESTAMPTZ: "TIMESTAMPTZ",
    Kind.NUMERIC: "VARCHAR",
}


def duckdb_type(avro: Mapping[str, Any]) -> str:
    """The DuckDB type of a column whose (non-null) Avro type is `avro` (its Schema
    record's field type, with pg.type)."""
    kind = kind_of(avro)
    pg_type = avro.get("pg.type")
    if kind is Kind.INT:
        return "SMALLINT" if pg_type == "int2" else "INTEGER"
    if kind is Kind.TEXT:
        return "JSON" if pg_type in ("json", "jsonb") else "VARCHAR"
    if kind is Kind.DECIMAL:
        precision, scale = int(avro["precision"]), int(avro["scale"])
        if precision > MAX_DECIMAL_DIGITS:
            return "VARCHAR"  # exact digits as text, as an unconstrained numeric
        return f"DECIMAL({precision},{scale})"
    if kind is Kind.ARRAY:
        return duckdb_type(non_null(avro["items"])) + "[]"
    return _BY_KIND[kind]


def non_null(union: Any) -> Mapping[str, Any]:
    """The value type of a nullable union (["null", T] or ["null", T, "string"])."""
    branch = union[1] if isinstance(union, list) else union
    return {"type": branch} if isinstance(branch, str) else branch


def quote(identifier: str) -> str:
    """A DuckDB identifier, double-quoted (any text is safe inside)."""
    return '"' + identifier.replace('"', '""') + '"'


def unique_name(candidate: str, taken: set[str]) -> str:
    """`candidate`, or with `_2`, `_3`... when DuckDB (which ignores case) already has it;
    the name is added to `taken` (lower-cased names)."""
    name, n = candidate, 2
    while name.lower() in taken:
        name, n = f"{candidate}_{n}", n + 1
    taken.add(name.lower())
    return name


@dataclass(frozen=True)
class Column:
    """One source column in the raw table."""

    column: str
    """The PostgreSQL column name."""
    raw: str
    """Its raw table column."""
    type: str
    """Its DuckDB type."""
    kind: str
    """Its value kind (codecs.Kind)."""
    key: bool = False
    before: str | None = None
    """The raw column of its before-image (key columns, every column of a table without a
    key; kept once made)."""
    dropped: bool = False
    """Gone from the source table: kept in the raw table, not in the view."""
    since: int = 0
    """Raw rows at or before this `_pg2sink_position` were written before the column was
    added (again, after a DROP): the view reads `missing` for them (0: nothing to read)."""
    missing: str | None = None
    """DuckDB's text of the value those rows read (ADD COLUMN ... DEFAULT, Schema.missing),
    cast to `type` in the view; None: NULL."""


@dataclass(frozen=True)
class Layout:
    """A source table's raw table and view in DuckDB."""

    namespace: str
    name: str
    raw: str
    view: str
    columns: tuple[Column, ...]
    """The current columns in the table's order, then the dropped ones."""
    primary_key: tuple[str, ...]

    def live(self) -> list[Column]:
        """The columns of the source table now, in its order."""
        return [c for c in self.columns if not c.dropped]

    def key_columns(self) -> list[Column]:
        """The key's columns, in key order."""
        by_name = {c.column: c for c in self.live()}
        return [by_name[k] for k in self.primary_key]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Layout:
        columns = tuple(Column(**c) for c in data["columns"])
        return cls(
            data["namespace"],
            data["name"],
            data["raw"],
            data["view"],
            columns,
            tuple(data["primary_key"]),
        )


# --- schema evolution ---

_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")
#: integer widenings DuckDB applies in place (ALTER COLUMN ... TYPE)
_WIDER_INTEGERS = {"SMALLINT": 0, "INTEGER": 1, "BIGINT": 2}


def widens(old: str, new: str) -> bool:
    """Whether every value of DuckDB type `old` is the same value in `new`, written the
    same way: larger integers, FLOAT to DOUBLE, a decimal with more digits on both sides
    of the point, a decimal to the text an over-38-digit numeric is."""
    if old == new:
        return True
    if old in _WIDER_INTEGERS and new in _WIDER_INTEGERS:
        return _WIDER_INTEGERS[old] < _WIDER_INTEGERS[new]
    if (old, new) == ("FLOAT", "DOUBLE"):
        return True
    o, n = _DECIMAL.fullmatch(old), _DECIMAL.fullmatch(new)
    if o is not None and n is not None:
        (op, os_), (np_, ns) = (int(x) for x in o.groups()), (int(x) for x in n.groups())
        return ns >= os_ and np_ - ns >= op - os_
    # numeric(p,s) beyond 38 digits: DuckDB prints a DECIMAL's digits as PostgreSQL does
    return o is not None and new == "VARCHAR"


def new_layout(schema: Schema, taken: set[str]) -> tuple[Layout, list[str]]:
    """The Layout of a table first seen, with the statements creating its raw table (the
    view comes with `evolve`)."""
    base = f"{schema.namespace}_{schema.name}"
    view = unique_name(base, taken)
    raw = unique_name(base + "_raw", taken)
    layout = Layout(schema.namespace, schema.name, raw, view, (), ())
    meta = ", ".join(f"{quote(n)} {t}" for n, t in META)
    return layout, [f"CREATE TABLE {quote(raw)} ({meta})"]


def evolve(
    layout: Layout,
    schema: Schema,
    keep: set[str] | frozenset[str] = frozenset(),
    *,
    position: int = 0,
    missing: Mapping[str, str] | None = None,
) -> tuple[Layout, list[str]]:
    """The Layout after Schema record `schema`, and the statements that make the raw table
    and the view so: new columns added (nullable), widened types applied, columns gone
    from the table kept but left out of the view; SinkError for a type change DuckDB
    cannot apply without changing values.

    `keep`: live columns the Schema record may not know (an import's snapshot, older or
    newer than the stream's last Schema record): they stay as they are, live, and only
    the columns new to the layout are added.

    `position`: the last raw row written before the Schema record; `missing`: the DuckDB
    text of the missing values of its columns (missing.py). A column added to a table
    that has rows, with a missing value, or added again after a DROP, reads its missing
    value (or NULL) in the view for the raw rows up to `position`."""
    taken = {n.lower() for n, _ in META}
    for c in layout.columns:
        taken.add(c.raw.lower())
        if c.before is not None:
            taken.add(c.before.lower())
    old = {c.column: c for c in layout.columns}
    primary_key = layout.primary_key if keep else tuple(schema.primary_key)
    keys = set(primary_key)
    ddl: list[str] = []
    live: list[Column] = [c for c in layout.live() if c.column in keep]
    readded = _readded(layout, schema) if not keep else set()
    for field in schema.schema["fields"]:
        name = field["pg.column"]
        if name in keep:
            continue
        avro = non_null(field["type"])
        column = _evolved(layout, old.get(name), name, avro, name in keys, taken, ddl)
        was = old.get(name)
        if name in readded and was is not None:
            was = dataclasses.replace(was, dropped=True)
        column = _since(layout, was, column, position, missing or {})
        if not keys and column.before is None:
            column = _with_before(layout, column, taken, ddl)
        live.append(column)
    seen = {c.column for c in live}
    gone = [dataclasses.replace(c, dropped=True) for c in layout.columns if c.column not in seen]
    evolved = dataclasses.replace(layout, columns=(*live, *gone), primary_key=primary_key)
    if evolved != layout or not layout.columns:
        ddl.append(view_sql(evolved))
    return evolved, ddl


def _evolved(
    layout: Layout,
    column: Column | None,
    name: str,
    avro: Mapping[str, Any],
    key: bool,
    taken: set[str],
    ddl: list[str],
) -> Column:
    """Column `name` after the Schema record, appending the DDL it needs to `ddl`."""
    duck = duckdb_type(avro)
    kind = str(kind_of(avro))
    raw = quote(layout.raw)
    if column is None:
        column = Column(name, unique_name(name, taken), duck, kind)
        ddl.append(f"ALTER TABLE {raw} ADD COLUMN {quote(column.raw)} {duck}")
    elif column.type != duck:
        if not widens(column.type, duck):
            raise SinkError(
                f"column {name!r} of {layout.namespace}.{layout.name} changed from DuckDB "
                f"{column.type} to {duck}, which DuckDB cannot apply to the rows already in "
                f"{layout.raw} without changing them; nothing after it is confirmed "
                "(docs/sinks/duckdb.md)"
            )
        for target in (column.raw, column.before):
            if target is not None:
                ddl.append(f"ALTER TABLE {raw} ALTER COLUMN {quote(target)} TYPE {duck}")
    column = dataclasses.replace(column, type=duck, kind=kind, key=key, dropped=False)
    if key and column.before is None:
        column = _with_before(layout, column, taken, ddl)
    return column


def _readded(layout: Layout, schema: Schema) -> set[str]:
    """Live columns the Schema record has out of their order: dropped and added again
    under the same name with no change decoded between (pgoutput describes a table only
    before a change). PostgreSQL adds columns at the end, so the columns that stayed keep
    their order; one now after a column it was before is new."""
    order = {c.column: i for i, c in enumerate(layout.live())}
    readded, last = set(), -1
    for field in schema.schema["fields"]:
        i = order.get(field["pg.column"])
        if i is None:
            continue
        if i < last:
            readded.add(field["pg.column"])
        else:
            last = i
    return readded


def _with_before(layout: Layout, column: Column, taken: set[str], ddl: list[str]) -> Column:
    """`column` with a before-image column, appending its DDL to `ddl`."""
    before = unique_name(f"_pg2sink_before_{column.column}", taken)
    ddl.append(f"ALTER TABLE {quote(layout.raw)} ADD COLUMN {quote(before)} {column.type}")
    return dataclasses.replace(column, before=before)


def _since(
    layout: Layout, old: Column | None, column: Column, position: int, missing: Mapping[str, str]
) -> Column:
    """`column` with what the view reads for raw rows from before it was added: set when
    it is new to a table that has rows and has a missing value, or back after a DROP
    (rows from before the DROP would show their old value: PostgreSQL's new column has
    nothing of the old one's)."""
    added = old is None and column.column in missing
    if layout.columns and (added or (old is not None and old.dropped)):
        return dataclasses.replace(column, since=position, missing=missing.get(column.column))
    return column


# --- the latest-state view ---


def view_names(columns: Iterable[Column]) -> list[str]:
    """The view's column names: the source's, made unique without case."""
    taken: set[str] = set()
    return [unique_name(c.column, taken) for c in columns]


def read(column: Column, position: str, raw: str | None = None) -> str:
    """The SQL of `column`'s value in the view, in a row at `position`: its raw column (or
    `raw`), or what rows from before the column read (`Column.since`)."""
    value = quote(raw or column.raw)
    if not column.since:
        return value
    missing = "NULL"
    if column.missing is not None:
        text = column.missing.replace("'", "''")
        missing = f"CAST('{text}' AS {column.type})"
    return f"CASE WHEN {position} <= {column.since} THEN {missing} ELSE {value} END"


@dataclass(frozen=True)
class Dialect:
    """What the keyed view's SQL differs in between the engines that keep a Layout
    (`keyed_view_sql`): DuckDB's here, BigQuery's in sinks/bigquery/schema.py."""

    quote: Callable[[str], str]
    """An identifier, quoted."""
    read: Callable[[Column, str], str]
    """A column's value in a row at a position (`read`)."""
    null: Callable[[Column], str]
    """A NULL of the column's type."""


DUCKDB = Dialect(quote, read, lambda _: "NULL")


def keyed_view_sql(layout: Layout, dialect: Dialect, view: str, rows: str) -> str:
    """CREATE OR REPLACE VIEW `view` (quoted) of the latest state of a table with a key,
    over the raw rows query `rows` (docs/sinks/duckdb.md "The view").

    Since the last TRUNCATE, each INSERT, UPDATE and IMPORT row puts its key's row, each
    DELETE (and each UPDATE whose before-image holds another key) removes the old key;
    per key the last event by `_pg2sink_position` (the order the stream delivered them)
    wins, and the key is in the view unless that event is a removal."""
    live = layout.live()
    names = view_names(live)
    keys = layout.key_columns()
    q = dialect.quote
    since = (
        f"{POSITION} > coalesce((SELECT max({POSITION}) FROM raw_rows "
        f"WHERE {OPERATION} = 'TRUNCATE'), -1)"
    )
    columns = ", ".join(
        f"{dialect.read(c, '_p')} AS {q(n)}" for c, n in zip(live, names, strict=True)
    )
    data = ", ".join(q(c.raw) for c in live)
    new_key = ", ".join(f"{q(c.raw)} AS _k{i}" for i, c in enumerate(keys))
    old_key = ", ".join(f"{q(c.before or '')} AS _k{i}" for i, c in enumerate(keys))
    nulls = ", ".join(f"{dialect.null(c)} AS {q(c.raw)}" for c in live)
    moved = " OR ".join(f"{q(c.before or '')} IS DISTINCT FROM {q(c.raw)}" for c in keys)
    partition = ", ".join(f"_k{i}" for i in range(len(keys)))
    return f"""CREATE OR REPLACE VIEW {view} AS
WITH raw_rows AS ({rows}),
changes AS (SELECT * FROM raw_rows WHERE {since}),
events AS (
    SELECT {POSITION} AS _p, FALSE AS _removed, {new_key}, {data}
    FROM changes WHERE {OPERATION} IN ('INSERT', 'UPDATE', 'IMPORT')
    UNION ALL
    SELECT {POSITION}, TRUE, {old_key}, {nulls}
    FROM changes
    WHERE {OPERATION} = 'DELETE'
       OR ({OPERATION} = 'UPDATE' AND {q(keys[0].before or "")} IS NOT NULL AND ({moved}))
),
latest AS (
    SELECT *, row_number() OVER (PARTITION BY {partition} ORDER BY _p DESC) AS _n FROM events
)
SELECT {columns} FROM latest WHERE _n = 1 AND NOT _removed"""


def view_sql(layout: Layout) -> str:
    """CREATE OR REPLACE VIEW of the table's latest state (docs/sinks/duckdb.md "The
    view"), over the raw rows within the fence (`FENCE`: a transaction written in chunks
    is left out until its commit): `keyed_view_sql`, or `_multiset_sql` for a table
    without a key."""
    if not layout.key_columns():
        return _multiset_sql(layout)
    return keyed_view_sql(layout, DUCKDB, quote(layout.view), _fenced(layout))


def _fenced(layout: Layout) -> str:
    """The raw table's rows within the fence."""
    return f"SELECT * FROM {quote(layout.raw)} WHERE {POSITION} <= ({FENCE})"


def _multiset_sql(layout: Layout) -> str:
    """The view of a table without a key: its rows as a multiset since the last TRUNCATE.
    Each INSERT, UPDATE and IMPORT row adds its new row, each UPDATE and DELETE takes one
    copy of its old row away (REPLICA IDENTITY FULL sends the whole old row; without
    FULL, PostgreSQL refuses UPDATE and DELETE on such a table); a row is in the view as
    many times as it was added more than taken away. Order plays no part."""
    live = layout.live()
    names = view_names(live)
    slots = [f"_c{i}" for i in range(len(live))]
    new = ", ".join(f"{read(c, POSITION)} AS {s}" for c, s in zip(live, slots, strict=True))
    # every live column has a before-image column (evolve); NULL is for safety only
    old = ", ".join(
        f"{read(c, POSITION, c.before) if c.before else 'NULL'} AS {s}"
        for c, s in zip(live, slots, strict=True)
    )
    out = ", ".join(f"{s} AS {quote(n)}" for s, n in zip(slots, names, strict=True))
    if not live:  # a table without columns: as many empty rows as it has
        slots, new, old, out = ["_c0"], "NULL AS _c0", "NULL AS _c0", "_c0 AS _"
    # the last TRUNCATE by a window, not `since`'s scalar subquery: with that, DuckDB 2.0's
    # optimizer drops every row of `counted` the final filter keeps (an empty result)
    truncated = f"max(CASE WHEN {OPERATION} = 'TRUNCATE' THEN {POSITION} END) OVER ()"
    return f"""CREATE OR REPLACE VIEW {quote(layout.view)} AS
WITH marked AS (SELECT *, {truncated} AS _truncated FROM ({_fenced(layout)})),
changes AS (SELECT * FROM marked WHERE {POSITION} > coalesce(_truncated, -1)),
events AS (
    SELECT 1 AS _n, {new} FROM changes WHERE {OPERATION} IN ('INSERT', 'UPDATE', 'IMPORT')
    UNION ALL
    SELECT -1, {old} FROM changes WHERE {OPERATION} IN ('UPDATE', 'DELETE')
),
counted AS (SELECT {", ".join(slots)}, CAST(sum(_n) AS BIGINT) AS _n FROM events GROUP BY ALL)
SELECT {out} FROM counted, range(counted._n) WHERE counted._n > 0"""


def raw_columns(layout: Layout) -> Sequence[str]:
    """Every raw table column, metadata first, as the Arrow batches carry them."""
    out = [n for n, _ in META]
    for c in layout.columns:
        if c.before is not None:
            out.append(c.before)
    out.extend(c.raw for c in layout.columns)
    return out
