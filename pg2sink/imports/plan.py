"""Planning an import: a table's columns, key, and the partitions Spark reads in parallel.

`plan_import` runs inside the job's snapshot (REPEATABLE READ + SET TRANSACTION SNAPSHOT),
so what it sees is what the readers will see. Each partition is one SQL boolean
expression over the table; together they select every row exactly once:

- a primary key (one column of any type, or several): boundaries are key values taken
  from a sample of the table at evenly spaced ranks in key order (so skewed or sparse
  keys still give partitions of similar size), and partition i is
  `(k1, k2, ...) >= b(i) AND (k1, k2, ...) < b(i+1)` (row comparison, which a btree on
  the key serves; the first has no lower bound, the last no upper bound). The boundary
  values are the key's text form cast back to the column type, so they compare with
  the column's own operators and collation, as the sample's ORDER BY did.
- no primary key: ranges of heap pages, `ctid >= '(p,0)' AND ctid < '(q,0)'`, which
  PostgreSQL 14+ reads with a TID range scan. Every visible row version lies in a page
  that existed when planning ran (rows are never moved while a snapshot that sees them
  is held), and the last range is open-ended anyway. A partitioned table without a key
  is read as one partition (its ctids are per leaf).

The predicates are rendered to text once here and stored with the job, so a resumed job
reads exactly the partitions it planned: boundaries never move between attempts.

An import reads what the publication publishes, no more
(https://www.postgresql.org/docs/15/logical-replication-col-lists.html and
logical-replication-row-filter.html): only the columns of its column list
(`pg_publication_tables.attnames`), and only the rows its row filter accepts
(`pg_publication_tables.rowfilter`, ANDed to every partition's predicate when read, and
read again at each attempt's snapshot). Before PostgreSQL 18 pgoutput never sends a
generated column, so neither does the import. Routing's rules apply as in the stream
(docs/routing.md): no column --exclude-column names is read, and a --mask-column is read
masked by the SELECT itself (imports/reads.py), so its values never leave PostgreSQL.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import psycopg
from psycopg import sql

from pg2sink.catalog.server import primary_key_columns
from pg2sink.routing.masking import Mask
from pg2sink.routing.rules import Rules

__all__ = ["ImportColumn", "ImportPlan", "NotPublishedError", "TableNotFoundError", "plan_import"]

log = logging.getLogger(__name__)

#: pg_type's oid of text: what a masked column is read and decoded as
TEXT_OID = 25
#: Sampled keys per partition. SYSTEM sampling takes whole pages, whose keys are often
#: neighbours, so what counts is the number of pages: 4000 rows are enough pages per
#: partition to keep partitions close to their share (`make bench-import`).
SAMPLE_PER_PARTITION = 4000
#: Below this many rows the whole key is read instead of a sample.
FULL_SCAN_ROWS = 50_000
#: Fewer rows than this per partition is not worth a Spark task.
MIN_ROWS_PER_PARTITION = 10_000
#: More rows than this per partition is split further, whatever the target.
MAX_ROWS_PER_PARTITION = 5_000_000


class TableNotFoundError(LookupError):
    """The table does not exist (in the snapshot)."""


class NotPublishedError(LookupError):
    """The table is not in the publication, or not in a way an import can read."""


@dataclass(frozen=True)
class ImportColumn:
    name: str
    type_oid: int
    """The type the rows are decoded as: text's for a masked column."""
    typmod: int
    mask: Mask | None = None
    """--mask-column's mask (routing): the SELECT reads the masked text, never the value."""
    source_type_oid: int = 0
    """A masked column's own type (its text form is what the mask applies to)."""


@dataclass(frozen=True)
class ImportPlan:
    schema: str
    table: str
    columns: tuple[ImportColumn, ...]
    """In attnum order, dropped columns excluded."""
    primary_key: tuple[str, ...]
    """Primary-key columns in key order; () when none."""
    predicates: tuple[str, ...]
    """One SQL boolean expression per partition; partition number = index."""
    rows_estimated: int
    row_filter: str | None = None
    """The publication's row filter (SQL text from pg_get_expr); None: every row."""


def _table_info(conn: psycopg.Connection[Any], schema: str, table: str) -> tuple[int, str]:
    """(oid, relkind) of schema.table; TableNotFoundError when missing."""
    row = conn.execute(
        "SELECT c.oid, c.relkind::text FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        (schema, table),
    ).fetchone()
    if row is None:
        raise TableNotFoundError(f"table {schema}.{table} does not exist")
    return int(row[0]), str(row[1])


def table_columns(conn: psycopg.Connection[Any], relid: int) -> tuple[ImportColumn, ...]:
    """The live columns of a table in attnum order."""
    rows = conn.execute(
        "SELECT attname, atttypid::int, atttypmod FROM pg_attribute"
        " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (relid,),
    ).fetchall()
    return tuple(ImportColumn(str(r[0]), int(r[1]), int(r[2])) for r in rows)


