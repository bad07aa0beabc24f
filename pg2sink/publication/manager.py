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

A publication pg2sink did not create is never changed unless told to (--publication-mode):
`manage` keeps the membership as above whoever made it; `use` streams what it publishes
(FOR TABLE, FOR ALL TABLES, FOR TABLES IN SCHEMA) and alters nothing; `auto`, the default,
manages the publications pg2sink created (marked by a COMMENT) and uses the others. A
publication's `publish` option may leave actions out (pubinsert, pubupdate, pubdelete,
pubtruncate): that is said once when it starts being so, and kept for status and metrics.
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
from pg2sink.publication.published import (
    CREATED_MARK,
    MODES,
    PublicationInfo,
    Table,
    has_import_jobs,
    internal_schema_published,
    left_out_warning,
    own_members,
    publication_exists,
    publication_info,
    publication_members,
    table_rows,
)

log = logging.getLogger(__name__)


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

#: PublicationManager's on_change: (connection in the reconcile transaction, joined, left)
MembershipHook = Callable[
    [psycopg.Connection[TupleRow], Sequence["Table"], Sequence["Table"]], None
]


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
        mode: str = "auto",
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
        if mode not in MODES:
            raise ValueError(f"publication mode {mode!r} not in {MODES}")
        self.mode = mode
        #: the publication as the last reconcile read it
        self.info: PublicationInfo | None = None
        #: whether the last reconcile managed the membership (else used it as it is)
        self.managing = mode != "use"
        #: what was last said about the publication's kind and actions (said on change)
        self._said: tuple[bool, tuple[str, ...]] | None = None
        #: used as it is: the members at the previous reconcile (joined/left from there)
        self._used: dict[int, Table] | None = None

    def selected(self) -> list[Table]:
        """The tables of the schemas that the -t/-T patterns accept."""
        rows = self.conn.execute(
            _CANDIDATES, {"schemas": list(self.schemas), "internal": self.internal_schema}
        ).fetchall()
        return [t for t in table_rows(rows) if self.filter.wants(t.schema, t.name)]

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
                info = publication_info(self.conn, self.publication)
                self.managing = self._manages(info)
                if not self.managing:
                    assert info is not None
                    return self._use(info)
                changed = self._ensure_publication(info)
                # created just now: with the option already
                created = changed is not None and changed.startswith("created ")
                aligned = None if created else self.generated.align(self.conn)
                changed = "; ".join(m for m in (changed, aligned) if m) or None
                self.info = publication_info(self.conn, self.publication)
                current = {t.oid: t for t in own_members(self.conn, self.publication)}
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
        self._say_kind()
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

    def _manages(self, info: PublicationInfo | None, *, mark: bool = True) -> bool:
        """Whether this reconcile manages the membership (else uses the publication as it
        is); ConfigError for a mode the publication cannot have. `mark`: a publication of
        a pg2sink from before the mark gets it (`pg2sink status` writes nothing)."""
        name = self.publication
        if info is None:
            if self.mode == "use":
                raise ConfigError(
                    f"publication {name} does not exist: --publication-mode use streams a "
                    "publication made beforehand; create it, or let pg2sink create it "
                    "(--publication-mode auto)"
                )
            return True
        if self.mode == "use":
            return False
        if info.all_tables or info.in_schema:
            if self.mode == "manage":
                raise ConfigError(
                    f"publication {name} is {info.kind}: its tables are not pg2sink's to "
                    "add or drop; stream it as it is (--publication-mode use or auto), or "
                    "give pg2sink a publication of its own (--publication)"
                )
            return False
        if self.mode == "manage" or info.created_by_pg2sink:
            return True
        if info.comment is None and has_import_jobs(self.conn, self.internal_schema, name):
            # made by a pg2sink from before the mark: marked now, managed as before
            if not mark:
                return True
            self.conn.execute(
                sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(
                    sql.Identifier(name), sql.Literal(CREATED_MARK)
                )
            )
            return True
        return False

    def _use(self, info: PublicationInfo) -> Reconciliation:
        """The publication as it is: its members, never altered (in the reconcile's
        transaction; what changed since the previous reconcile goes to on_change)."""
        self.info = info
        current = {
            t.oid: t for t in publication_members(self.conn, self.publication, self.internal_schema)
        }
        # the members at the first reconcile are where this process starts (as a managed
        # publication's members are): only the tables that join later are imported
        before = self._used if self._used is not None else current
        joined = [t for oid, t in current.items() if oid not in before]
        left = [t for oid, t in before.items() if oid not in current]
        self.columns.hands_off(self.conn, [(t.oid, t.schema, t.name) for t in current.values()])
        if self.on_change is not None and (joined or left):
            self.on_change(self.conn, joined, left)
        self._used = current
        self._say_kind()
        self.columns.report({t.oid: t.qualified for t in current.values()})
        if info.via_root != self.publish_via_partition_root:
            log.warning(
                "publication %s has publish_via_partition_root = %s, not %s as "
                "--publish-via-partition-root says: left as it is (it is not pg2sink's)",
                self.publication,
                str(info.via_root).lower(),
                str(self.publish_via_partition_root).lower(),
            )
        for t in joined:
            log.info("table %s joined publication %s", t.qualified, self.publication)
        for t in left:
            log.info("table %s left publication %s", t.qualified, self.publication)
        return Reconciliation(tuple(joined), tuple(left), tuple(sorted(current.values())))

    def _say_kind(self) -> None:
        """Once, and again when it changes: a publication used as it is, and the
        actions the publication leaves out."""
        info = self.info
        if info is None:
            return
        said = (self.managing, info.left_out)
        if said == self._said:
            return
        if not self.managing and (self._said is None or self._said[0]):
            log.warning(
                "publication %s (%s) was not created by pg2sink: streamed as it is, "
                "pg2sink adds and drops no table (-t, -T and --schema do not apply; "
                "--publication-mode manage lets it)",
                self.publication,
                info.kind,
            )
        line = left_out_warning(self.publication, info)
        if line is not None and (self._said is None or self._said[1] != info.left_out):
            log.warning("%s", line)
        self._said = said

    def _ensure_publication(self, info: PublicationInfo | None) -> str | None:
        """Create the publication, or align its publish_via_partition_root with ours;
        returns what to log once the transaction commits."""
        pub = sql.Identifier(self.publication)
        via_root = sql.Literal(self.publish_via_partition_root)
        current = info.via_root if info is not None else None
        if current is None:
            self.conn.execute(
                sql.SQL("CREATE PUBLICATION {} WITH (publish_via_partition_root = {}{})").format(
                    pub, via_root, self.generated.create_option(self.conn)
                )
            )
            self.conn.execute(
                sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(pub, sql.Literal(CREATED_MARK))
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

    def publishes_internal_schema(self) -> bool:
        """Whether the publication, as the last reconcile read it, publishes the tables of
        pg2sink's internal schema: FOR ALL TABLES, or IN SCHEMA naming it."""
        info = self.info
        if info is None or self.managing:
            return False
        return info.all_tables or (
            info.in_schema
            and internal_schema_published(self.conn, self.publication, self.internal_schema)
        )

    def manages(self, info: PublicationInfo | None) -> bool:
        """Whether pg2sink stream would manage the publication `info` (else use it as it
        is); ConfigError for a mode it cannot have. Writes nothing."""
        return self._manages(info, mark=False)

    def kept(self) -> str | None:
        """Why `pg2sink drop` leaves the publication as it is: pg2sink does not manage
        it (--publication-mode); None when it may drop it (or it does not exist)."""
        info = publication_info(self.conn, self.publication)
        if info is None or self._manages(info, mark=False):
            return None
        return (
            f"publication {self.publication} was not created by pg2sink ({info.kind}): "
            "left as it is (--publication-mode manage drops it too)"
        )

    def drop(self) -> bool:
        """Drop the publication; False when it did not exist. ConfigError for one
        pg2sink does not manage (--publication-mode)."""
        kept = self.kept()
        if kept is not None:
            raise ConfigError(kept)
        if not publication_exists(self.conn, self.publication):
            return False
        self.columns.forget(self.conn)
        self.conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(self.publication)))
        return True
