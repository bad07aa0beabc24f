"""An import batch as the rows of a staged Parquet file, built with Arrow kernels (C++).

The reference path (values.py `arrow_batch`) decodes every value of a batch into the
stream's Python value (changelog/batches.py `BatchDecoder`), builds an IMPORT
Modification per row, then Arrow columns of the raw table's DuckDB types: Python work
per value (`make bench-import ARGS="--sink duckdb"`). `StagedColumns` builds the same Arrow
table a column at a time from PostgreSQL's text instead, by the column's value kind
(changelog.codecs.KINDS) and DuckDB type (layout.duckdb_type):

| kind (DuckDB type)                              | column                                  |
|-------------------------------------------------|-----------------------------------------|
| text, uuid (VARCHAR, JSON, UUID)                | the text as is                          |
| numeric, decimal over 38 digits (VARCHAR)       | the text as is (numeric_out's digits)   |
| boolean (BOOLEAN)                               | t / f                                   |
| int, long (SMALLINT, INTEGER, BIGINT)           | Arrow's cast of the text                |
| float, double (FLOAT, DOUBLE)                   | Arrow's cast to double (then to float)  |
| decimal (DECIMAL(p,s))                          | Arrow's cast of the text                |
| date, timestamp, timestamptz, time              | Arrow's cast of the ISO text            |
| bytes, arrays                                   | the reference path                      |

A kernel is used for a column only when a regular expression vouches for every value's
text (the forms PostgreSQL's output functions print for ordinary values: no NaN,
infinity, BC or year 10000, time 24:00:00, offset other than +00...); a column with
any other value goes, for that batch, through the reference path (the stream's decoder
and `arrow_batch`), which also keeps such values' text in `_pg2sink_text` and raises the
DecodeError of malformed text. The tables are equal to the reference path's, column for
column (tests/sinks/duckdb/test_duckdb_import_columns.py, on PostgreSQL's text for every type
family).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from pg2sink.changelog.batches import BatchDecoder, ImportTable
from pg2sink.changelog.codecs import Kind
from pg2sink.sinks.warehouse.layout import Column, Layout, raw_columns
from pg2sink.sinks.warehouse.values import arrow_batch, arrow_type

__all__ = ["StagedColumns"]

#: Per kind, the text PostgreSQL prints for the values the kernel converts exactly (with
#: the session settings of the stream: DateStyle ISO, TimeZone UTC, extra_float_digits 3)
_INTEGER = r"^-?[0-9]+$"
_DECIMAL_TEXT = r"^-?[0-9]+(\.[0-9]+)?$"
_FLOAT_TEXT = r"^-?[0-9]+(\.[0-9]+)?(e[-+][0-9]+)?$"
_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_TIME = r"^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?$"
_TIMESTAMP = r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
#: timestamptz_out under TimeZone=UTC ends in +00
_UTC = "+00"

_Kernel = Callable[[pa.Array, str], "pa.Array | None"]


def _vouched(column: pa.Array, pattern: str) -> bool:
    """Whether every non-null value of `column` matches `pattern`."""
    exact = pc.match_substring_regex(column, pattern)
    return not pc.any(pc.and_not(column.is_valid(), pc.fill_null(exact, False))).as_py()


def _as_is(column: pa.Array, duck: str) -> pa.Array:
    return column.cast(arrow_type(duck))


def _digits(column: pa.Array, duck: str) -> pa.Array | None:
    # numeric_out's digits are what format(Decimal(text), 'f') gives back
    return column.cast(arrow_type(duck)) if _vouched(column, _DECIMAL_TEXT) else None


def _bool(column: pa.Array, duck: str) -> pa.Array | None:
    true = pc.equal(column, "t")
    if pc.any(pc.and_not(column.is_valid(), pc.or_(true, pc.equal(column, "f")))).as_py():
        return None  # boolout prints t or f: the reference path rejects anything else
    return true


def _cast(pattern: str) -> _Kernel:
    def kernel(column: pa.Array, duck: str) -> pa.Array | None:
        if not _vouched(column, pattern):
            return None
        try:
            return pc.cast(column, arrow_type(duck))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None  # out of range, more digits than the scale: as the reference

    return kernel


def _float(column: pa.Array, duck: str) -> pa.Array | None:
    # the reference parses a Python float (a double), which Arrow narrows to a FLOAT
    if not _vouched(column, _FLOAT_TEXT):
        return None
    return pc.cast(pc.cast(column, pa.float64()), arrow_type(duck))


def _time(column: pa.Array, duck: str) -> pa.Array | None:
    if not _vouched(column, _TIME):
        return None
    at = pc.cast(pc.binary_join_element_wise("1970-01-01 ", column, ""), pa.timestamp("us"))
    return pc.cast(pc.cast(at, pa.int64()), arrow_type(duck))


def _timestamptz(column: pa.Array, duck: str) -> pa.Array | None:
    if not _vouched(column, _TIMESTAMP + r"\+00$"):
        return None
    local = pc.cast(pc.utf8_slice_codeunits(column, 0, -len(_UTC)), pa.timestamp("us"))
    return pc.cast(local, arrow_type(duck))  # the same instants, labelled UTC


_BY_KIND: dict[Kind, _Kernel] = {
    Kind.TEXT: _as_is,
    Kind.UUID: _as_is,
    Kind.BOOLEAN: _bool,
    Kind.INT: _cast(_INTEGER),
    Kind.LONG: _cast(_INTEGER),
    Kind.FLOAT: _float,
    Kind.DOUBLE: _float,
    Kind.DATE: _cast(_DATE),
    Kind.TIME: _time,
    Kind.TIMESTAMP: _cast(_TIMESTAMP + "$"),
    Kind.TIMESTAMPTZ: _timestamptz,
}


def _kernel(kind: Kind, duck: str) -> _Kernel | None:
    if duck == "VARCHAR" and kind in (Kind.NUMERIC, Kind.DECIMAL):
        return _digits
    if kind is Kind.DECIMAL:
        return _cast(_DECIMAL_TEXT)
    return _BY_KIND.get(kind)


class StagedColumns:
    """One table's import batches -> Arrow tables of its staging layout's raw columns."""

    def __init__(self, layout: Layout, table: ImportTable) -> None:
        self.layout = layout
        self.table = table
        by_name = {c.column: c for c in layout.columns}
        #: per batch column, its raw column
        self.columns: list[Column] = [by_name[n] for n in table.names]
        self._kernels = [_kernel(Kind(c.kind), c.type) for c in self.columns]
        self._converters = table.converters()
        self._decoder: BatchDecoder | None = None
        self._meta: dict[int, list[pa.Array]] = {}

    def table_of(self, batch: pa.RecordBatch, start: int) -> pa.Table:
        """The raw table rows of `batch`, its rows numbered from `start`."""
        n = batch.num_rows
        arrays: dict[str, pa.Array] = {}
        reference: list[int] = []
        for i, (column, kernel) in enumerate(zip(self.columns, self._kernels, strict=True)):
            values = batch.column(i)
            if pa.types.is_large_string(values.type):
                values = values.cast(pa.string())
            array = kernel(values, column.type) if kernel is not None else None
            if array is None:
                reference.append(i)
            else:
                arrays[column.raw] = array
        texts = pa.nulls(n, arrow_type("MAP(VARCHAR, VARCHAR)"))
        if reference:
            done = self._reference(batch, start, reference)
            arrays.update(
                (self.columns[i].raw, done.column(self.columns[i].raw)) for i in reference
            )
            texts = done.column("_pg2sink_text")
        numbers = pa.array(np.arange(start, start + n, dtype=np.int64))
        timestamp, lsn, xid, operation, unchanged = self._constants(n)
        # META's order: position, timestamp, lsn, sequence, xid, operation, unchanged
        # TOAST, text; an import row's position and sequence are its number
        meta = [numbers, timestamp, lsn, numbers, xid, operation, unchanged, texts]
        before = [pa.nulls(n, arrow_type(c.type)) for c in self.layout.columns if c.before]
        after = [arrays[c.raw] for c in self.layout.columns]
        return pa.Table.from_arrays([*meta, *before, *after], names=list(raw_columns(self.layout)))

    def _constants(self, n: int) -> list[pa.Array]:
        """The metadata columns that are the same for every row of a batch of `n` rows
        (the snapshot's time and position, xid 0, IMPORT, no unchanged TOAST), made once
        per batch size."""
        if n not in self._meta:
            s = self.table.schema
            when = pa.array(np.full(n, _micros(s.timestamp), np.int64))
            self._meta[n] = [
                pc.cast(when, arrow_type("TIMESTAMPTZ")),
                pa.array(np.full(n, s.lsn, np.int64)),
                pa.array(np.zeros(n, np.int64)),
                pa.array(np.full(n, "IMPORT", object), pa.string()),
                pa.nulls(n, arrow_type("VARCHAR[]")),
            ]
        return self._meta[n]

    def _reference(self, batch: pa.RecordBatch, start: int, columns: Sequence[int]) -> pa.Table:
        """`columns` of the batch through the stream's decoders and `arrow_batch`."""
        values = []
        for i in columns:
            convert = self._converters[i]
            texts = batch.column(i).cast(pa.binary()).to_pylist()
            try:
                values.append([None if v is None else convert(v) for v in texts])
            except Exception:
                if self._decoder is None:
                    self._decoder = BatchDecoder(self.table)
                self._decoder.fail(batch)  # the precise DecodeError
                raise
        names = [self.table.names[i] for i in columns]
        rows = [
            (start + k, self.table.modification(start + k, dict(zip(names, row, strict=True))))
            for k, row in enumerate(zip(*values, strict=True))
        ]
        part = dataclasses.replace(
            self.layout,
            columns=tuple(dataclasses.replace(self.columns[i], before=None) for i in columns),
        )
        return arrow_batch(part, rows, [None] * len(rows))


def _micros(when: object) -> int:
    """A tz-aware datetime as microseconds since the epoch (exact, no float)."""
    import datetime as dt

    assert isinstance(when, dt.datetime)
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