def _row_count(conn: psycopg.Connection[Any], relid: int, target: sql.Composable) -> int:
    """The planner's density (rows per page at the last ANALYZE) times the current size,
    as PostgreSQL's own estimate does; an exact count for a table never analysed or
    small enough that counting is cheap."""
    row = conn.execute(
        "SELECT reltuples::bigint, relpages::bigint,"
        " pg_relation_size(oid) / current_setting('block_size')::bigint"
        " FROM pg_class WHERE oid = %s",
        (relid,),
    ).fetchone()
    assert row is not None
    reltuples, relpages, pages = (int(v) for v in row)
    if reltuples > 0 and relpages > 0 and reltuples * pages // relpages > FULL_SCAN_ROWS:
        return reltuples * pages // relpages
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(target)).fetchone()
    assert row is not None
    return int(row[0])


def _partition_count(rows: int, target_partitions: int) -> int:
    # at most the target, no partition below MIN_ROWS_PER_PARTITION, and none above
    # MAX_ROWS_PER_PARTITION: what a restarted import reads again per partition in flight
    n = min(target_partitions, rows // MIN_ROWS_PER_PARTITION)
    return max(1, n, -(-rows // MAX_ROWS_PER_PARTITION))


# attnames and rowfilter are PostgreSQL 15+ (column lists, row filters): before, a
# published table is published whole (NULL reads as every column, no filter)
_PUBLISHED = """
SELECT {attnames}, {rowfilter}, c.oid = %(relid)s
FROM pg_publication_tables t
JOIN pg_namespace n ON n.nspname = t.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
WHERE t.pubname = %(publication)s
  AND (c.oid = %(relid)s OR c.oid IN (SELECT relid FROM pg_partition_tree(%(relid)s)))
"""


def published_part(
    conn: psycopg.Connection[Any],
    publication: str,
    relid: int,
    columns: tuple[ImportColumn, ...],
) -> tuple[tuple[ImportColumn, ...], str | None]:
    """The columns (in attnum order) and the row filter `publication` publishes of the
    table `relid`; NotPublishedError when it publishes none of it.

    A partitioned table published without publish_via_partition_root appears in
    pg_publication_tables as its leaves (PostgreSQL 15 refuses a column list or a row
    filter on such a root); they are imported through the root, so only when every
    leaf is published whole.
    """
    every = {c.name for c in columns}
    lists = conn.info.server_version >= 150000
    query = _PUBLISHED.format(
        attnames="t.attnames::text[]" if lists else "%(every)s::text[]",
        rowfilter="t.rowfilter" if lists else "NULL::text",
    )
    params = {"publication": publication, "relid": relid, "every": sorted(every)}
    rows = conn.execute(query, params).fetchall()
    own = [r for r in rows if r[2]]
    if own:
        names, row_filter = set(own[0][0] or ()), own[0][1]
    elif rows and all(r[1] is None and every <= set(r[0] or ()) for r in rows):
        names, row_filter = every, None
    elif rows:
        raise NotPublishedError(
            f"publication {publication} publishes the partitions of this table with "
            "their own column lists or row filters, which an import of the table cannot follow"
        )
    else:
        raise NotPublishedError(f"the table is not in publication {publication}")
    if conn.info.server_version < 180000:
        # pgoutput before PostgreSQL 18 never sends a generated column (the view lists them)
        names -= _generated_columns(conn, relid)
    return tuple(c for c in columns if c.name in names), row_filter


def _generated_columns(conn: psycopg.Connection[Any], relid: int) -> set[str]:
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0"
        " AND NOT attisdropped AND attgenerated <> ''",
        (relid,),
    ).fetchall()
    return {str(r[0]) for r in rows}


def routed_columns(
    rules: Rules, schema: str, table: str, columns: tuple[ImportColumn, ...], key: Sequence[str]
) -> tuple[ImportColumn, ...]:
    """`columns` without those --exclude-column names, and masked as --mask-column says,
    as the stream's RoutingStage has them (text); ConfigError for a key column excluded."""
    route = rules.route(schema, table, [c.name for c in columns])
    if not route.changes_columns:
        return columns
    route.check_key(f"{schema}.{table}", key)
    masks = dict(route.masks)
    return tuple(
        ImportColumn(c.name, TEXT_OID, -1, masks[c.name], c.type_oid) if c.name in masks else c
        for c in columns
        if c.name not in route.excluded
    )


def plan_import(
    conn: psycopg.Connection[Any],
    schema: str,
    table: str,
    *,
    target_partitions: int,
    publication: str | None = None,
    rules: Rules | None = None,
) -> ImportPlan:
    """The plan of an import of schema.table; see the module docstring.

    `conn` is already inside the job's snapshot. Raises TableNotFoundError when the table
    does not exist there. With `publication`, the plan reads only what it publishes of
    the table (its column list and row filter; NotPublishedError when nothing); without,
    the whole table (benchmarks and tests of the runner). With `rules` (--exclude-column,
    --mask-column), without the excluded columns and with the masked ones read masked.
    """
    relid, relkind = _table_info(conn, schema, table)
    columns = table_columns(conn, relid)
    row_filter = None
    if publication is not None:
        columns, row_filter = published_part(conn, publication, relid, columns)
    key = primary_key_columns(conn, relid)
    if rules is not None:
        columns = routed_columns(rules, schema, table, columns, key)
    target = sql.Identifier(schema, table)
    rows = _row_count(conn, relid, target)
    n = _partition_count(rows, max(1, target_partitions))
    if n == 1:
        parts: list[sql.Composable] = [sql.SQL("TRUE")]
    elif key:
        parts = _key_ranges(conn, target, relid, key, rows, n)
    elif relkind == "r":
        parts = _page_ranges(conn, relid, n)
    else:
        parts = [sql.SQL("TRUE")]
    predicates = tuple(p.as_string(conn) for p in parts)
    log.debug("import of %s.%s planned: %d partitions", schema, table, len(predicates))
    return ImportPlan(schema, table, columns, key, predicates, rows, row_filter)


def _key_ranges(
    conn: psycopg.Connection[Any],
    target: sql.Composable,
    relid: int,
    key: tuple[str, ...],
    rows: int,
    n: int,
) -> list[sql.Composable]:
    """Row-comparison ranges on the key, from n-1 boundaries at evenly spaced ranks."""
    cols = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    # aliased: an output column named like a key column would win in the ORDER BY below
    # (sorting the boundaries as text)
    texts = sql.SQL(", ").join(
        sql.SQL("{}::text AS {}").format(sql.Identifier(k), sql.Identifier(f"b{i}"))
        for i, k in enumerate(key)
    )
    if rows <= FULL_SCAN_ROWS:
        source: sql.Composable = target
    else:
        # SYSTEM samples whole pages (cheap on a large table); REPEATABLE makes a re-plan
        # of the same data give the same boundaries
        percent = min(100.0, 100.0 * SAMPLE_PER_PARTITION * n / rows)
        source = sql.SQL("{} TABLESAMPLE SYSTEM ({}) REPEATABLE (0)").format(
            target, sql.Literal(percent)
        )
    # the first key of buckets 2..n of the (sampled) keys in key order
    query = sql.SQL(
        "SELECT DISTINCT ON (bucket) {texts} FROM (SELECT {cols},"
        " ntile({n}) OVER (ORDER BY {cols}) AS bucket FROM {source}) AS s"
        " WHERE bucket > 1 ORDER BY bucket, {cols}"
    ).format(texts=texts, cols=cols, n=sql.Literal(n), source=source)
    boundaries = [tuple(r) for r in conn.execute(query).fetchall()]
    types = _key_types(conn, relid, key)
    values = [
        sql.SQL(", ").join(
            sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(t))
            for v, t in zip(b, types, strict=True)
        )
        for b in boundaries
    ]
    left = cols if len(key) == 1 else sql.SQL("({})").format(cols)
    bounds = [v if len(key) == 1 else sql.SQL("({})").format(v) for v in values]
    return _ranges(left, bounds)


def _key_types(conn: psycopg.Connection[Any], relid: int, key: tuple[str, ...]) -> list[str]:
    """format_type() of each key column: a type name PostgreSQL itself quotes as needed,
    so it is safe to splice after '::'."""
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = %s AND attname = ANY(%s)",
        (relid, list(key)),
    ).fetchall()
    by_name = {str(r[0]): str(r[1]) for r in rows}
    return [by_name[k] for k in key]


def _page_ranges(conn: psycopg.Connection[Any], relid: int, n: int) -> list[sql.Composable]:
    """ctid ranges of about equal numbers of heap pages."""
    row = conn.execute(
        "SELECT pg_relation_size(%s) / current_setting('block_size')::bigint", (relid,)
    ).fetchone()
    assert row is not None
    pages = int(row[0])
    if pages < n:
        return [sql.SQL("TRUE")]
    bounds: list[sql.Composable] = [
        sql.SQL("{}::tid").format(sql.Literal(f"({pages * i // n},0)")) for i in range(1, n)
    ]
    return _ranges(sql.SQL("ctid"), bounds)


def _ranges(left: sql.Composable, bounds: Sequence[sql.Composable]) -> list[sql.Composable]:
    """`left < b1`, `left >= b1 AND left < b2`, ..., `left >= b(n-1)`."""
    if not bounds:
        return [sql.SQL("TRUE")]
    out: list[sql.Composable] = [sql.SQL("{} < {}").format(left, bounds[0])]
    for lo, hi in pairwise(bounds):
        out.append(sql.SQL("{} >= {} AND {} < {}").format(left, lo, left, hi))
    out.append(sql.SQL("{} >= {}").format(left, bounds[-1]))
    return out
