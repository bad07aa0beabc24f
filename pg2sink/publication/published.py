"""What a publication is and publishes, read from the catalog: its kind, the actions it
publishes, whether pg2sink created it, and its tables.

A publication is FOR TABLE (pg_publication_rel), FOR TABLES IN SCHEMA (PostgreSQL 15+,
pg_publication_namespace) or FOR ALL TABLES (puballtables); its `publish` option may
leave actions out (pubinsert, pubupdate, pubdelete, pubtruncate).
https://www.postgresql.org/docs/current/catalog-pg-publication.html
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow


@dataclass(frozen=True, slots=True, order=True)
class Table:
    schema: str
    name: str
    oid: int = 0
    #: pg_class.relreplident: d(efault), n(othing), f(ull), i(ndex)
    replica_identity: str = "d"
    has_primary_key: bool = True
    #: UPDATE/DELETE on it (on one of its partitions) fail while it is published: no key
    #: to log. Known for candidates only (members are read without it).
    lacks_identity: bool = False

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def identifier(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)


_MEMBERS = """
SELECT n.nspname, c.relname, c.oid, c.relreplident, true
FROM pg_publication p
JOIN pg_publication_rel pr ON pr.prpubid = p.oid
JOIN pg_class c ON c.oid = pr.prrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE p.pubname = %(publication)s
ORDER BY 1, 2
"""

# What a publication of any kind publishes, as tables and partition roots (as _MEMBERS):
# its own tables, every table of its schemas (FOR TABLES IN SCHEMA, PostgreSQL 15+), or
# every table outside the system schemas (FOR ALL TABLES), never pg2sink's internal one.
_PUBLISHED = """
SELECT n.nspname, c.relname, c.oid, c.relreplident, true
FROM pg_publication p
CROSS JOIN pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE p.pubname = %(publication)s AND c.relkind IN ('r', 'p') AND c.relpersistence = 'p'
  AND n.nspname <> %(internal)s
  AND (EXISTS (SELECT 1 FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid = c.oid)
       OR (NOT c.relispartition AND n.nspname NOT IN ('information_schema', 'pg_toast')
           AND n.nspname NOT LIKE 'pg\\_%%' AND ({in_schema})))
ORDER BY 1, 2
"""
#: the _PUBLISHED condition for schema-wide membership, by server version
_ALL_TABLES = "p.puballtables"
_IN_SCHEMA = (
    "p.puballtables OR EXISTS (SELECT 1 FROM pg_publication_namespace pn"
    " WHERE pn.pnpubid = p.oid AND pn.pnnspid = n.oid)"
)

#: --publication-mode
MODES = ("auto", "manage", "use")
#: COMMENT ON PUBLICATION of the publications pg2sink creates: auto mode manages those
CREATED_MARK = "created by pg2sink: it keeps this publication's tables (--publication-mode)"
#: the actions a publication may publish, as pg_publication names them
ACTIONS = ("insert", "update", "delete", "truncate")


@dataclass(frozen=True)
class PublicationInfo:
    """What pg_publication says of one publication."""

    all_tables: bool
    in_schema: bool
    """FOR TABLES IN SCHEMA (PostgreSQL 15+): one schema or more."""
    actions: dict[str, bool]
    """Whether it publishes each of ACTIONS."""
    via_root: bool
    created_by_pg2sink: bool
    comment: str | None

    @property
    def kind(self) -> str:
        if self.all_tables:
            return "FOR ALL TABLES"
        return "FOR TABLES IN SCHEMA" if self.in_schema else "FOR TABLE"

    @property
    def left_out(self) -> tuple[str, ...]:
        """The actions it does not publish, upper case (UPDATE, DELETE...)."""
        return tuple(a.upper() for a in ACTIONS if not self.actions[a])


def publication_info(conn: psycopg.Connection[TupleRow], name: str) -> PublicationInfo | None:
    """The publication's kind, actions and mark; None when it does not exist."""
    in_schema = sql.SQL(
        "EXISTS (SELECT 1 FROM pg_publication_namespace pn WHERE pn.pnpubid = p.oid)"
        if conn.info.server_version >= 150000
        else "false"
    )
    row = conn.execute(
        sql.SQL(
            "SELECT p.puballtables, {}, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate,"
            " p.pubviaroot, obj_description(p.oid, 'pg_publication')"
            " FROM pg_publication p WHERE p.pubname = %s"
        ).format(in_schema),
        (name,),
    ).fetchone()
    if row is None:
        return None
    all_tables, schemas, ins, upd, dele, trunc, via_root, comment = row
    return PublicationInfo(
        all_tables=bool(all_tables),
        in_schema=bool(schemas),
        actions=dict(zip(ACTIONS, (bool(ins), bool(upd), bool(dele), bool(trunc)), strict=True)),
        via_root=bool(via_root),
        created_by_pg2sink=comment == CREATED_MARK,
        comment=comment,
    )


