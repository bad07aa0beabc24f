"""Unchanged TOASTed values filled in before a row is written (docs/sinks/duckdb.md); the
BigQuery sink's BigQueryToast reads the previous rows from its own tables.

An UPDATE that leaves a TOASTed value unchanged does not carry it (UNCHANGED_TOAST in
`after`). The sink writes whole rows instead, so that the view needs no look-back: the
value comes from the key's previous row, in the batch or in the raw table.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any

from pg2sink.changelog.pgvalues import PgText
from pg2sink.changelog.records import Modification, Operation
from pg2sink.logical.messages import UNCHANGED_TOAST
from pg2sink.sinks.warehouse.layout import OPERATION, POSITION, Column, Layout, quote

if TYPE_CHECKING:
    import duckdb

__all__ = ["Toast"]


class Toast:
    """Fills unchanged TOASTed values (UNCHANGED_TOAST) from the key's previous row: an
    earlier row of the same batch, else the raw table's last row of the key. For a
    key-changing UPDATE the previous row is the old key's."""

    def __init__(self, con: duckdb.DuckDBPyConnection, layout: Layout) -> None:
        self.con = con
        self.layout = layout
        self.keys = [c.column for c in layout.key_columns()]

    def fill(
        self, rows: list[tuple[int, Modification]]
    ) -> tuple[list[tuple[int, Modification]], list[list[str] | None]]:
        """The rows with their values filled in, and per row the filled columns."""
        unchanged: list[list[str] | None] = [None] * len(rows)
        if not any(_unchanged(m.after) for _, m in rows):
            return rows, unchanged
        latest: dict[tuple[object, ...], dict[str, object] | None] = {}
        out: list[tuple[int, Modification]] = []
        for i, (position, m) in enumerate(rows):
            if m.operation is Operation.TRUNCATE:
                latest.clear()
                latest[()] = None  # nothing from before the TRUNCATE
            elif m.after is None:
                latest[self._key(m.before)] = None
            else:
                columns = _unchanged(m.after)
                if columns:
                    source = m.before if m.before and self._has_key(m.before) else m.after
                    previous = self._previous(self._key(source), latest)
                    after = {
                        c: (previous or {}).get(c) if v is UNCHANGED_TOAST else v
                        for c, v in m.after.items()
                    }
                    m = dataclasses.replace(m, after=after)
                    unchanged[i] = columns
                latest[self._key(m.after)] = m.after
            out.append((position, m))
        return out, unchanged

    def _has_key(self, values: dict[str, object]) -> bool:
        return bool(self.keys) and all(values.get(k) is not None for k in self.keys)

    def _key(self, values: dict[str, object] | None) -> tuple[object, ...]:
        return tuple((values or {}).get(k) for k in self.keys)

    def _previous(
        self, key: tuple[object, ...], latest: dict[tuple[object, ...], dict[str, object] | None]
    ) -> dict[str, object] | None:
        """The key's row before this one: in the batch, else the raw table's."""
        if key in latest:
            return latest[key]
        if () in latest or not self.keys:  # truncated in this batch, or no key to look by
            return None
        return self._stored_row(key)

    def _stored_row(self, key: tuple[object, ...]) -> dict[str, object] | None:
        """The key's last INSERT/UPDATE/IMPORT row since the last TRUNCATE, values as the
        stream gives them (PostgreSQL's text as PgText where the column has NULL)."""
        layout = self.layout
        live: list[Column] = layout.live()
        raw = quote(layout.raw)
        where = " AND ".join(f"{quote(c.raw)} = ?" for c in layout.key_columns())
        query = (
            f"SELECT _pg2sink_text, {', '.join(quote(c.raw) for c in live)} FROM {raw} "
            f"WHERE {OPERATION} IN ('INSERT', 'UPDATE', 'IMPORT') AND {where} AND {POSITION} > "
            f"coalesce((SELECT max({POSITION}) FROM {raw} WHERE {OPERATION} = 'TRUNCATE'), -1) "
            f"ORDER BY {POSITION} DESC LIMIT 1"
        )
        # fetchall: DuckDB wants a result read to its end before the next statement
        found = self.con.execute(query, [_param(v) for v in key]).fetchall()
        if not found:
            return None
        row = found[0]
        texts: dict[str, str] = row[0] or {}
        values = {}
        for c, value in zip(live, row[1:], strict=True):
            text = texts.get(c.column)
            values[c.column] = PgText(text) if text is not None else _stream_value(value)
        return values


def _unchanged(after: dict[str, object] | None) -> list[str]:
    """The columns of `after` holding UNCHANGED_TOAST."""
    # `in` compares by identity first (UnchangedToast has no __eq__): a C loop per row
    if after is None or UNCHANGED_TOAST not in after.values():
        return []
    return [c for c, v in after.items() if v is UNCHANGED_TOAST]


def _stream_value(value: Any) -> object:
    """A value read back from DuckDB as the stream has it (a UUID is its text)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [_stream_value(v) for v in value]
    return value


def _param(value: object) -> object:
    """A key value as a query parameter."""
    return str(value) if isinstance(value, PgText) else value
