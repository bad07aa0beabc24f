"""What a partition of an import reads over JDBC: its query, and the reader's connection.

Values are read with the type's output function, as pgoutput sends them: `col::text`,
except for types whose cast to text is a function that prints something else (bool
prints 'true' where boolout prints 't'; bpchar loses its padding; inet shows its
netmask): those go through format('%s', col), which calls the output function. The
reader imports the job's exported snapshot in a REPEATABLE READ transaction
(`sessionInitStatement`), with the stream's session settings, and fetches through a
cursor, so rows stream instead of being held in memory, as many rows a fetch as fit in a
byte budget (`row_width`, `fetch_rows`: a table of 2 MB rows fetches a few at a time);
Spark reads the text as bytes (`binary_schema`). A masked column (--mask-column,
docs/routing.md) is read through its mask's SQL around that text, so the
server sends only the masked form.
"""

from __future__ import annotations

from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.catalog.server import REPLICATION_SESSION_SETTINGS
from pg2sink.imports.jdbc import connection_properties
from pg2sink.imports.plan import ImportPlan

__all__ = ["FETCH_SIZE", "binary_schema", "fetch_rows", "jdbc_reader", "row_width", "text_query"]

#: Most rows the JDBC driver fetches per round trip (a cursor, not the whole result in
#: memory); fewer where rows are wide (fetch_rows).
FETCH_SIZE = 20_000
BOOL_OID = 16
#: Types whose octet_length is the length of their text without reading a TOASTed value
#: (toast_raw_datum_size), and how many bytes of text a stored byte makes.
_OCTET_TYPES = {25: 1, 1043: 1, 1042: 1, 17: 2}  # text, varchar, bpchar, bytea (hex)
#: Text bytes per stored byte of the other types (numbers print wider than they store,
#: a compressed jsonb or array expands).
_STORED_FACTOR = 3
#: Rows row_width looks at.
WIDTH_SAMPLE = 2_000


def row_width(conn: psycopg.Connection[TupleRow], plan: ImportPlan) -> int:
    """About the widest row's text, in bytes, among a sample of the table's rows (a
    partition's fetches and batches are sized from it: fetch_rows). Reads the heap's
    sample pages only, never a TOASTed value."""
    parts = []
    for column in plan.columns:
        ident = sql.Identifier(column.name)
        factor = _OCTET_TYPES.get(column.source_type_oid or column.type_oid)
        if factor is not None:
            parts.append(sql.SQL("coalesce(octet_length({}), 0) * {}").format(ident, factor))
        else:
            parts.append(
                sql.SQL("coalesce(pg_column_size({}), 0) * {}").format(ident, _STORED_FACTOR)
            )
    width = sql.SQL(" + ").join(parts) if parts else sql.SQL("0")
    table = sql.Identifier(plan.schema, plan.table)
    percent = min(100.0, 100.0 * WIDTH_SAMPLE / max(1, plan.rows_estimated))
    sample = (
        sql.SQL("{} TABLESAMPLE SYSTEM ({})").format(table, sql.Literal(percent))
        if percent < 100
        else table
    )
    query = sql.SQL("SELECT max({}) FROM (SELECT * FROM {} LIMIT {}) t").format(
        width, sample, sql.Literal(WIDTH_SAMPLE * 4)
    )
    try:
        row = conn.execute(query).fetchone()
    except psycopg.errors.FeatureNotSupported:  # a relation kind without TABLESAMPLE
        query = sql.SQL("SELECT max({}) FROM (SELECT * FROM {} LIMIT {}) t").format(
            width, table, sql.Literal(WIDTH_SAMPLE)
        )
        row = conn.execute(query).fetchone()
    per_column = 16 * len(plan.columns)
    return int(row[0] or 0) + per_column if row is not None else per_column


