"""Publication membership manager: which tables the publication contains.

The desired membership is every ordinary or partitioned table in the
selected schemas that the -t/-T patterns accept (partitions are covered by
their root). `reconcile()` adds what is missing and drops what no longer
exists or no longer matches, in one transaction under an advisory lock, so
two pg2sink instances sharing a publication serialise instead of fighting.

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

from pg2sink.errors import ServerConfigError
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

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def identifier(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    @property
    def lacks_identity(self) -> bool:
        """UPDATE/DELETE on it fail while it is published (no key to log)."""
        return self.replica_identity == "n" or (
            self.replica_identity == "d" and not self.has_primary_key
        )


@dataclass(frozen=True)
class Reconciliation:
    """What one reconcile() changed."""

    joined: tuple[Table, ...]
    left: tuple[Table, ...]
    members: tuple[Table, ...]


_CANDIDATES = """
SELECT n.nspname, c.relname, c.oid, c.relreplident,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relpersistence = 'p'
  AND n.nspname = ANY(%(schemas)s) AND n.nspname <> %(internal)s
ORDER BY 1, 2
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
    return [Table(r[0], r[1], r[2], r[3], r[4]) for r in rows]


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
        self._warned: set[int] = set()

    def desired(self) -> list[Table]:
        rows = self.conn.execute(
            _CANDIDATES, {"schemas": list(self.schemas), "internal": self.internal_schema}
        ).fetchall()
        return [t for t in _tables(rows) if self.filter.wants(t.schema, t.name)]

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
                self._ensure_publication()
                current = {t.oid: t for t in publication_members(self.conn, self.publication)}
                wanted = {t.oid: t for t in self.desired()}
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
                if self.on_change is not None and (joined or left):
                    self.on_change(self.conn, joined, left)
        except psycopg.errors.InsufficientPrivilege as e:
            raise ServerConfigError(
                f"cannot manage publication {self.publication!r}: {e.diag.message_primary}. "
                "The role needs CREATE on the database and ownership of the published tables "
                "(or run pg2sink as their owner)"
            ) from None
        for t in joined:
            log.info("table %s joined publication %s", t.qualified, self.publication)
            if t.lacks_identity and t.oid not in self._warned:
                self._warned.add(t.oid)
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

    def _ensure_publication(self) -> None:
        """Create the publication, or align its publish_via_partition_root with ours."""
        pub = sql.Identifier(self.publication)
        via_root = sql.Literal(self.publish_via_partition_root)
        current = publication_via_root(self.conn, self.publication)
        if current is None:
            self.conn.execute(
                sql.SQL("CREATE PUBLICATION {} WITH (publish_via_partition_root = {})").format(
                    pub, via_root
                )
            )
            log.info("created publication %s", self.publication)
        elif current != self.publish_via_partition_root:
            self.conn.execute(
                sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = {})").format(
                    pub, via_root
                )
            )
            log.info(
                "publication %s: publish_via_partition_root set to %s",
                self.publication,
                str(self.publish_via_partition_root).lower(),
            )

    def drop(self) -> bool:
        """Drop the publication; False when it did not exist."""
        if not publication_exists(self.conn, self.publication):
            return False
        self.conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(self.publication)))
        return True
