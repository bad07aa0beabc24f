"""What a Spark executor does with its partition of an import: decode, write, mark done.

`write_partition` runs in the Python worker of each Spark task (through mapInArrow):
it receives the partition's rows as Arrow record batches of string columns (each
value is PostgreSQL's text output of the column, or null), decodes them with the
stream's codecs (changelog.typemap.codec_for: the same Python or JSON values the
stream writes), writes IMPORT Modifications to the sink itself, makes them durable,
and only then marks the partition done in the job store. Nothing is sent back to
the driver but one (partition, rows) row.

File sink (`FileWriter`): whole JSON lines, appended at least a megabyte (or one
Arrow batch) at a time to a descriptor opened with O_APPEND, then fsync. Each append
goes through the file sink's `append_lines`, as the stream's FileSink does: under the
file's lock, all of it, after cutting a line torn by a writer that crashed (see
sinks/file.py), so executors and the stream share the file and no line glues to a
torn one. The line of a Modification is the
one the stream writes (same keys, same order); its constant parts are encoded once.
A batch's lines are built column-wise by Arrow kernels (imports/lines.py, no Python
object per value for the common types); the reference path (`reference_lines`: rows
of the stream's Python values, one orjson call) takes a batch Arrow cannot build.

Kafka sink (`KafkaWriter`): a KafkaSink of its own per task (the stream's producer
settings: idempotent, acks=all, the user's --kafka-config), keyed by primary key and
encoded by the same per-table encoders; the driver registered the subjects and
passes their ids, so executors never call the registry. Every message is delivered
(checked through the sink's acknowledgements) before the partition is marked done.

Modification fields of an import row: timestamp = the snapshot's time, sequence =
the row's number within its partition, lsn = the WAL position when the snapshot was
taken, xid = 0, operation IMPORT, before null.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any

import orjson

from pg2sink.catalog.types import PgType
from pg2sink.changelog.jsonenc import default, dumps
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.changelog.rows import RowDecoder
from pg2sink.changelog.typemap import codec_for
from pg2sink.config import KafkaConfig
from pg2sink.errors import SinkError
from pg2sink.sinks.file import append_lines

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from pg2sink.imports.lines import LineBuilder
    from pg2sink.sinks.base import Sink

__all__ = [
    "BatchDecoder",
    "FileWriter",
    "ImportSinkConfig",
    "KafkaWriter",
    "KnownSchemaIds",
    "PartitionJob",
    "RecordingRegistry",
    "append_lines",
    "wait_acknowledged",
    "write_partition",
]

#: Bytes of whole lines gathered before one os.write (the FileSink's buffer size).
WRITE_BYTES = 1 << 20
#: Longest wait for a task's Kafka deliveries, in seconds (librdkafka retries inside it).
DELIVERY_WAIT = 300.0


@dataclass(frozen=True)
class ImportSinkConfig:
    """Where import rows go: the stream's sink, as executors need it (pickled to them)."""

    kind: str
    """'file' or 'kafka'."""
    file_path: str = "-"
    """File sink: the JSON-lines file ('-' is standard output, which executors cannot use)."""
    kafka: KafkaConfig | None = None
    """Kafka sink settings (holds secrets: never logged)."""

    @classmethod
    def from_stream_config(cls, cfg: Any) -> ImportSinkConfig:
        """From a config.StreamConfig (its sink, file_path and kafka fields)."""
        return cls(kind=cfg.sink, file_path=cfg.file_path, kafka=cfg.kafka)

    def problem(self) -> str | None:
        """Why imports cannot write to this sink, or None."""
        if self.kind == "file" and self.file_path == "-":
            return (
                "imports need --file-path FILE or --sink kafka: Spark executors cannot "
                "write to standard output"
            )
        if self.kind == "kafka" and self.kafka is None:
            return "imports to Kafka need --kafka-bootstrap-servers"
        if self.kind not in ("file", "kafka"):
            return f"imports cannot write to sink {self.kind!r}"
        return None


