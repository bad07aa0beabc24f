"""Data types as pg_catalog describes them: `PgType`, loaded and cached by oid in `TypeCache`.

pgoutput identifies a column's type only by its oid (and the Type message, for non-built-in
types, by oid, schema and name). Choosing a decoder and an Avro type needs more: whether the
type is an array (and of what), a domain (and over what), an enum (and with which labels).
This module fetches that from pg_type, pg_namespace and pg_enum; it knows nothing about
decoding, which lives in `pg2sink.changelog.typemap`.

See https://www.postgresql.org/docs/current/catalog-pg-type.html for the columns used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["PgType", "TypeCache"]

# An identifier format_type() would print without quotes (ignoring reserved keywords).
_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]*")


def _quote_ident(name: str) -> str:
    if _PLAIN_IDENTIFIER.fullmatch(name):
        return name
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class PgType:
    """One row of pg_type, with the types it refers to resolved."""

    oid: int
    name: str
    """typname, e.g. 'int4', '_int4' (the array of int4), 'mood'."""
    namespace: str
    """nspname of the type's schema, e.g. 'pg_catalog', 'public'."""
    kind: str
    """typtype: 'b' base, 'c' composite, 'd' domain, 'e' enum, 'p' pseudo, 'r' range,
    'm' multirange."""
    category: str
    """typcategory: 'A' array, 'N' numeric, 'S' string, 'U' user-defined ..."""
    element: PgType | None = None
    """The element type of a true array (from typelem); None for everything else,
    including int2vector and oidvector, whose text form is not an array literal."""
    base: PgType | None = None
    """The type a domain is defined over (from typbasetype); None unless kind == 'd'."""
    base_typmod: int = -1
    """The modifier a domain applies to its base type (typtypmod), e.g. the (10,2) of
    `CREATE DOMAIN price AS numeric(10,2)`; -1 for other types or without a modifier."""
    enum_labels: tuple[str, ...] | None = None
    """The labels of an enum in sort order; None unless kind == 'e'."""
    delimiter: str = ","
    """typdelim: the separator between this type's values inside an array literal
    (',' for every built-in type but box)."""

    @property
    def display_name(self) -> str:
        """The type's name as format_type() would spell it, without modifiers.

        Built-in types keep their internal name ('int4', not 'integer'), other types are
        schema-qualified ('public.mood'), arrays end in '[]' ('int4[]', 'public.mood[]').
        """
        if self.element is not None:
            return self.element.display_name + "[]"
        if self.namespace == "pg_catalog":
            return self.name
        return _quote_ident(self.namespace) + "." + _quote_ident(self.name)


# One row per type; `element_oid` is set only for true arrays: format_type() and the array
# I/O functions treat a type with a typelem as an array only when it is varlena and not
# plain storage, which excludes int2vector/oidvector ('1 2') and name/point/box (whose
# typelem only enables subscripting).
_TYPE_QUERY = """
SELECT t.typname,
       n.nspname,
       t.typtype::text,
       t.typcategory::text,
       CASE WHEN t.typelem <> 0 AND t.typlen = -1 AND t.typstorage <> 'p'
            THEN t.typelem END,
       CASE WHEN t.typtype = 'd' THEN t.typbasetype END,
       t.typtypmod,
       t.typdelim::text,
       CASE WHEN t.typtype = 'e' THEN
           ARRAY(SELECT e.enumlabel::text FROM pg_catalog.pg_enum e
                 WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder)
       END
  FROM pg_catalog.pg_type t
  JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
 WHERE t.oid = %s::pg_catalog.oid
"""


class TypeCache:
    """Types by oid, loaded from the catalog on first use and kept until invalidated.

    The connection is an ordinary (non-replication) one; an autocommit connection is best,
    otherwise each lookup runs in its own transaction block (or savepoint).
    """

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._types: dict[int, PgType] = {}

    def get(self, oid: int) -> PgType | None:
        """The type with this oid, or None if the catalog has no such type."""
        found = self._types.get(oid)
        if found is None:
            found = self._load(oid)
            if found is not None:
                self._types[oid] = found
        return found

    def invalidate(self, oid: int) -> None:
        """Forget a type (pgoutput sent a Type message: it may have been redefined).

        Cached types that refer to it (its array type, domains over it) are forgotten too,
        otherwise they would keep the stale definition, e.g. an enum's old labels.
        """
        self._types.pop(oid, None)
        stale = [o for o, t in self._types.items() if _refers_to(t, oid)]
        for o in stale:
            del self._types[o]

    def _load(self, oid: int) -> PgType | None:
        with self._conn.transaction(), self._conn.cursor() as cur:
            cur.execute(_TYPE_QUERY, (oid,))
            row = cur.fetchone()
        if row is None:
            return None
        name, namespace, kind, category, element_oid, base_oid, typmod, delim, labels = row
        # A dangling typelem/typbasetype would be a catalog corruption; keep the type usable
        # (it then decodes as text) rather than fail the whole stream over it.
        element = self.get(element_oid) if element_oid is not None else None
        base = self.get(base_oid) if base_oid is not None else None
        return PgType(
            oid=oid,
            name=name,
            namespace=namespace,
            kind=kind,
            category=category,
            element=element,
            base=base,
            base_typmod=typmod if kind == "d" else -1,
            enum_labels=tuple(labels) if labels is not None else None,
            delimiter=delim,
        )


def _refers_to(t: PgType, oid: int) -> bool:
    ref = t.element or t.base
    while ref is not None:
        if ref.oid == oid:
            return True
        ref = ref.element or ref.base
    return False
