"""The file sink (the embedded default): JSON lines, one record per line.

Records are appended to a file (or standard output for '-'). A Schema line
precedes the first Modification of each table and every change of its shape
(the changelog builder emits them in that order). TRUNCATE Modifications add
their options, Message records (--messages) have a line of their own (README
"Records", docs/changes.md; the lines are formats/jsonlines.py's). `flush()`
flushes Python's buffer and fsyncs a regular file before it reports a checkpoint
as durable; pipes, terminals and /dev/null cannot be fsynced, so there durability
ends at write(2).

Spark import executors append to the same file (sinks/file/imports.py): every
writer goes through append.py's `append_lines` (whole lines under the file's
lock, a line torn by a crash cut first). Each `write()` below hands the buffer
one whole line, and CPython's BufferedWriter passes its raw file
(`LockedAppender`) either its whole buffer or a whole oversized write.
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import stat
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import BinaryIO

from pg2sink.changelog.builder import RowWriter, TableShape
from pg2sink.changelog.records import Modification, Operation, Record
from pg2sink.errors import SinkError
from pg2sink.formats.jsonenc import dumps_line
from pg2sink.formats.jsonlines import NewRowLines, record_line
from pg2sink.sinks.file.append import LockedAppender, repair_torn_line
from pg2sink.sinks.txmeta import TransactionTracker

log = logging.getLogger(__name__)

#: Python-side buffer; large enough that a write(2) moves many records.
BUFFER_BYTES = 1 << 20


def _appended_file(fd: int) -> bool:
    """Whether `fd` is a regular file opened for appending (a shell's `>>`)."""
    return stat.S_ISREG(os.fstat(fd).st_mode) and bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND)