@dataclass(frozen=True)
class PartitionJob:
    """Everything a task needs, sent to every executor (keep it small)."""

    job_id: int
    internal_schema: str
    source_dsn: str = dataclasses.field(repr=False)
    """Secret: never logged; used to mark partitions done."""
    schema: Schema
    """The table's Schema record (the driver wrote it before any row)."""
    types: tuple[PgType, ...]
    typmods: tuple[int, ...]
    sink: ImportSinkConfig = dataclasses.field(repr=False)
    partitions: tuple[int, ...]
    """Spark partition index -> the plan's partition number."""
    schema_ids: tuple[tuple[str, int], ...] = ()
    """Kafka Avro: (subject, id) registered by the driver."""

    @property
    def json_values(self) -> bool:
        """Whether the sink takes values in their JSON form (file, Kafka --format json)."""
        kafka = self.sink.kafka
        return self.sink.kind == "file" or (kafka is not None and kafka.format == "json")

    def converters(self) -> list[Callable[[bytes], object]]:
        """Per column, the stream's converter for this sink (codec.to_json or .decode)."""
        codecs = [codec_for(t, m) for t, m in zip(self.types, self.typmods, strict=True)]
        return [c.to_json if self.json_values else c.decode for c in codecs]

    def text_columns(self) -> tuple[bool, ...]:
        """Per column, whether its value is its text as a str (text, varchar, json...):
        those reach the executor as Arrow strings, already str, and are not converted."""
        return tuple(c is _AS_TEXT for c in self.converters())


class KnownSchemaIds:
    """A SchemaRegistry that answers with the ids the driver registered (executors)."""

    def __init__(self, ids: Mapping[str, int]) -> None:
        self._ids = dict(ids)

    def register(self, subject: str, schema: Mapping[str, Any]) -> int:
        try:
            return self._ids[subject]
        except KeyError:
            raise SinkError(f"subject {subject!r} was not registered by the driver") from None

    def close(self) -> None:
        pass


class RecordingRegistry:
    """Wraps the driver's registry client and remembers the ids it returned."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.ids: dict[str, int] = {}

    def register(self, subject: str, schema: Mapping[str, Any]) -> int:
        schema_id: int = self._inner.register(subject, schema)
        self.ids[subject] = schema_id
        return schema_id

    def close(self) -> None:
        self._inner.close()


#: the converter of text-like types (typemap's _decode_text): the value is its text
_AS_TEXT: Callable[[bytes], object] = bytes.decode


class BatchDecoder:
    """Arrow batches -> {column: value} dicts, with the stream's converters.

    Column at a time rather than row at a time: each column's values come out of Arrow
    as one list (C++), and a converter maps over it in one map() call (measured: about
    half the time of the per-row RowDecoder here). Text-like columns arrive as str and
    are kept. A value a converter rejects makes the batch go through RowDecoder, which
    raises the DecodeError naming the column, as the stream does.
    """

    def __init__(self, job: PartitionJob) -> None:
        self.names = tuple(f["pg.column"] for f in job.schema.schema["fields"])
        converters = job.converters()
        self._text = job.text_columns()
        self._converters = [
            None if text else c for c, text in zip(converters, self._text, strict=True)
        ]
        self._reference = RowDecoder(self.names, converters)
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


def _row_builder(names: tuple[str, ...]) -> Callable[..., dict[str, object]]:
    """A function of one value per column returning the row's dict, the keys written out
    as literals: `map(builder, *columns)` builds a batch's rows without a tuple, a zip
    and a dict(iterable) per row (measured: the writer's CPU per row of bench-import's
    6 columns from 2.01 to 1.72 us).
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


