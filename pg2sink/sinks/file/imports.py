"""The file sink's import writer: an import's rows appended as JSON lines by executors.

Each Spark task appends whole lines, at least a megabyte (or one Arrow batch) at a time,
to a descriptor opened with O_APPEND, then fsyncs: the partition is marked done only
after that. An import writes a table once and reads none of it back, so every
RELEASE_BYTES a task asks the kernel to write its pages out and drop them from the page
cache (`CacheRelease`), as PostgreSQL's bulk writes keep to a ring of buffers: the
import does not push the database's own pages out of memory, the final fsync finds
little left to write, and new lines go to pages the kernel has just freed.

Every append goes through `append_lines` (append.py), as the stream's FileSink does, so
executors and the stream share the file and no line glues to a torn one. A batch's
lines are built column-wise by Arrow kernels (arrow_lines.py, no Python object per value
for the common types) around the constant parts of the line (formats/jsonlines.py
`import_envelope`); a batch Arrow cannot build (lines beyond a string array's 2 GiB)
goes through the reference path: the stream's own `record_line` per row.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pg2sink.changelog.batches import BatchDecoder, ImportTable
from pg2sink.changelog.records import Schema
from pg2sink.errors import SinkError
from pg2sink.formats.jsonlines import import_envelope, record_line, schema_line
from pg2sink.sinks.file.append import append_lines

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from pg2sink.sinks.file.arrow_lines import LineBuilder

__all__ = ["FileImportTarget", "FileImportWriter"]

#: Bytes of whole lines gathered before one os.write (the FileSink's buffer size).
WRITE_BYTES = 1 << 20

#: Bytes a task appends between two `CacheRelease` requests: releasing the page cache as
#: the import goes makes it faster and cheaper in CPU than leaving the whole file cached,
#: and any size from 8 to 128 MiB does as well (`make bench-import ARGS="--sink file"`).
RELEASE_BYTES = 32 << 20


@dataclass(frozen=True)
class FileImportTarget:
    """The file sink's ImportTarget (sinks/base.py): the JSON-lines file's path."""

    path: str

    def problem(self) -> str | None:
        if self.path == "-":
            return (
                "imports need --file-path FILE or another sink: Spark executors cannot "
                "write to standard output"
            )
        return None

    def begin(self, schema: Schema) -> FileImportTarget:
        """The table's Schema line, appended and fsynced before any row."""
        fd = self._open()
        try:
            append_lines(fd, schema_line(schema), self.path)
            os.fsync(fd)
        except OSError as e:
            raise SinkError(f"cannot write to {self.path!r}: {e.strerror}") from None
        finally:
            os.close(fd)
        return self

    def write_rows(self, table: ImportTable, batches: Iterator[pa.RecordBatch]) -> int:
        return FileImportWriter(self.path, table).write(batches)

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise SinkError(f"cannot open --file-path {self.path!r}: {e.strerror}") from None


class FileImportWriter:
    """Appends one partition's rows to the JSON-lines file; see the module docstring."""

    def __init__(self, path: str, table: ImportTable, *, vectorised: bool = True) -> None:
        """`vectorised`: build the lines with Arrow kernels (arrow_lines.py); False keeps
        every batch on the reference path."""
        self.path = path
        self.table = table
        self._decoder = BatchDecoder(table, to_json=True)
        self._lines: LineBuilder | None = None
        if vectorised:
            from pg2sink.sinks.file.arrow_lines import LineBuilder

            head, middle = import_envelope(table.schema)
            self._lines = LineBuilder(
                self._decoder.names,
                self._decoder.kinds,
                self._decoder.converters,
                head,
                middle,
                self._decoder.fail,
            )
        self.rows = 0

    def write(self, batches: Iterator[pa.RecordBatch]) -> int:
        """Write every row, fsync; the number of rows (durable when this returns)."""
        fd = FileImportTarget(self.path)._open()
        try:
            release = CacheRelease(fd)
            self._write(fd, batches, release)
            os.fsync(fd)
            release.written()
        except OSError as e:
            raise SinkError(f"cannot write to {self.path!r}: {e.strerror}") from None
        finally:
            os.close(fd)
        return self.rows

    def _write(self, fd: int, batches: Iterator[pa.RecordBatch], release: CacheRelease) -> None:
        """Each batch's lines, gathered up to WRITE_BYTES, then appended with one write."""
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
                release.appended(size)
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
        """The batch's lines as the stream writes them: `record_line` of each row's
        IMPORT Modification."""
        modification = self.table.modification
        return b"".join(
            record_line(modification(i, row))
            for i, row in enumerate(self._decoder.rows(batch), start=seq)
        )


class CacheRelease:
    """Asks the kernel, every RELEASE_BYTES appended through `fd`, to start writing the
    file's pages out and to drop those already written from the page cache
    (posix_fadvise POSIX_FADV_DONTNEED: Linux starts the writeback of the range's dirty
    pages without waiting, then drops its clean ones). Each request covers the file from
    the end of this task's append two requests back: what the previous request started
    writing is clean by then and goes. Other writers' lines in that range go too; they
    are on their way to disk like these. Where the call does not exist, nothing."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._since = 0
        #: the file's size when the task began: its lines are all after it
        self._begin = os.fstat(fd).st_size
        #: the file offsets where the last two requests ended
        self._marks = (self._begin, self._begin)

    def appended(self, size: int) -> None:
        """`size` more bytes appended through the descriptor."""
        self._since += size
        if self._since >= RELEASE_BYTES:
            self._since = 0
            end = os.lseek(self.fd, 0, os.SEEK_CUR)
            self._request(self._marks[0], end)
            self._marks = (self._marks[1], end)

    def written(self) -> None:
        """After the fsync every page of the task's lines is clean: drop them all (a
        range whose writeback had not finished by the request after it is still
        cached)."""
        self._request(self._begin, os.fstat(self.fd).st_size)

    def _request(self, start: int, end: int) -> None:
        if hasattr(os, "posix_fadvise") and end > start:
            os.posix_fadvise(self.fd, start, end - start, os.POSIX_FADV_DONTNEED)