class FileSink:
    """JSON-lines sink; see module docstring."""

    #: records are written as pg2sink's JSON (relay: a JSON topic's values, in their JSON
    #: form, can be written here as they are)
    writes_json = True

    def __init__(self, path: str) -> None:
        self.path = path
        self._out: BinaryIO | None = None
        self._fsync = False
        self._written_mark: int | None = None
        self._durable_mark: int | None = None
        #: one thread for background fsyncs (start_flush), and the one in flight
        self._fsyncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg2sink-fsync")
        self._in_flight: Future[tuple[int | None, int]] | None = None
        #: the checkpoint whose data was last handed to the kernel (start_flush), and
        #: the file position then; the position the last finished fsync covered
        self._in_kernel_mark: int | None = None
        self._in_kernel_pos = 0
        self._durable_pos = 0

    def open(self) -> None:
        try:
            self._out = self._open_file()
            self._fsync = stat.S_ISREG(os.fstat(self._out.fileno()).st_mode)
            if self._fsync:
                self._durable_pos = self._out.tell()  # what was there is not ours to count
        except OSError as e:
            raise SinkError(f"cannot open --file-path {self.path!r}: {e.strerror}") from None
        log.debug("file sink writing to %s", "stdout" if self.path == "-" else self.path)

    def _open_file(self) -> BinaryIO:
        """The buffered output, its torn last line repaired where others may append."""
        raw: LockedAppender
        if self.path == "-":
            fd = sys.stdout.fileno()
            if not _appended_file(fd):  # a pipe, a terminal, a shell's `>`: ours alone
                return open(fd, "wb", buffering=BUFFER_BYTES, closefd=False)
            raw = LockedAppender(fd, "wb", closefd=False, path="-")
        else:
            # "a": O_APPEND, so import executors' lines land after ours, never over them
            raw = LockedAppender(self.path, "ab", path=self.path)
        try:
            if stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
                repair_torn_line(raw.fileno(), self.path)
                raw.seek(0, os.SEEK_END)
        except OSError:
            raw.close()
            raise
        return io.BufferedWriter(raw, BUFFER_BYTES)

    def write(self, record: Record) -> None:
        """Encode one record as a JSON line and append it to the file's buffer."""
        self._append(record_line(record))

    def row_writer(self, table: TableShape) -> RowWriter:
        """The line of each new row of `table` (sinks.base.WritesRows): the row read
        from pgoutput's bytes straight to its JSON values, the line `write` appends for
        its Modification, byte for byte."""
        read = table.reader(to_json=True)
        encode = NewRowLines(table.namespace, table.name, newline=True).encode

        def write(
            data: bytes, timestamp: datetime, sequence: int, lsn: int, xid: int, op: Operation
        ) -> bool:
            after = read(data)
            if after is None:
                return False
            line = encode(timestamp, sequence, lsn, xid, op, after)
            # _append(line), written out: this runs once per change
            out = self._out
            if out is None:
                raise SinkError("the file sink was not opened")
            try:
                out.write(line)
            except OSError as e:
                raise SinkError(f"cannot write to {self.path!r}: {e.strerror}") from None
            return True

        return write

    def _append(self, line: bytes) -> None:
        out = self._out
        if out is None:
            raise SinkError("the file sink was not opened")
        try:
            out.write(line)
        except OSError as e:
            raise SinkError(f"cannot write to {self.path!r}: {e.strerror}") from None

    def checkpoint(self, lsn: int) -> None:
        self._written_mark = lsn

    def start_flush(self) -> None:
        """Hand what is written to the kernel, and start an fsync in the background.

        os.fsync releases the GIL, so decoding goes on while the disk works (an
        fsync of a busy file takes milliseconds to tens of them: `make bench-stream`).
        One fsync is in flight at most; its mark, taken
        before the data went to the kernel, becomes durable when it returns.
        """
        self._collect()
        out = self._out
        if out is None or self._written_mark == self._durable_mark:
            return
        mark = self._written_mark
        try:
            out.flush()
        except (OSError, ValueError) as e:
            raise SinkError(f"cannot write to {self.path!r}: {e}") from None
        if not self._fsync:  # a pipe or terminal: nothing more to wait for
            self._durable_mark = mark
            return
        self._in_kernel_mark = mark
        self._in_kernel_pos = out.tell()
        self._next_fsync()

    def _next_fsync(self) -> None:
        """Start an fsync for what reached the kernel, unless one is running or the
        output cannot be fsynced (a pipe, terminal or /dev/null: EINVAL; start_flush
        made their data durable when it reached the kernel)."""
        out = self._out
        if (
            self._fsync
            and self._in_flight is None
            and out is not None
            and self._in_kernel_mark != self._durable_mark
        ):
            self._in_flight = self._fsyncer.submit(
                self._fsync_to, out.fileno(), self._in_kernel_mark, self._in_kernel_pos
            )

    @staticmethod
    def _fsync_to(fd: int, mark: int | None, pos: int) -> tuple[int | None, int]:
        os.fsync(fd)
        return mark, pos

    def _collect(self) -> None:
        """Take the result of a finished background fsync (raising its error)."""
        done = self._in_flight
        if done is None or not done.done():
            return
        self._in_flight = None
        try:
            self._durable_mark, self._durable_pos = done.result()
        except OSError as e:
            raise SinkError(f"cannot fsync {self.path!r}: {e.strerror}") from None

    def flush(self) -> int | None:
        """Make everything written durable now, waiting for it."""
        out = self._out
        if out is None:
            return self._durable_mark
        mark = self._written_mark
        try:
            if self._in_flight is not None:
                self._in_flight.result()  # its mark is older than ours: just wait
                self._in_flight = None
            out.flush()
            if self._fsync:
                os.fsync(out.fileno())
                self._durable_pos = out.tell()
        except (OSError, ValueError, io.UnsupportedOperation) as e:
            raise SinkError(f"cannot flush {self.path!r}: {e}") from None
        self._durable_mark = mark
        return mark

    def pending_bytes(self) -> int:
        """Bytes written (to the buffer or the kernel) and not yet fsynced."""
        out = self._out
        if out is None:
            return 0
        try:
            return max(out.tell() - self._durable_pos, 0)
        except (OSError, ValueError):  # a pipe has no position
            return 0

    def acknowledged(self) -> int | None:
        self._collect()
        self._next_fsync()  # data handed over while the last fsync ran
        return self._durable_mark

    def close(self) -> None:
        if self._out is not None:
            self.flush()
            self._out.close()
            self._out = None
        self._fsyncer.shutdown(wait=True)


class TransactionsFileSink(FileSink):
    """The file sink with --transactions: each transaction's lines between a BEGIN and an
    END line (sinks/txmeta.py, with "kind": "transaction" first)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._transactions = TransactionTracker(self._transaction_line)

    def write(self, record: Record) -> None:
        if isinstance(record, Modification):
            self._transactions.begin(record.xid, record.timestamp)
            self._transactions.count(record.namespace, record.name)
        super().write(record)

    def row_writer(self, table: TableShape) -> RowWriter:
        inner = super().row_writer(table)
        begin, count = self._transactions.begin, self._transactions.count
        namespace, name = table.namespace, table.name

        def write(
            data: bytes, timestamp: datetime, sequence: int, lsn: int, xid: int, op: Operation
        ) -> bool:
            # counted before the line, as write() does: BEGIN comes before it
            begin(xid, timestamp)
            if not inner(data, timestamp, sequence, lsn, xid, op):
                return False
            count(namespace, name)
            return True

        return write

    def checkpoint(self, lsn: int) -> None:
        self._transactions.checkpoint(lsn)
        super().checkpoint(lsn)

    def _transaction_line(self, record: dict[str, object]) -> None:
        self._append(dumps_line({"kind": "transaction", **record}))
