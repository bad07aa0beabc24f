"""The file sink (the embedded default): JSON lines, one record per line.

Records are appended to a file (or standard output for '-'). A Schema line
precedes the first Modification of each table and every change of its shape
(the changelog builder emits them in that order). TRUNCATE Modifications add
their options, Message records (--messages) have a line of their own (README
"Records", docs/changes.md). `flush()` flushes Python's
buffer and fsyncs a regular file before it reports a checkpoint as durable;
pipes and terminals cannot be fsynced, so there durability ends at write(2).

Other writers may append to the same file: Spark import executors
(pg2sink.imports.writers) do. The file is opened with O_APPEND and every write(2)
carries whole lines only: each `write()` below hands the buffer one whole line, and
CPython's BufferedWriter passes to the kernel either its whole buffer or a whole
oversized write, never part of one; Linux appends each write(2) to a regular file
atomically. So lines of concurrent writers interleave, never their bytes.
"""

from __future__ import annotations

import io
import logging
import os
import stat
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import BinaryIO

import orjson

from pg2sink.changelog.jsonenc import LINE_OPTIONS, default, dumps, dumps_line
from pg2sink.changelog.records import (
    Message,
    Modification,
    Operation,
    Record,
    Schema,
    Truncation,
)
from pg2sink.errors import SinkError

log = logging.getLogger(__name__)

#: Python-side buffer; large enough that a write(2) moves many records.
BUFFER_BYTES = 1 << 20


def schema_line(record: Schema) -> bytes:
    """The JSON line of a Schema record (README "Records")."""
    return dumps_line(
        {
            "kind": "schema",
            "timestamp": record.timestamp,
            "lsn": record.lsn,
            "namespace": record.namespace,
            "name": record.name,
            "schema": record.schema,
        }
    )


def modification_object(m: Modification) -> dict[str, object]:
    """The JSON object of a Modification (README "Records"); a Truncation adds its options.

    FileSink.write builds the same object inline for plain Modifications (hot path).
    """
    obj: dict[str, object] = {
        "kind": "modification",
        "timestamp": m.timestamp,
        "sequence": m.sequence,
        "lsn": m.lsn,
        "xid": m.xid,
        "operation": m.operation,
        "namespace": m.namespace,
        "name": m.name,
        "before": m.before,
        "after": m.after,
    }
    if isinstance(m, Truncation):
        obj["truncate"] = {"cascade": m.cascade, "restart_identity": m.restart_identity}
    return obj


def message_object(m: Message) -> dict[str, object]:
    """The JSON object of a Message record; `content` is base64 (docs/changes.md)."""
    return {
        "kind": "message",
        "timestamp": m.timestamp,
        "lsn": m.lsn,
        "xid": m.xid,
        "transactional": m.transactional,
        "prefix": m.prefix,
        "content": m.content,
    }


def record_line(record: Record) -> bytes:
    """The JSON line of any record (FileSink.write inlines the plain Modification)."""
    if isinstance(record, Schema):
        return schema_line(record)
    if isinstance(record, Message):
        return dumps_line(message_object(record))
    return dumps_line(modification_object(record))


class FileSink:
    """JSON-lines sink; see module docstring."""

    json_values = True

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
        self._timestamp: object = None
        self._timestamp_json = orjson.Fragment(b"null")

    def open(self) -> None:
        try:
            if self.path == "-":
                self._out = open(  # noqa: SIM115 (kept open until close())
                    sys.stdout.fileno(), "wb", buffering=BUFFER_BYTES, closefd=False
                )
            else:
                # "a": O_APPEND, so import executors' lines land after ours, never over them
                self._out = open(self.path, "ab", buffering=BUFFER_BYTES)  # noqa: SIM115
        except OSError as e:
            raise SinkError(f"cannot open --file-path {self.path!r}: {e.strerror}") from None
        mode = os.fstat(self._out.fileno()).st_mode
        self._fsync = stat.S_ISREG(mode)
        log.debug("file sink writing to %s", "stdout" if self.path == "-" else self.path)

    def write(self, record: Record) -> None:
        """Encode one record as a JSON line and append it to the file's buffer."""
        if record.__class__ is Modification:
            r = record
            self.write_new_row(
                r.timestamp, r.sequence, r.lsn, r.xid, r.operation, r.namespace, r.name, r.after,
                r.before,
            )  # fmt: skip
            return
        # Schema, Truncation, Message: a few per transaction at most
        self._append(record_line(record))

    def write_new_row(
        self,
        timestamp: datetime,
        sequence: int,
        lsn: int,
        xid: int,
        operation: Operation,
        namespace: str,
        name: str,
        after: dict[str, object] | None,
        before: dict[str, object] | None = None,
    ) -> None:
        """The line of Modification(timestamp, ..., name, before, after), appended.

        The changelog's fast path calls this directly for each Insert and Update
        (ChangelogBuilder's `emit_new_row`), without building the record. The line
        (README "Records") is built here, inline, because this runs once per change:
        orjson gets a dict, which it writes in half the time of a slotted dataclass
        (0.46 vs 0.98 us, measured), and the commit time, the same for every change of
        a transaction, is formatted once per transaction and reused as a raw fragment.
        """
        if timestamp is not self._timestamp:
            self._timestamp = timestamp
            self._timestamp_json = orjson.Fragment(dumps(timestamp))
        line = orjson.dumps(
            {
                "kind": "modification",
                "timestamp": self._timestamp_json,
                "sequence": sequence,
                "lsn": lsn,
                "xid": xid,
                "operation": operation,
                "namespace": namespace,
                "name": name,
                "before": before,
                "after": after,
            },
            default=default,
            option=LINE_OPTIONS,
        )
        # _append(line), written out: the call costs 0.7% of a change (329 instructions
        # of 44,967, bench/callgrind_stream.py)
        out = self._out
        if out is None:
            raise SinkError("the file sink was not opened")
        try:
            out.write(line)
        except OSError as e:
            raise SinkError(f"cannot write to {self.path!r}: {e.strerror}") from None

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
        fsync of a busy file takes milliseconds to tens of them: measured 17 ms on
        average in bench-stream). One fsync is in flight at most; its mark, taken
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
