"""Rows for BigQuery's load jobs: the DuckDB sink's Arrow batches (values.py) made fit for
BigQuery, unchanged TOASTed values read back from BigQuery, and the values old rows read
for a column added with a DEFAULT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
from google.cloud import bigquery

from pg2sink.changelog.pgvalues import PgText
from pg2sink.changelog.records import Modification, Schema
from pg2sink.formats.jsonenc import dumps
from pg2sink.logical.messages import UNCHANGED_TOAST
from pg2sink.sinks.bigquery.schema import bigquery_type, quote
from pg2sink.sinks.warehouse.layout import OPERATION, POSITION, Layout
from pg2sink.sinks.warehouse.toast import Toast
from pg2sink.sinks.warehouse.values import arrow_batch, missing_arrays

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from pg2sink.sinks.bigquery.warehouse import Warehouse

__all__ = ["BigQueryToast", "missing_values", "state_rows", "table_rows"]

TEXT = "_pg2sink_text"
#: keys per query job reading the previous rows of unchanged TOASTed values
PREFETCH_KEYS = 500


def table_rows(
    layout: Layout,
    rows: Sequence[tuple[int, Modification]],
    unchanged: Sequence[list[str] | None],
) -> pa.Table:
    """The raw table rows of `rows` (values.arrow_batch), the map of PostgreSQL's text
    for values a type cannot hold as JSON text (BigQuery has no MAP)."""
    import pyarrow as pa

    table = arrow_batch(layout, rows, unchanged)
    texts = [None if t is None else dict(t) for t in table.column(TEXT).to_pylist()]
    for c in layout.columns:
        if c.type.endswith("[]"):
            table = _arrays_without_nulls(table, c.raw, c.column, texts)
            if c.before is not None:  # before-images keep no text (values.arrow_batch)
                table = _arrays_without_nulls(table, c.before, c.column, [None] * len(rows))
    as_json = [None if t is None else orjson.dumps(t).decode() for t in texts]
    index = table.schema.get_field_index(TEXT)
    return table.set_column(index, TEXT, pa.array(as_json, pa.string()))


def _arrays_without_nulls(
    table: pa.Table, raw: str, column: str, texts: list[dict[str, str] | None]
) -> pa.Table:
    """BigQuery's arrays hold no NULL element: such an array is left out (an empty array:
    BigQuery has no NULL array either) and its JSON form kept in `texts`, as values.py
    keeps values a type cannot hold."""
    import pyarrow as pa

    values = table.column(raw).to_pylist()
    if not any(v is not None and None in v for v in values):
        return table
    for i, v in enumerate(values):
        if v is not None and None in v:
            texts[i] = {**(texts[i] or {}), column: dumps(_json_form(v)).decode()}
            values[i] = None
    index = table.schema.get_field_index(raw)
    return table.set_column(index, raw, pa.array(values, table.schema.field(raw).type))


def state_rows(slot: str, lsn: int, position: int, imports: Sequence[str] = ()) -> pa.Table:
    """The state table's row of a batch: also the staging tables it loaded."""
    import pyarrow as pa

    return pa.table(
        {
            "slot": pa.array([slot], pa.string()),
            "lsn": pa.array([lsn], pa.int64()),
            "position": pa.array([position], pa.int64()),
            "imports": pa.array([list(imports)], pa.list_(pa.string())),
        }
    )


def missing_values(schema: Schema) -> dict[str, str]:
    """The text of each column's missing value (ADD COLUMN ... DEFAULT): the value as the
    raw rows hold it (values.value_array), cast to text by Arrow; the view SAFE_CASTs it
    to the column's BigQuery type. A value Arrow gives no text for (an array, a struct)
    is left out: the view reads NULL there, as the DuckDB sink's does for a value its
    type cannot hold."""
    if not schema.missing:
        return {}
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    out: dict[str, str] = {}
    for name, _, array in missing_arrays(schema):
        try:
            text = pc.cast(array, pa.string())[0].as_py()
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            continue
        if text is not None:
            out[name] = text
    return out


