"""What the changelog needs to know from pg_catalog, behind one small object.

pgoutput's Relation message carries column names, type OIDs and typmods; the
type details (arrays, domains, enums) and the real primary key come from the
catalog over a normal connection, cached per OID.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import psycopg
from psycopg.rows import TupleRow

from pg2sink.catalog.server import missing_values, primary_key_columns
from pg2sink.catalog.types import PgType, TypeCache


class CatalogLookup(Protocol):
    """The catalog questions the changelog builder asks."""

    def pg_type(self, oid: int) -> PgType: ...

    def invalidate_type(self, oid: int) -> None: ...

    def primary_key(self, relid: int) -> tuple[str, ...]: ...

    def is_partition(self, relid: int) -> bool:
        """Whether the table is a partition (pg_class.relispartition)."""
        ...


@runtime_checkable
class MissingValueLookup(Protocol):
    """A catalog that also tells columns' missing values (the live one does; recorded
    and test catalogs need not: the builder asks only a catalog that has it)."""

    def missing_values(self, relid: int) -> dict[str, str]:
        """Per column added with a DEFAULT, what rows stored before it read (its text)."""
        ...


def unknown_type(oid: int) -> PgType:
    """Stand-in for a type the catalog no longer knows: its text form is kept."""
    return PgType(
        oid=oid,
        name=f"oid_{oid}",
        namespace="",
        kind="b",
        category="U",
        element=None,
        base=None,
        base_typmod=-1,
        enum_labels=None,
        delimiter=",",
    )


class Catalog:
    """CatalogLookup over a live (non-replication) connection."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self.conn = conn
        self.types = TypeCache(conn)

    def pg_type(self, oid: int) -> PgType:
        return self.types.get(oid) or unknown_type(oid)

    def invalidate_type(self, oid: int) -> None:
        self.types.invalidate(oid)

    def primary_key(self, relid: int) -> tuple[str, ...]:
        return primary_key_columns(self.conn, relid)

    def missing_values(self, relid: int) -> dict[str, str]:
        return missing_values(self.conn, relid)

    def is_partition(self, relid: int) -> bool:
        row = self.conn.execute(
            "SELECT relispartition FROM pg_class WHERE oid = %s", (relid,)
        ).fetchone()
        return bool(row and row[0])