class FileWriter:
    """Appends a partition's rows to the JSON-lines file; see the module docstring."""

    def __init__(self, job: PartitionJob, *, vectorised: bool = True) -> None:
        """`vectorised`: build the lines with Arrow kernels (imports.lines); False keeps
        every batch on the reference path (rows of Python values, one orjson call)."""
        self.path = job.sink.file_path
        self._decoder = BatchDecoder(job)
        s = job.schema
        # The line FileSink.write builds (same keys, same order): everything but the
        # sequence number and the row is the same for every row, encoded once here.
        envelope = dumps(
            {
                "kind": "modification",
                "timestamp": s.timestamp,
                "sequence": 0,
                "lsn": s.lsn,
                "xid": 0,
                "operation": Operation.IMPORT,
                "namespace": s.namespace,
                "name": s.name,
                "before": None,
                "after": None,
            }
        )
        head, _, rest = envelope.partition(b'"sequence":0')
        self._head = head + b'"sequence":'
        self._middle = rest[: -len(b"null}")]
        names = self._decoder.names
        #: how each row object starts: '{"<first column>":'
        self._row_start = b"{" + dumps(names[0]) + b":" if names else b"{"
        self._lines: LineBuilder | None = None
        if vectorised:
            from pg2sink.imports.lines import LineBuilder

            self._lines = LineBuilder(
                names, job.converters(), self._head, self._middle, self._decoder.fail
            )
        self.rows = 0

    def write(self, batches: Iterator[pa.RecordBatch]) -> int:
        """Write every row, fsync; the number of rows (durable when this returns)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise SinkError(f"cannot open --file-path {self.path!r}: {e.strerror}") from None
        try:
            self._write(fd, batches)
            os.fsync(fd)
        except OSError as e:
            raise SinkError(f"cannot write to {self.path!r}: {e.strerror}") from None
        finally:
            os.close(fd)
        return self.rows

    def _write(self, fd: int, batches: Iterator[pa.RecordBatch]) -> None:
        """Each batch's lines from the LineBuilder (or the reference path), gathered up to
        WRITE_BYTES, then appended with one write."""
        seq = self.rows
        pending: list[bytes | memoryview] = []
        size = 0
        for batch in batches:
            n = batch.num_rows
            if not n:
                continue
            data: bytes | memoryview | None = None
            if self._lines is not None:
                data = self._vectorised_lines(batch, seq)
            if data is None:
                data = self.reference_lines(batch, seq)
            pending.append(data)
            size += len(data)
            seq += n
            if size >= WRITE_BYTES:
                append_lines(fd, pending[0] if len(pending) == 1 else b"".join(pending), self.path)
                pending.clear()
                size = 0
        if pending:
            append_lines(fd, pending[0] if len(pending) == 1 else b"".join(pending), self.path)
        self.rows = seq

    def _vectorised_lines(self, batch: pa.RecordBatch, seq: int) -> memoryview | None:
        """The batch's lines from LineBuilder: a view of the joined array's data buffer
        (its lines are contiguous); None when Arrow cannot build them (a batch whose lines
        pass 2 GiB, beyond a string array's 32-bit offsets)."""
        import pyarrow as pa

        assert self._lines is not None
        try:
            lines = self._lines.lines(batch, seq)
        except (pa.ArrowInvalid, pa.ArrowCapacityError):
            return None
        _, offsets, data = lines.buffers()
        offsets = memoryview(offsets).cast("i")  # a string array's int32 offsets
        return memoryview(data)[offsets[lines.offset] : offsets[lines.offset + len(lines)]]

    def reference_lines(self, batch: pa.RecordBatch, seq: int) -> bytes:
        """The batch's lines from rows of Python values: one orjson call, cut into lines.

        orjson writes the list of row objects as `[{"id":1,...},{"id":2,...}]`; cutting
        at each `},{"id":` (the first column's key) gives every row's text. That
        sequence occurs only between two rows: inside a JSON string a quote is always
        escaped, and no value is a JSON object (json/jsonb values are strings, arrays
        hold scalars or arrays). Each line is then the constant envelope around the
        sequence number and the row, joined in one call. The piece count is checked.
        """
        head, middle, start = self._head, self._middle, self._row_start
        n = batch.num_rows
        data = orjson.dumps(
            list(self._decoder.rows(batch)), default=default, option=orjson.OPT_UTC_Z
        )
        # (a table without columns: every row is {})
        pieces = (
            data[1 + len(start) : -2].split(b"}," + start) if self._decoder.names else [b""] * n
        )
        if len(pieces) != n:
            raise SinkError(f"import rows of {self.path!r}: {n} rows made {len(pieces)}")
        numbers = [b"%d" % i for i in range(seq, seq + n)]
        lines = b"".join(
            chain.from_iterable(
                zip(numbers, repeat(middle + start), pieces, repeat(b"}}\n" + head), strict=False)
            )
        )
        # each line's head ends the line before it: the first gets one, the last gives
        # its own back
        return head + lines[: -len(head)]


class KafkaWriter:
    """Produces a partition's rows with a KafkaSink of its own; see the module docstring."""

    def __init__(self, job: PartitionJob) -> None:
        from pg2sink.sinks.kafka.formats import AvroFormat, Format, JsonFormat
        from pg2sink.sinks.kafka.sink import KafkaSink

        cfg = job.sink.kafka
        assert cfg is not None
        # the driver published the Schema record to --schema-topic once
        cfg = dataclasses.replace(cfg, schema_topic=None)
        fmt: Format = (
            JsonFormat()
            if cfg.format == "json"
            else AvroFormat(KnownSchemaIds(dict(job.schema_ids)))
        )
        self._sink = KafkaSink(cfg, fmt)
        self._job = job
        self._decoder = BatchDecoder(job)
        self.rows = 0

    def write(self, batches: Iterator[pa.RecordBatch]) -> int:
        """Produce every row and wait for every delivery; the number of rows."""
        sink, s, rows = self._sink, self._job.schema, self._decoder.rows
        sink.open()
        try:
            sink.write(s)
            write = sink.write
            ts, lsn, ns, name, op = s.timestamp, s.lsn, s.namespace, s.name, Operation.IMPORT
            seq = 0
            for batch in batches:
                for row in rows(batch):
                    write(Modification(ts, seq, lsn, 0, op, ns, name, None, row))
                    seq += 1
                sink.start_flush()  # serve delivery reports as we go
            wait_acknowledged(sink, f"the import's messages of {ns}.{name}")
            self.rows = seq
        finally:
            sink.close()
        return self.rows


def wait_acknowledged(sink: Sink, what: str) -> None:
    """Checkpoint everything `sink` was given and flush until the broker acknowledged it
    all; SinkError naming `what` after DELIVERY_WAIT seconds."""
    sink.checkpoint(1)
    deadline = time.monotonic() + DELIVERY_WAIT
    while sink.flush() != 1:
        if time.monotonic() > deadline:
            raise SinkError(f"Kafka did not acknowledge {what} within {DELIVERY_WAIT:.0f}s")


def write_partition(
    job: PartitionJob, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The mapInArrow function of an import (see the module docstring)."""
    import psycopg
    import pyarrow as pa
    from pyspark import TaskContext

    from pg2sink.imports.jobs import mark_partition_done

    context = TaskContext.get()
    assert context is not None, "write_partition runs in a Spark task"
    number = job.partitions[context.partitionId()]
    writer = FileWriter(job) if job.sink.kind == "file" else KafkaWriter(job)
    rows = writer.write(batches)
    with psycopg.connect(
        job.source_dsn, autocommit=True, application_name="pg2sink import"
    ) as conn:
        mark_partition_done(conn, job.internal_schema, job.job_id, number, rows)
    yield pa.RecordBatch.from_pydict(
        {"partition": [number], "rows": [rows]},
        schema=pa.schema([("partition", pa.int32()), ("rows", pa.int64())]),
    )
