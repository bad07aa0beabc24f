"""Modifications of one table -> an Arrow table of its raw table's columns.

The sink's rows hold the stream's Python values (records.py: Decimal, datetime,
date, time, bytes, lists...), which Arrow takes as they are, typed by the column's DuckDB
type. A value the DuckDB type cannot hold (docs/types.md: `PgText` for infinity, BC and
after-9999 dates and timestamps, time 24:00:00, NaN in numeric(p,s), an array with other
lower bounds; a `PgArray` of several dimensions, an array holding such elements) is NULL
in its column and PostgreSQL's text is in the row's `_pg2sink_text` map under the column's
name (an array with special elements: its JSON form, as the file sink writes it). Float
NaN and infinities are DuckDB floats; an unconstrained numeric (or one over 38 digits) is
its exact digits as text.

An UPDATE's unchanged TOASTed value (UNCHANGED_TOAST) is filled in before conversion
(toast.py): `arrow_batch` raises `UnfilledError` when it meets one. Rows without any (nearly
all) are not searched for it value by value: Arrow refuses the object in every column
type, and only a column Arrow refused is looked at.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from functools import cache
from typing import TYPE_CHECKING

from pg2sink.changelog.pgvalues import PgArray, PgText
from pg2sink.changelog.records import Modification, Schema
from pg2sink.formats.jsonenc import dumps
from pg2sink.logical.messages import UNCHANGED_TOAST
from pg2sink.sinks.warehouse.layout import Layout, duckdb_type, non_null, raw_columns

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = [
    "UnfilledError",
    "arrow_batch",
    "arrow_rows",
    "arrow_type",
    "json_marked",
    "missing_arrays",
    "value_array",
    "without_pandas",
]

_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")


def without_pandas() -> None:
    """Keep pyarrow from importing pandas in this process (about 50 MB), unless pandas is
    imported already. `pa.array` asks pyarrow's pandas shim whether its input is a pandas
    object, and the shim imports pandas the first time (once per process) whenever it is
    installed; nothing of this sink needs it. The shim's one attempt is made here with
    `import pandas` failing, so it records pandas as missing. Called by the stream's sink
    at open, before any conversion; pyarrow's to_pandas() and the like then fail in this
    process, which uses none of them."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    sys.meta_path.insert(0, _NoPandas)
    try:
        pa.array([0], pa.int64())
    finally:
        sys.meta_path.remove(_NoPandas)


class _NoPandas:
    """A module finder that refuses pandas (`without_pandas`)."""

    @staticmethod
    def find_spec(name: str, *_: object) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not used by the duckdb sink", name=name)


@cache
def arrow_type(duck: str) -> pa.DataType:
    """The Arrow type a DuckDB column of type `duck` is loaded from (UUID and JSON as
    strings: DuckDB casts them on insert)."""
    import pyarrow as pa

    if duck.endswith("[]"):
        return pa.list_(arrow_type(duck[:-2]))
    match = _DECIMAL.fullmatch(duck)
    if match:
        return pa.decimal128(int(match[1]), int(match[2]))
    return {
        "BOOLEAN": pa.bool_(),
        "SMALLINT": pa.int16(),
        "INTEGER": pa.int32(),
        "BIGINT": pa.int64(),
        "VARCHAR": pa.string(),
        "JSON": pa.string(),
        "UUID": pa.string(),
        "BLOB": pa.binary(),
        "FLOAT": pa.float32(),
        "DOUBLE": pa.float64(),
        "DATE": pa.date32(),
        "TIME": pa.time64("us"),
        "TIMESTAMP": pa.timestamp("us"),
        "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
        "VARCHAR[]": pa.list_(pa.string()),
        "MAP(VARCHAR, VARCHAR)": pa.map_(pa.string(), pa.string()),
    }[duck]


class UnfilledError(Exception):
    """A row holds an unchanged TOASTed value (UNCHANGED_TOAST): fill it in first."""