class BigQueryToast(Toast):
    """The DuckDB sink's Toast (fills unchanged TOASTed values from the key's previous
    row), the previous rows read from the BigQuery raw table: those of every key a batch
    needs in one query job (a job per key would take a second each on BigQuery)."""

    def __init__(self, warehouse: Warehouse, layout: Layout) -> None:
        self.warehouse = warehouse
        self.layout = layout
        self.keys = [c.column for c in layout.key_columns()]
        self._fetched: dict[tuple[object, ...], dict[str, object]] = {}

    def fill(
        self, rows: list[tuple[int, Modification]]
    ) -> tuple[list[tuple[int, Modification]], list[list[str] | None]]:
        """Toast.fill, the stored rows of the keys it may look up read first."""
        wanted: set[tuple[object, ...]] = set()
        for _, m in rows:
            if m.after is not None and any(v is UNCHANGED_TOAST for v in m.after.values()):
                source = m.before if m.before and self._has_key(m.before) else m.after
                key = self._key(source)
                if all(v is not None and not isinstance(v, PgText) for v in key):
                    wanted.add(key)
        keys = sorted(wanted, key=repr)
        for i in range(0, len(keys), PREFETCH_KEYS):
            self._prefetch(keys[i : i + PREFETCH_KEYS])
        return super().fill(rows)

    def _select(self, where: str) -> str:
        """The last INSERT/UPDATE/IMPORT row since the last TRUNCATE of each key `where`
        selects."""
        layout = self.layout
        raw = quote(f"{self.warehouse.dataset}.{layout.raw}")
        columns = ", ".join(quote(c.raw) for c in layout.live())
        partition = ", ".join(quote(c.raw) for c in layout.key_columns())
        return (
            f"SELECT TO_JSON_STRING({TEXT}), {columns} FROM {raw} "
            f"WHERE {OPERATION} IN ('INSERT', 'UPDATE', 'IMPORT') AND ({where}) "
            f"AND {POSITION} > COALESCE((SELECT MAX({POSITION}) FROM {raw} "
            f"WHERE {OPERATION} = 'TRUNCATE'), -1) "
            f"QUALIFY ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {POSITION} DESC) = 1"
        )

    def _where(self, keys: Sequence[tuple[object, ...]]) -> tuple[str, list[Any]]:
        """A condition selecting `keys`, and its query parameters."""
        params = []
        ors = []
        for n, key in enumerate(keys):
            ands = []
            for i, (c, value) in enumerate(zip(self.layout.key_columns(), key, strict=True)):
                field = bigquery_type(c.raw, c.type)
                params.append(bigquery.ScalarQueryParameter(f"k{n}_{i}", field.type, _param(value)))
                ands.append(f"{quote(c.raw)} = @k{n}_{i}")
            ors.append(" AND ".join(ands))
        return " OR ".join(f"({a})" for a in ors), params

    def _prefetch(self, keys: Sequence[tuple[object, ...]]) -> None:
        """The stored rows of `keys`, by the key values read back (a key whose values
        read back differently is looked up alone by `_stored_row`)."""
        where, params = self._where(keys)
        live = self.layout.live()
        at = [live.index(c) for c in self.layout.key_columns()]
        for row in self.warehouse.query(self._select(where), params):
            values = self._values(row)
            self._fetched[tuple(list(values.values())[i] for i in at)] = values

    def _stored_row(self, key: tuple[object, ...]) -> dict[str, object] | None:
        """The key's last INSERT/UPDATE/IMPORT row since the last TRUNCATE."""
        if key in self._fetched:
            return self._fetched[key]
        where, params = self._where([key])
        found = self.warehouse.query(self._select(where), params)
        return self._values(found[0]) if found else None

    def _values(self, row: Any) -> dict[str, object]:
        """A raw row's values as the stream gives them (PostgreSQL's text as PgText)."""
        texts: dict[str, str] = orjson.loads(row[0]) if row[0] not in (None, "null") else {}
        values: dict[str, object] = {}
        for c, value in zip(self.layout.live(), list(row)[1:], strict=True):
            text = texts.get(c.column)
            values[c.column] = PgText(text) if text is not None else value
        return values


def _json_form(value: Any) -> Any:
    """A value for JSON: float NaN and infinities as PostgreSQL writes them (JSON has no
    such numbers; orjson would write null)."""
    if isinstance(value, list):
        return [_json_form(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _param(value: object) -> Any:
    return str(value) if isinstance(value, PgText) else value
