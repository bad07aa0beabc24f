"""At start (and as tables join): what the routing stage would refuse at a table's first
change, refused before the stream starts: a key column excluded or masked by other than
hash, an outbox table without its columns.

The stage decides from each Relation message pgoutput sends; this builds the same
Relations from the catalog (columns in attnum order, the key flag as pgoutput sets it:
every column under REPLICA IDENTITY FULL, else the replica identity index's) and asks
the same questions (stage.check_relation).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any

import psycopg

from pg2sink.catalog.catalog import CatalogLookup
from pg2sink.errors import ConfigError
from pg2sink.logical.messages import Column, Relation
from pg2sink.routing.rules import Rules
from pg2sink.routing.stage import check_relation

__all__ = ["check_tables", "unmatched_rules"]

_RELATIONS = """
SELECT c.oid, n.nspname, c.relname, c.relreplident::text,
       a.attname, a.atttypid::int, a.atttypmod,
       c.relreplident = 'f' OR EXISTS (
           SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND a.attnum = ANY(i.indkey)
             AND CASE c.relreplident WHEN 'd' THEN i.indisprimary
                                     WHEN 'i' THEN i.indisreplident ELSE false END)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.oid = ANY(%s)
ORDER BY c.oid, a.attnum
"""


def relations(conn: psycopg.Connection[Any], oids: Sequence[int]) -> list[Relation]:
    """The Relation messages pgoutput would send for these tables now."""
    rows = conn.execute(_RELATIONS, (list(oids),)).fetchall()
    out = []
    for (oid, namespace, name, identity), columns in groupby(rows, key=lambda r: r[:4]):
        out.append(
            Relation(
                oid,
                namespace,
                name,
                identity,
                tuple(Column(int(bool(r[7])), r[4], r[5], r[6]) for r in columns),
                None,
            )
        )
    return out


def check_tables(
    conn: psycopg.Connection[Any], catalog: CatalogLookup, rules: Rules, oids: Sequence[int]
) -> None:
    """ConfigError for the first table the rules cannot route (stage.check_relation)."""
    if not (rules.excluded or rules.masked or rules.outbox) or not oids:
        return
    for rel in relations(conn, oids):
        check_relation(rules, catalog, rel)


def unmatched_rules(
    conn: psycopg.Connection[Any], rules: Rules, oids: Sequence[int], *, strict: bool
) -> list[str]:
    """The rules that match no table or column of these (published) tables (Rules.unmatched);
    with `strict` (--strict-routing), a ConfigError for the first instead."""
    if not rules.active:
        return []
    tables = [(r.namespace, r.name, [c.name for c in r.columns]) for r in relations(conn, oids)]
    lines = rules.unmatched(tables)
    if strict and lines:
        raise ConfigError(
            f"{lines[0]}: refused with --strict-routing (a misspelt rule would let the "
            "column or change through unfiltered)"
        )
    return lines