class _NotHeldError(Exception):
    """A value its DuckDB type cannot hold: the text kept for it."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _plain(value: object) -> object:
    """A value DuckDB holds as it is; PostgreSQL's text (PgText) it cannot hold."""
    if isinstance(value, PgText):
        raise _NotHeldError(str(value))
    return value


def _float(value: object) -> object:
    # NaN and the infinities come as PgText; DuckDB's floats hold them
    return float(value) if isinstance(value, PgText) else value


def _digits(value: object) -> object:
    """An exact numeric as text: PostgreSQL's digits ('NaN' and infinities as they are)."""
    return format(value, "f") if isinstance(value, Decimal) else value


@cache
def converter(duck: str) -> Callable[[object], object]:
    """The function giving a non-null value of DuckDB type `duck` to Arrow; raises
    _NotHeldError for a value the type cannot hold."""
    if duck.endswith("[]"):
        element = converter(duck[:-2])

        def array(value: object) -> object:
            if isinstance(value, PgText):
                raise _NotHeldError(str(value))
            if isinstance(value, PgArray):  # several dimensions: a LIST has one
                raise _NotHeldError(value.text)
            assert isinstance(value, list)
            try:
                return [None if v is None else element(v) for v in value]
            except _NotHeldError:
                raise _NotHeldError(dumps(value).decode()) from None

        return array
    if duck in ("FLOAT", "DOUBLE"):
        return _float
    if duck == "VARCHAR":
        return _digits
    return _plain


def _column(
    values: Sequence[object], duck: str, name: str, texts: list[dict[str, str] | None]
) -> pa.Array:
    """An Arrow array of one column; specials go to `texts` (per row) under `name`;
    UnfilledError for an UNCHANGED_TOAST."""
    import pyarrow as pa

    if not duck.endswith("[]"):
        try:
            # Most columns hold only values Arrow takes as they are: one call in C. A
            # PgText (or a Decimal for text) makes Arrow refuse a scalar column, never
            # accept it changed, and so does UNCHANGED_TOAST; then each value goes
            # through its converter. Not lists: Arrow would take a PgText ('[0:1]={a,b}')
            # as a sequence of characters.
            return pa.array(values, arrow_type(duck))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            pass
    convert = converter(duck)
    out: list[object] = []
    for i, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        if value is UNCHANGED_TOAST:
            raise UnfilledError(name)
        try:
            out.append(convert(value))
        except _NotHeldError as special:
            out.append(None)
            row = texts[i]
            if row is None:
                row = texts[i] = {}
            row[name] = special.text
    return pa.array(out, arrow_type(duck))


def value_array(value: object, duck: str) -> pa.Array | None:
    """One value as a one-element Arrow array of DuckDB type `duck`; None when the type
    cannot hold it."""
    texts: list[dict[str, str] | None] = [None]
    array = _column([value], duck, "", texts)
    return None if texts[0] else array


def missing_arrays(schema: Schema) -> Iterator[tuple[str, str, pa.Array]]:
    """Per column of `schema` with a missing value (ADD COLUMN ... DEFAULT) its type can
    hold: its name, its DuckDB type and the value as a one-element Arrow array (a value
    the type cannot hold is left out: the views read NULL there, as for such values in
    the rows)."""
    fields = {f["pg.column"]: f for f in schema.schema["fields"]}
    for name, value in schema.missing.items():
        field = fields.get(name)
        if field is None or value is None:
            continue
        duck = duckdb_type(non_null(field["type"]))
        array = value_array(value, duck)
        if array is not None:
            yield name, duck, array


def arrow_batch(
    layout: Layout,
    rows: Sequence[tuple[int, Modification]],
    unchanged: Sequence[list[str] | None],
) -> pa.Table:
    """The raw table rows of `rows` ((position, Modification), in order); `unchanged`
    gives per row the columns whose unchanged TOASTed value was filled in (or None)."""
    return arrow_rows(layout, [p for p, _ in rows], [m for _, m in rows], unchanged)


