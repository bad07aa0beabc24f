"""An import's rows, from Arrow batches of PostgreSQL text to the stream's values.

Spark's executors receive a partition of an import as Arrow record batches of string
columns (each value PostgreSQL's text output of the column, or null: what pgoutput
would send). `ImportTable` says what the columns are (the table's Schema record, its
types and typmods); `BatchDecoder` turns a batch into {column: value} dicts with the
stream's converters (changelog.typemap.codec_for), so an import row holds the very
values a streamed row of the same text holds. A sink's import writer
(sinks/<name>/imports.py) encodes them as it encodes the stream's rows.

A sink whose stream encodes new rows straight from pgoutput's bytes (the Kafka sink's C
encoder, formats.avro_native) skips the Python values: `insert_messages` builds each
row's pgoutput Insert message from the batch with Arrow kernels, and `write_raw` hands
them to the sink's raw row writer, as the stream's builder does (a fraction of the Python
work per row: `make bench-import ARGS="--sink kafka"`; docs/imports.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pg2sink.catalog.types import PgType
from pg2sink.changelog.builder import RowWriter, TableShape
from pg2sink.changelog.codecs import KINDS, Kind, ValueCodec
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.changelog.rows import RowDecoder
from pg2sink.changelog.typemap import codec_for

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["BatchDecoder", "ImportTable", "insert_messages", "write_modifications", "write_raw"]


@dataclass(frozen=True)
class ImportTable:
    """The table an import writes: sent to every executor (keep it small)."""

    schema: Schema
    """The table's Schema record (the driver wrote it before any row)."""
    types: tuple[PgType, ...]
    typmods: tuple[int, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in the order of the batches' columns."""
        return tuple(f["pg.column"] for f in self.schema.schema["fields"])

    def codecs(self) -> list[ValueCodec]:
        """Per column, the stream's codec (changelog.typemap.codec_for)."""
        return [codec_for(t, m) for t, m in zip(self.types, self.typmods, strict=True)]

    def shape(self) -> TableShape:
        """The table as a sink's row writer takes it (Sink.row_writer)."""
        s = self.schema
        return TableShape(s.namespace, s.name, self.names, tuple(self.codecs()))

    def converters(self, to_json: bool = False) -> list[Callable[[bytes], object]]:
        """Per column, the stream's converter, codec.decode (the values records hold),
        or `to_json`: codec.to_json, for an encoder writing JSON itself."""
        return [c.to_json if to_json else c.decode for c in self.codecs()]

    def modification(self, sequence: int, row: dict[str, object]) -> Modification:
        """The IMPORT Modification of a row: the snapshot's time and position, xid 0,
        `sequence` its number within its partition (README "Records")."""
        s = self.schema
        return Modification(
            s.timestamp, sequence, s.lsn, 0, Operation.IMPORT, s.namespace, s.name, None, row
        )


class BatchDecoder:
    """Arrow batches -> {column: value} dicts, with the stream's converters.

    Column at a time rather than row at a time: each column's values come out of Arrow
    as one list (C++), and a converter maps over it in one map() call (faster than the
    per-row RowDecoder here: `make bench-import`). Text-like columns arrive as str and
    are kept. A value a converter rejects makes the batch go through RowDecoder, which
    raises the DecodeError naming the column, as the stream does.
    """

    def __init__(self, table: ImportTable, to_json: bool = False) -> None:
        self.names = table.names
        codecs = table.codecs()
        #: per column, its value kind (changelog.codecs.KINDS)
        self.kinds: tuple[Kind, ...] = tuple(c.kind for c in codecs)
        self.converters = [c.to_json if to_json else c.decode for c in codecs]
        # a text kind's value is its text, which Arrow already gives as a str
        self._converters = [
            None if KINDS[kind].text else c
            for c, kind in zip(self.converters, self.kinds, strict=True)
        ]
        self._reference = RowDecoder(self.names, self.converters)
        self._make_row = _row_builder(self.names)

    def rows(self, batch: pa.RecordBatch) -> Iterator[dict[str, object]]:
        columns: list[list[object]] = []
        for column, convert in zip(batch.columns, self._converters, strict=True):
            if convert is None:
                columns.append(column.to_pylist())
                continue
            # Spark hands over strings; their bytes, without a copy, are what the
            # stream's decoders take
            values = column.view(_bytes_type(column.type)).to_pylist()
            try:
                if column.null_count == 0:
                    values = list(map(convert, values))
                else:
                    values = [None if v is None else convert(v) for v in values]
            except Exception:
                self.fail(batch)
                raise
            columns.append(values)
        if not columns:
            return iter([{} for _ in range(batch.num_rows)])
        return map(self._make_row, *columns)

    def fail(self, batch: pa.RecordBatch) -> None:
        """Decode the batch row by row with RowDecoder: raises the precise DecodeError."""
        columns = [
            [None if v is None else v.encode() for v in c.to_pylist()] for c in batch.columns
        ]
        for values in zip(*columns, strict=True):
            self._reference.decode(values)


def write_modifications(
    table: ImportTable,
    batches: Iterator[pa.RecordBatch],
    write: Callable[[Modification], None],
    after_batch: Callable[[], None] | None = None,
) -> int:
    """An import partition through a sink's `write`: each row of the batches decoded
    with the stream's converters as its IMPORT
    Modification, numbered from 0 within the partition; `after_batch()` after each
    batch (a sink serving its acknowledgements as it goes). The number of rows."""
    rows = BatchDecoder(table).rows
    modification = table.modification
    seq = 0
    for batch in batches:
        for row in rows(batch):
            write(modification(seq, row))
            seq += 1
        if after_batch is not None:
            after_batch()
    return seq


def write_raw(
    table: ImportTable,
    batches: Iterator[pa.RecordBatch],
    raw: RowWriter,
    write: Callable[[Modification], None],
    after_batch: Callable[[], None] | None = None,
) -> int:
    """An import partition through a sink's raw row writer (the stream's, which encodes
    a pgoutput Insert message's bytes): each row's message from `insert_messages`, as
    its IMPORT change numbered from 0 within the partition; a row the writer declines
    (a value its encoder does not write exactly) is decoded with the stream's
    converters and goes through `write` as its Modification, as in the stream.
    `after_batch()` after each batch. The number of rows."""
    s = table.schema
    when, lsn, operation = s.timestamp, s.lsn, Operation.IMPORT
    decoder: BatchDecoder | None = None
    seq = 0
    for batch in batches:
        for i, data in enumerate(insert_messages(batch)):
            if not raw(data, when, seq + i, lsn, 0, operation):
                if decoder is None:
                    decoder = BatchDecoder(table)
                row = next(iter(decoder.rows(batch.slice(i, 1))))
                write(table.modification(seq + i, row))
        seq += batch.num_rows
        if after_batch is not None:
            after_batch()
    return seq


def insert_messages(batch: pa.RecordBatch) -> list[bytes]:
    """Each row of `batch` (string columns of PostgreSQL text, or null) as the pgoutput
    Insert message (protocol 1) that carries it as text: 'I', a relation id (0: unused
    by the encoders), 'N', the column count, then per column 'n' for null or 't', the
    text's length and the text. Built column-wise: one join of Arrow kernels (C++) per
    batch, and one bytes object per row out of it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    n = batch.num_rows
    columns = [c.view(_bytes_type(c.type)) for c in batch.columns]
    large = any(pa.types.is_large_binary(c.type) for c in columns)
    binary = pa.large_binary() if large else pa.binary()
    parts: list[pa.Array | pa.Scalar] = [
        pa.scalar(b"I\0\0\0\0N" + len(columns).to_bytes(2, "big"), binary)
    ]
    for values in columns:
        # 't' and the text's length (Int32, big endian), five packed bytes per row
        prefix = np.empty(n, dtype=[("t", "S1"), ("length", ">u4")])
        prefix["t"] = b"t"
        prefix["length"] = pc.binary_length(values).fill_null(0).to_numpy()
        head = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(5), n, [None, pa.py_buffer(prefix.view(np.uint8))]
        ).cast(binary)
        if values.null_count:
            head = pc.if_else(values.is_valid(), head, pa.scalar(b"n", binary))
        parts.append(head)
        parts.append(values.cast(binary))
    # a null value joins as nothing after its 'n'
    joined = pc.binary_join_element_wise(
        *parts, pa.scalar(b"", binary), null_handling="replace", null_replacement=""
    )
    messages: list[bytes] = joined.to_pylist()
    return messages


def _row_builder(names: tuple[str, ...]) -> Callable[..., dict[str, object]]:
    """A function of one value per column returning the row's dict, the keys written out
    as literals: `map(builder, *columns)` builds a batch's rows without a tuple, a zip
    and a dict(iterable) per row (less of the writer's CPU per row: `make bench-import`).
    Names reach the code as repr() literals, so no identifier can change what it does."""
    args = ", ".join(f"v{i}" for i in range(len(names)))
    items = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
    env: dict[str, Any] = {}
    exec(compile(f"def row({args}):\n    return {{{items}}}\n", "<import row>", "exec"), env)
    builder: Callable[..., dict[str, object]] = env["row"]
    return builder


def _bytes_type(string_type: pa.DataType) -> pa.DataType:
    import pyarrow as pa

    if pa.types.is_large_string(string_type):
        return pa.large_binary()
    if pa.types.is_string(string_type):
        return pa.binary()
    return string_type  # already binary
