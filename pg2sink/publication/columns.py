"""Publication column lists for --exclude-column: excluded values never leave the server.

Each member with columns an --exclude-column pattern matches is published with a column
list of its other columns (PostgreSQL 15,
https://www.postgresql.org/docs/15/logical-replication-col-lists.html). A list is
fixed, so pg2sink's event trigger (migration 0004, `extend_column_lists`) resets it in
the transaction of every ALTER TABLE of such a member, from the patterns stored here as
PostgreSQL regular expressions: a column added is in the changes right after the ADD
COLUMN, an excluded one never. A listed column is a dependency PostgreSQL refuses to drop
without CASCADE; a second trigger (migration 0005, `unlist_before_drop`, at the start of
an ALTER TABLE ... DROP of such a member) takes the member out of the publication, and
the first puts it back with its new list at the end of the same statement.

Where PostgreSQL refuses a list, or the trigger cannot exist, the table is published
whole and the routing stage drops the excluded values on arrival (as before); which
tables and why is logged when it starts being so:
- REPLICA IDENTITY FULL with UPDATE or DELETE published: a list must hold every column;
- a partitioned table without publish_via_partition_root: no list on its root;
- a list (or row filter) set by hand on the member: the user's, left as it is;
- no PostgreSQL 15, no migrated internal schema (--decode-only), or no right to create
  the event trigger (it needs a superuser).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.publication.patterns import TablePattern

log = logging.getLogger(__name__)

#: ALTER TABLE of a listed member runs migration 0004's function in its transaction
TRIGGER_SUFFIX = "_column_lists"
#: (name suffix, event, function): the event triggers that keep the lists
TRIGGERS = (
    (TRIGGER_SUFFIX, "ddl_command_end", "extend_column_lists"),
    # before an ALTER TABLE ... DROP: the member leaves the publication (migration 0005)
    ("_column_drops", "ddl_command_start", "unlist_before_drop"),
)


class ColumnRule(Protocol):
    """An --exclude-column pattern (routing.rules.ColumnRule; routing imports this
    package, so it is named by shape)."""

    @property
    def table(self) -> TablePattern: ...
    @property
    def column(self) -> re.Pattern[str]: ...
    def matches(self, schema: str, table: str, column: str) -> bool: ...


_COLUMNS = """
SELECT c.oid, c.relkind::text, c.relreplident::text, a.attname
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.oid = ANY(%s) AND a.attgenerated = ''
ORDER BY c.oid, a.attnum
"""

# a member's list as column names, NULL without one; whether it has a row filter
_LISTS = """
SELECT pr.prrelid,
       (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a
        WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs::int2[])),
       pr.prqual IS NOT NULL
