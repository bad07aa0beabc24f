"""Publication membership manager: which tables the publication contains.

The desired membership is every ordinary or partitioned table in the
selected schemas that the -t/-T patterns accept (partitions are covered by
their root), minus the tables without a replica identity. `reconcile()` adds
what is missing and drops what no longer exists or no longer matches, in one
transaction under an advisory lock, so two pg2sink instances sharing a
publication serialise instead of fighting. What it did is logged only after
that transaction committed.

Tables without a replica identity (REPLICA IDENTITY NOTHING, or DEFAULT without a
primary key) are left out with a warning unless allow_no_replica_identity: once such a
table is in a publication that publishes UPDATE and DELETE, PostgreSQL refuses every
UPDATE and DELETE the application runs on it
(https://www.postgresql.org/docs/15/logical-replication-publication.html). For a
partitioned table what counts is its leaf partitions, where the rows live.

Partitioned tables: the root is the member, never its partitions. PostgreSQL then
publishes every partition, present and future, with no action from us; whether their
changes arrive under the root's name or their own is the publication option
publish_via_partition_root (--publish-via-partition-root), which reconcile() sets on
creation and alters on an existing publication whose setting differs
(https://www.postgresql.org/docs/15/sql-createpublication.html).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.errors import ConfigError, ServerConfigError
from pg2sink.publication.columns import ColumnLists, ColumnRule
from pg2sink.publication.generated import GeneratedColumns
from pg2sink.publication.patterns import TableFilter

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class Reconciliation:
    """What one reconcile() changed."""

    joined: tuple[Table, ...]
    left: tuple[Table, ...]
    members: tuple[Table, ...]


# A relation has a replica identity when it is FULL, or its DEFAULT (primary key) or
# USING INDEX index exists (a dropped identity index behaves as NOTHING). The partition
# tree is walked through pg_inherits (pg_partition_tree needs PostgreSQL 12); a
# partitioned table counts by its leaves, or by itself while it has none.
_CANDIDATES = """
WITH RECURSIVE candidate AS (
    SELECT n.nspname, c.relname, c.oid, c.relreplident
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relpersistence = 'p'
      AND n.nspname = ANY(%(schemas)s) AND n.nspname <> %(internal)s
), tree (root, relid) AS (
    SELECT oid, oid FROM candidate
    UNION ALL
    SELECT t.root, i.inhrelid FROM tree t
    JOIN pg_inherits i ON i.inhparent = t.relid
    JOIN pg_class p ON p.oid = i.inhrelid AND p.relispartition
), node AS (
    SELECT t.root, c.relkind NOT IN ('p', 'f') AS leaf,
           c.relreplident = 'f' OR EXISTS (
               SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid
                 AND CASE c.relreplident WHEN 'd' THEN i.indisprimary
                                         WHEN 'i' THEN i.indisreplident ELSE false END
           ) AS identity
    FROM tree t JOIN pg_class c ON c.oid = t.relid
)
SELECT c.nspname, c.relname, c.oid, c.relreplident,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       NOT coalesce(bool_and(node.identity) FILTER (WHERE node.leaf), bool_and(node.identity))
FROM candidate c JOIN node ON node.root = c.oid
GROUP BY c.nspname, c.relname, c.oid, c.relreplident
ORDER BY 1, 2
"""

_MISSING_SCHEMAS = """
SELECT s FROM unnest(%(schemas)s::text[]) s
WHERE NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = s)
ORDER BY 1
"""

_MEMBERS = """
SELECT n.nspname, c.relname, c.oid, c.relreplident, true
FROM pg_publication p
JOIN pg_publication_rel pr ON pr.prpubid = p.oid
JOIN pg_class c ON c.oid = pr.prrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE p.pubname = %(publication)s
ORDER BY 1, 2
"""


#: PublicationManager's on_change: (connection in the reconcile transaction, joined, left)
MembershipHook = Callable[
    [psycopg.Connection[TupleRow], Sequence["Table"], Sequence["Table"]], None
]


def _tables(rows: list[TupleRow]) -> list[Table]:
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


def publication_members(conn: psycopg.Connection[TupleRow], name: str) -> list[Table]:
    return _tables(conn.execute(_MEMBERS, {"publication": name}).fetchall())


class PublicationManager:
    """Creates the publication and keeps its membership equal to the desired set."""

    def __init__(
        self,
        conn: psycopg.Connection[TupleRow],
        publication: str,
        schemas: tuple[str, ...],
        table_filter: TableFilter,
        internal_schema: str = "pg2sink",
        publish_via_partition_root: bool = False,
        on_change: MembershipHook | None = None,
        allow_no_replica_identity: bool = False,
        exclusions: Sequence[ColumnRule] = (),
        publish_generated_columns: bool = False,
    ) -> None:
        self.conn = conn
        self.publication = publication
        self.schemas = schemas
        self.filter = table_filter
        self.internal_schema = internal_schema
        self.publish_via_partition_root = publish_via_partition_root
        #: called inside reconcile()'s transaction with (conn, joined, left) when membership
        #: changed: import jobs are created in the same transaction as the join
        self.on_change = on_change
        self.allow_no_replica_identity = allow_no_replica_identity
        #: --publish-generated-columns: publish_generated_columns = stored (18+)
        self.generated = GeneratedColumns(publication, publish_generated_columns)
        self._warned: set[int] = set()
        #: oids of the tables the last reconcile left out for want of a replica identity:
        #: each is warned about when it starts being left out, not at every poll
        self._left_out: set[int] = set()
        self._schemas_checked = False
        #: --exclude-column as publication column lists (publication/columns.py)
        self.columns = ColumnLists(publication, internal_schema, exclusions)

    def selected(self) -> list[Table]:
        """The tables of the schemas that the -t/-T patterns accept."""
        rows = self.conn.execute(
            _CANDIDATES, {"schemas": list(self.schemas), "internal": self.internal_schema}
        ).fetchall()
        return [t for t in _tables(rows) if self.filter.wants(t.schema, t.name)]

    def desired(self) -> list[Table]:
        """The tables the publication should hold: selected, and safe to publish."""
        return [t for t in self.selected() if not self._keep_out(t)]

    def _keep_out(self, t: Table) -> bool:
        return t.lacks_identity and not self.allow_no_replica_identity

    def _check_schemas(self) -> None:
        """At the first reconcile: a --schema that does not exist is a mistake (a typo
        streams nothing); later, a schema dropped while running just empties."""
        if self._schemas_checked:
            return
        rows = self.conn.execute(_MISSING_SCHEMAS, {"schemas": list(self.schemas)}).fetchall()
        if rows:
            raise ConfigError(
                f"--schema {', '.join(r[0] for r in rows)}: no such schema in database "
                f"{self.conn.info.dbname}"
            )
        self._schemas_checked = True

    def reconcile(self) -> Reconciliation:
        """One pass: create the publication if needed, then add and drop tables."""
        try:
            with self.conn.transaction():
                # Transaction-scoped, so it is released by COMMIT/ROLLBACK even if
                # we die half way; keyed on the publication name.
                self.conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"pg2sink.publication.{self.publication}",),
                )
                self._check_schemas()
                changed = self._ensure_publication()
                # created just now: with the option already
                created = changed is not None and changed.startswith("created ")
                aligned = None if created else self.generated.align(self.conn)
                changed = "; ".join(m for m in (changed, aligned) if m) or None
                current = {t.oid: t for t in publication_members(self.conn, self.publication)}
                selected = self.selected()
                wanted = {t.oid: t for t in selected if not self._keep_out(t)}
                joined = [t for oid, t in wanted.items() if oid not in current]
                left = [t for oid, t in current.items() if oid not in wanted]
                pub = sql.Identifier(self.publication)
                for t in joined:
                    self.conn.execute(
                        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, t.identifier)
                    )
                for t in left:
                    self.conn.execute(
                        sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(pub, t.identifier)
                    )
                self.columns.sync(
                    self.conn,
                    [(t.oid, t.schema, t.name) for t in wanted.values()],
                    {t.oid for t in joined},
                    self.publish_via_partition_root,
                )
                if self.on_change is not None and (joined or left):
                    self.on_change(self.conn, joined, left)
        except psycopg.errors.InsufficientPrivilege as e:
            raise ServerConfigError(
                f"cannot manage publication {self.publication!r}: {e.diag.message_primary}. "
                "The role needs CREATE on the database and ownership of the published tables "
                "(or run pg2sink as their owner)"
            ) from None
        # committed: now it is true to say so
        if changed:
            log.info("%s", changed)
        self._warn_left_out([t for t in selected if self._keep_out(t)])
        self.columns.report({t.oid: t.qualified for t in wanted.values()})
        if not selected and self.filter.has_patterns():
            log.warning(
                "%s select no table in schema(s) %s: publication %s is empty",
                self.filter.describe(),
                ", ".join(self.schemas),
                self.publication,
            )
        for t in joined:
            log.info("table %s joined publication %s", t.qualified, self.publication)
            if t.lacks_identity and t.oid not in self._warned:
                self._warned.add(t.oid)  # published on purpose: --allow-no-replica-identity
                log.warning(
                    "table %s has no primary key or replica identity: UPDATE and DELETE on it "
                    "now fail in PostgreSQL; add a primary key or run "
                    "ALTER TABLE %s REPLICA IDENTITY FULL",
                    t.qualified,
                    t.identifier.as_string(self.conn),
                )
        for t in left:
            log.info("table %s left publication %s", t.qualified, self.publication)
        return Reconciliation(tuple(joined), tuple(left), tuple(sorted(wanted.values())))

    def _warn_left_out(self, left_out: list[Table]) -> None:
        """One warning per table when it starts being left out (again)."""
        for t in left_out:
            if t.oid not in self._left_out:
                log.warning(
                    "table %s has no primary key or replica identity: left out of "
                    "publication %s, since PostgreSQL refuses UPDATE and DELETE on a "
                    "published table without one; add a primary key, run ALTER TABLE %s "
                    "REPLICA IDENTITY FULL, or pass --allow-no-replica-identity",
                    t.qualified,
                    self.publication,
                    t.identifier.as_string(self.conn),
                )
        self._left_out = {t.oid for t in left_out}

    def _ensure_publication(self) -> str | None:
        """Create the publication, or align its publish_via_partition_root with ours;
        returns what to log once the transaction commits."""
        pub = sql.Identifier(self.publication)
        via_root = sql.Literal(self.publish_via_partition_root)
        current = publication_via_root(self.conn, self.publication)
        if current is None:
            self.conn.execute(
                sql.SQL("CREATE PUBLICATION {} WITH (publish_via_partition_root = {}{})").format(
                    pub, via_root, self.generated.create_option(self.conn)
                )
            )
            return f"created publication {self.publication}"
        if current != self.publish_via_partition_root:
            self.conn.execute(
                sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = {})").format(
                    pub, via_root
                )
            )
            return (
                f"publication {self.publication}: publish_via_partition_root set to "
                f"{str(self.publish_via_partition_root).lower()}"
            )
        return None

    def drop(self) -> bool:
        """Drop the publication; False when it did not exist."""
        if not publication_exists(self.conn, self.publication):
            return False
        self.columns.forget(self.conn)
        self.conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(self.publication)))
        return True