def arrow_rows(
    layout: Layout,
    positions: Sequence[int],
    rows: Sequence[Modification],
    unchanged: Sequence[list[str] | None] | None = None,
) -> pa.Table:
    """The raw table rows of `rows` (in order, at `positions`); `unchanged` gives per row
    the columns whose unchanged TOASTed value was filled in (or None). UnfilledError when
    a row holds UNCHANGED_TOAST."""
    import pyarrow as pa

    n = len(rows)
    texts: list[dict[str, str] | None] = [None] * n
    arrays: list[pa.Array] = []
    befores = [m.before for m in rows]
    # INSERTs and UPDATEs that keep their key (nearly every row) have no before-image
    no_before = befores.count(None) == n
    for c in layout.columns:
        if c.before is None:
            continue
        if no_before:
            arrays.append(pa.nulls(n, arrow_type(c.type)))
        else:
            old = [None if b is None else b.get(c.column) for b in befores]
            arrays.append(_column(old, c.type, c.column, [None] * n))
    afters = [m.after for m in rows]
    for c in layout.columns:
        values = [None if a is None else a.get(c.column) for a in afters]
        arrays.append(_column(values, c.type, c.column, texts))
    meta = [
        pa.array(positions, pa.int64()),
        _same_or_array([m.timestamp for m in rows], arrow_type("TIMESTAMPTZ")),
        pa.array([m.lsn for m in rows], pa.int64()),
        pa.array([m.sequence for m in rows], pa.int64()),
        pa.array([m.xid for m in rows], pa.int64()),
        # Operation is a StrEnum: Arrow takes its members as the strings they are
        pa.array([m.operation for m in rows], pa.string()),
        _nulls_or_array(unchanged, n, arrow_type("VARCHAR[]")),
        _nulls_or_array(
            [None if t is None else list(t.items()) for t in texts]
            if texts.count(None) < n
            else None,
            n,
            arrow_type("MAP(VARCHAR, VARCHAR)"),
        ),
    ]
    return pa.Table.from_arrays([*meta, *arrays], names=list(raw_columns(layout)))


def _same_or_array(values: list[object], type_: pa.DataType) -> pa.Array:
    """`values` as an Arrow array: one conversion repeated when they are all equal (the
    commit time of one transaction's rows is one object)."""
    import pyarrow as pa

    # list.count compares by identity first: a C loop over one transaction's rows
    if values.count(values[0]) == len(values):
        return pa.repeat(pa.scalar(values[0], type_), len(values))
    return pa.array(values, type_)


def _nulls_or_array(values: Sequence[object] | None, n: int, type_: pa.DataType) -> pa.Array:
    """`values` as an Arrow array, or `n` NULLs when there are none."""
    import pyarrow as pa

    if values is None or values.count(None) == n:
        return pa.nulls(n, type_)
    return pa.array(values, type_)


def json_marked(table: pa.Table, layout: Layout) -> pa.Table:
    """`table` with its JSON columns typed as Arrow's JSON extension type (the same
    strings): DuckDB takes such a column as JSON as it is, where it would parse every
    string of a VARCHAR column it casts to JSON. Their values are PostgreSQL's text of a
    json or jsonb value, valid JSON. Unchanged with a pyarrow without the type."""
    import pyarrow as pa

    json_type = getattr(pa, "json_", None)  # pyarrow 19 and later
    if json_type is None:
        return table
    for c in layout.columns:
        if c.type != "JSON":
            continue
        for name in (c.raw, c.before):
            if name is not None:
                i = table.schema.get_field_index(name)
                column = table.column(i).combine_chunks()
                marked = pa.ExtensionArray.from_storage(json_type(pa.string()), column)
                table = table.set_column(i, pa.field(name, marked.type), marked)
    return table