def fetch_rows(width: int, budget: int) -> int:
    """Rows a JDBC fetch takes so that it holds about `budget` bytes of rows `width`
    bytes wide: between 1 and FETCH_SIZE."""
    return max(1, min(FETCH_SIZE, budget // max(1, width)))


def text_query(conn: psycopg.Connection[TupleRow], plan: ImportPlan, predicate: str) -> str:
    """`SELECT <each published column as the text its output function prints> AS c<i>
    FROM table WHERE (row filter) AND predicate`: what a partition's JDBC scan reads (see
    the module docstring)."""
    function_cast = _function_casts(conn, plan)
    items = []
    for i, column in enumerate(plan.columns):
        ident = sql.Identifier(column.name)
        expr: sql.Composable
        if (column.source_type_oid or column.type_oid) == BOOL_OID:
            # what boolout prints, without format()'s per-call parsing
            expr = sql.SQL("CASE WHEN {c} THEN 't' WHEN NOT {c} THEN 'f' END").format(c=ident)
        elif column.name in function_cast:
            # format() prints with the output function; NULL stays NULL
            expr = sql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END").format(
                c=ident
            )
        else:
            expr = sql.SQL("{}::text").format(ident)
        if column.mask is not None:  # masked by the server: the value never leaves it
            expr = column.mask.sql(expr)
        items.append(sql.SQL("{} AS {}").format(expr, sql.Identifier(f"c{i}")))
    # The predicate is SQL text that plan_import rendered (and the job store kept):
    # built from identifiers and literals, never from user input. The row filter is the
    # publication's, as PostgreSQL deparsed it (pg_get_expr): only the rows it accepts
    # are published, so only those are imported.
    where: sql.Composable = sql.SQL(predicate)
    if plan.row_filter is not None:
        where = sql.SQL("({}) AND ({})").format(sql.SQL(plan.row_filter), where)
    query = sql.SQL("SELECT {} FROM {} WHERE {}").format(
        sql.SQL(", ").join(items), sql.Identifier(plan.schema, plan.table), where
    )
    return query.as_string(conn)


def _function_casts(conn: psycopg.Connection[TupleRow], plan: ImportPlan) -> set[str]:
    """Columns whose type (or a domain's base type) casts to text by a function."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_attribute a"
        " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_type t ON t.oid = a.atttypid"
        " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped"
        " AND EXISTS (SELECT 1 FROM pg_cast k WHERE k.casttarget = 'text'::regtype"
        "  AND k.castsource = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END"
        "  AND k.castmethod = 'f')",
        (plan.schema, plan.table),
    ).fetchall()
    return {str(r[0]) for r in rows}


def binary_schema(columns: int) -> str:
    """Spark's `customSchema` of a scan of `text_query`: every column (c0, c1...) read as
    BINARY rather than STRING. pgjdbc's getBytes of a text column returns the bytes it
    received, PostgreSQL's text in UTF-8 (the client encoding), so the JVM never decodes
    them into a Java string and encodes them back into Spark's UTF-8 (less CPU and GC in
    the JVM's task threads: `make bench-import`); the
    executors take the Arrow binary columns as strings again (writers.py)."""
    return ", ".join(f"c{i} BINARY" for i in range(columns))


def jdbc_reader(
    conn: psycopg.Connection[TupleRow], snapshot: str, fetch_size: int = FETCH_SIZE
) -> tuple[str, dict[str, str]]:
    """JDBC URL and connection properties of the server `conn` is connected to, rows
    fetched `fetch_size` at a time."""
    info = conn.info
    tls = connection_properties(info)  # first: it refuses a Unix socket
    host = f"[{info.host}]" if ":" in info.host else info.host
    url = f"jdbc:postgresql://{host}:{info.port}/{quote(info.dbname, safe='')}"
    settings = sql.SQL(" ").join(
        sql.SQL("SET {} = {};").format(sql.Identifier(k), sql.Literal(v))
        for k, v in REPLICATION_SESSION_SETTINGS.items()
    )
    # pgjdbc opens the transaction (autocommit is off when fetchsize is set, so that rows
    # stream through a cursor); SET TRANSACTION must come before any query in it
    init = sql.SQL(
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION READ ONLY; "
        "SET TRANSACTION SNAPSHOT {}; {}"
    ).format(sql.Literal(snapshot), settings)
    props = {
        "driver": "org.postgresql.Driver",
        "user": info.user,
        "fetchsize": str(fetch_size),
        "sessionInitStatement": init.as_string(conn),
        "ApplicationName": "pg2sink import",
    }
    if info.password:
        props["password"] = info.password
    # the TLS files, sslpassword and the rest libpq was given (imports/jdbc.py)
    props.update(tls)
    return url, props