def left_out_warning(publication: str, info: PublicationInfo) -> str | None:
    """The line that says which actions never reach pg2sink; None when all do."""
    if not info.left_out:
        return None
    return (
        f"publication {publication} does not publish {', '.join(info.left_out)}: "
        "those changes never reach pg2sink nor any sink (its publish option; ALTER "
        f"PUBLICATION {publication} SET (publish = 'insert, update, delete, truncate') "
        "publishes them)"
    )


def table_rows(rows: list[TupleRow]) -> list[Table]:
    return [Table(*r) for r in rows]


def publication_exists(conn: psycopg.Connection[TupleRow], name: str) -> bool:
    row = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    return row is not None


def publication_via_root(conn: psycopg.Connection[TupleRow], name: str) -> bool | None:
    """The publication's publish_via_partition_root; None when it does not exist."""
    row = conn.execute(
        "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (name,)
    ).fetchone()
    return bool(row[0]) if row is not None else None


def publication_members(
    conn: psycopg.Connection[TupleRow], name: str, internal_schema: str = "pg2sink"
) -> list[Table]:
    """The tables the publication publishes, whatever its kind (partition roots, not
    their partitions, for a partitioned table it names)."""
    in_schema = _IN_SCHEMA if conn.info.server_version >= 150000 else _ALL_TABLES
    query = _PUBLISHED.format(in_schema=in_schema)
    return table_rows(
        conn.execute(query, {"publication": name, "internal": internal_schema}).fetchall()
    )


def own_members(conn: psycopg.Connection[TupleRow], name: str) -> list[Table]:
    """The tables the publication names (FOR TABLE): what a managed one holds."""
    return table_rows(conn.execute(_MEMBERS, {"publication": name}).fetchall())


def has_import_jobs(conn: psycopg.Connection[TupleRow], internal_schema: str, name: str) -> bool:
    """Whether pg2sink's internal schema has import jobs of the publication: pg2sink
    managed it before it marked what it creates."""
    table = conn.execute(
        "SELECT to_regclass(%s)", (sql.Identifier(internal_schema, "import_jobs").as_string(conn),)
    ).fetchone()
    if table is None or table[0] is None:
        return False
    row = conn.execute(
        sql.SQL("SELECT 1 FROM {} WHERE publication = %s LIMIT 1").format(
            sql.Identifier(internal_schema, "import_jobs")
        ),
        (name,),
    ).fetchone()
    return row is not None


def internal_schema_published(
    conn: psycopg.Connection[TupleRow], name: str, internal_schema: str
) -> bool:
    """Whether the FOR TABLES IN SCHEMA publication names pg2sink's internal schema."""
    row = conn.execute(
        "SELECT 1 FROM pg_publication p JOIN pg_publication_namespace pn ON pn.pnpubid = p.oid"
        " JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE p.pubname = %s AND n.nspname = %s",
        (name, internal_schema),
    ).fetchone()
    return row is not None