FROM pg_publication p JOIN pg_publication_rel pr ON pr.prpubid = p.oid
WHERE p.pubname = %s
"""


@dataclass(frozen=True)
class _Table:
    oid: int
    schema: str
    name: str
    relkind: str
    identity: str
    columns: tuple[str, ...]


def _regex(pattern: str) -> str:
    # fullmatch in Python; psql patterns only use syntax both dialects read alike
    return f"^(?:{pattern})$"


class ColumnLists:
    """Keeps the column lists of one publication's members in line with --exclude-column.

    `sync()` runs inside PublicationManager.reconcile()'s transaction and lock."""

    def __init__(
        self, publication: str, internal_schema: str, exclusions: Sequence[ColumnRule]
    ) -> None:
        self.publication = publication
        self.internal_schema = internal_schema
        self.exclusions = tuple(exclusions)
        self._stored = False
        self._failure: str | None = None
        #: the last reconcile's tables whose excluded values travel: oid -> why
        self.travelling: dict[int, str] = {}
        self._reported: dict[int, str] = {}

    def _internal(self, name: str) -> sql.Identifier:
        return sql.Identifier(self.internal_schema, name)

    def _migrated(self, conn: psycopg.Connection[TupleRow]) -> bool:
        row = conn.execute(
            "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'column_lists'",
            (self.internal_schema,),
        ).fetchone()
        return row is not None

    def _store(self, conn: psycopg.Connection[TupleRow]) -> str | None:
        """Once per process: the patterns for the trigger, and the trigger; why lists
        cannot be used, or None."""
        if conn.info.server_version < 150000:
            return "PostgreSQL before 15 has no column lists"
        if not self._migrated(conn):
            return "pg2sink's internal schema is not migrated"
        if self._stored:  # tried once per process: no CREATE refused at every poll
            return self._failure
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE publication = %s").format(
                self._internal("column_exclusions")
            ),
            (self.publication,),
        )
        for rule in self.exclusions:
            schema = rule.table.schema
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (publication, schema_re, table_re, column_re)"
                    " VALUES (%s, %s, %s, %s)"
                ).format(self._internal("column_exclusions")),
                (
                    self.publication,
                    None if schema is None else _regex(schema.pattern),
                    _regex(rule.table.table.pattern),
                    _regex(rule.column.pattern),
                ),
            )
        self._failure = self._ensure_trigger(conn) if self.exclusions else None
        self._stored = True
        return self._failure

    def _ensure_trigger(self, conn: psycopg.Connection[TupleRow]) -> str | None:
        for suffix, event, function in TRIGGERS:
            name = self.internal_schema + suffix
            found = conn.execute("SELECT 1 FROM pg_event_trigger WHERE evtname = %s", (name,))
            if found.fetchone() is not None:
                continue
            try:
                with conn.transaction():  # a savepoint: the reconcile goes on without it
                    conn.execute(
                        sql.SQL(
                            "CREATE EVENT TRIGGER {} ON {} WHEN TAG IN ('ALTER TABLE')"
                            " EXECUTE FUNCTION {}()"
                        ).format(sql.Identifier(name), sql.SQL(event), self._internal(function))
                    )
            except psycopg.errors.InsufficientPrivilege:
                return (
                    "creating the event trigger that extends a column list at ADD COLUMN "
                    "needs a superuser"
                )
            log.info("event trigger %s keeps the column lists of excluded columns", name)
        return None

    def sync(
        self,
        conn: psycopg.Connection[TupleRow],
        members: Sequence[tuple[int, str, str]],
        joined: set[int],
        via_root: bool,
    ) -> None:
        """Give each member (oid, schema, name) the list it needs; `joined` were just
        added (whole). Afterwards `travelling` says where lists could not be used."""
        self.travelling = {}
        marked = self._marked(conn)
        if not self.exclusions and not marked:
            return
        failure = self._store(conn)
        if failure is not None and not marked:
            self.travelling = {oid: failure for oid, _, _ in self._excluding(conn, members)}
            return
        lists = {r[0]: (r[1], r[2]) for r in conn.execute(_LISTS, (self.publication,))}
        publishes_old = self._publishes_old(conn)
        keep = set()
        for t in self._tables(conn, members):
            excluded = {c for c in t.columns if self._excludes(t, c)}
            current, filtered = lists.get(t.oid, (None, False))
            ours = t.oid in marked
            why = failure
            if not excluded:
                why = "no column excluded"
            elif not ours and t.oid not in joined and (current is not None or filtered):
                if current is not None and not excluded & set(current):
                    continue  # the user's list leaves them out already
                why = "its column list or row filter was set by hand (left as it is)"
            elif t.identity == "f" and publishes_old:
                why = "REPLICA IDENTITY FULL: a list must hold every column"
            elif t.relkind == "p" and not via_root:
                why = "a partitioned table needs --publish-via-partition-root for a list"
            wanted = None if why else tuple(c for c in t.columns if c not in excluded)
            if wanted is not None:
                keep.add(t.oid)
            elif excluded:
                self.travelling[t.oid] = why or ""
            if (ours or wanted is not None) and (current and tuple(current)) != wanted:
                self._set_list(conn, t, wanted)
        self._mark(conn, keep)

    def hands_off(
        self, conn: psycopg.Connection[TupleRow], members: Sequence[tuple[int, str, str]]
    ) -> None:
        """A publication pg2sink does not manage (--publication-mode): no list is set;
        `travelling` says where excluded values reach pg2sink (its own lists may keep
        them on the server)."""
        self.travelling = {}
        if not self.exclusions:
            return
        if conn.info.server_version < 150000:
            lists: dict[int, list[str] | None] = {}
            why = "PostgreSQL before 15 has no column lists"
        else:
            lists = {r[0]: r[1] for r in conn.execute(_LISTS, (self.publication,))}
            why = "the publication is not pg2sink's to alter (--publication-mode)"
        for t in self._tables(conn, members):
            excluded = {c for c in t.columns if self._excludes(t, c)}
            listed = lists.get(t.oid)
            if excluded and (listed is None or excluded & set(listed)):
                self.travelling[t.oid] = why

    def _excludes(self, t: _Table, column: str) -> bool:
        return any(r.matches(t.schema, t.name, column) for r in self.exclusions)

    def _excluding(
        self, conn: psycopg.Connection[TupleRow], members: Sequence[tuple[int, str, str]]
    ) -> list[tuple[int, str, str]]:
        tables = self._tables(conn, members)
        return [
            (t.oid, t.schema, t.name)
            for t in tables
            if any(self._excludes(t, c) for c in t.columns)
        ]

    def _tables(
        self, conn: psycopg.Connection[TupleRow], members: Sequence[tuple[int, str, str]]
    ) -> list[_Table]:
        names = {oid: (schema, name) for oid, schema, name in members}
        rows = conn.execute(_COLUMNS, (list(names),)).fetchall()
        tables: dict[int, _Table] = {}
        for oid, relkind, identity, column in rows:
            t = tables.get(oid) or _Table(oid, *names[oid], relkind, identity, ())
            tables[oid] = _Table(t.oid, t.schema, t.name, relkind, identity, (*t.columns, column))
        return list(tables.values())

    def _publishes_old(self, conn: psycopg.Connection[TupleRow]) -> bool:
        row = conn.execute(
            "SELECT pubupdate OR pubdelete FROM pg_publication WHERE pubname = %s",
            (self.publication,),
        ).fetchone()
        return bool(row and row[0])

    def _marked(self, conn: psycopg.Connection[TupleRow]) -> set[int]:
        if conn.info.server_version < 150000 or not self._migrated(conn):
            return set()
        rows = conn.execute(
            sql.SQL("SELECT relid FROM {} WHERE publication = %s").format(
                self._internal("column_lists")
            ),
            (self.publication,),
        )
        return {int(r[0]) for r in rows}

    def _mark(self, conn: psycopg.Connection[TupleRow], oids: set[int]) -> None:
        table = self._internal("column_lists")
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE publication = %s").format(table), (self.publication,)
        )
        for oid in sorted(oids):
            conn.execute(
                sql.SQL("INSERT INTO {} (publication, relid) VALUES (%s, %s)").format(table),
                (self.publication, oid),
            )

    def _set_list(
        self, conn: psycopg.Connection[TupleRow], t: _Table, columns: tuple[str, ...] | None
    ) -> None:
        """DROP and ADD in one transaction (SET TABLE would replace every member)."""
        pub, table = sql.Identifier(self.publication), sql.Identifier(t.schema, t.name)
        conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(pub, table))
        listed = (
            sql.SQL(" ({})").format(sql.SQL(", ").join(map(sql.Identifier, columns)))
            if columns is not None
            else sql.SQL("")
        )
        conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}{}").format(pub, table, listed))

    def report(self, tables: dict[int, str]) -> None:
        """After the commit: one line when the set of tables whose excluded values travel
        changed; `tables` names them by oid."""
        if self.travelling == self._reported:
            return
        self._reported = dict(self.travelling)
        if self.travelling:
            log.warning(
                "publication %s: excluded columns still travel to pg2sink (dropped on "
                "arrival) for %s",
                self.publication,
                "; ".join(f"{tables.get(o, o)}: {why}" for o, why in self.travelling.items()),
            )

    def forget(self, conn: psycopg.Connection[TupleRow]) -> None:
        """At `pg2sink drop`: the publication's patterns and marks."""
        if conn.info.server_version < 150000 or not self._migrated(conn):
            return
        for name in ("column_exclusions", "column_lists"):
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE publication = %s").format(self._internal(name)),
                (self.publication,),
            )
