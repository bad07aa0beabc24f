"""Appending whole lines to a file that several processes share.

The stream's FileSink and Spark import executors (sinks/file/imports.py) append to the
same file. Every writer appends through `append_lines`: whole lines only, all of them
before it lets go of the file's lock (flock(2), which the kernel drops when a writer
dies), so lines of concurrent writers interleave, never their bytes. The FileSink's
buffer hands its raw file (`LockedAppender`) either its whole buffer or a whole
oversized write, never part of one.

Only a crash can tear a line: a writer killed inside its write(2) (a kill -9 stops a
large write between two pages), a full disk, a power loss. So whoever takes the lock
first looks at the end of the file, and a last line without its newline is a torn one
nobody is still writing: it cuts it away (one WARNING with the byte count) before
appending. Safe, because a torn line was never fsynced, so its LSN was never
confirmed (an import partition of it was never marked done): it comes again. The
sink also does this when it opens the file, so that a restart repairs at once.
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

log = logging.getLogger(__name__)

#: Bytes read at a time, backwards, looking for the end of the last whole line.
TAIL_STEP = 1 << 16


@contextmanager
def _locked(fd: int) -> Iterator[None]:
    """The file's exclusive lock, shared by every pg2sink process appending to it."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _cut_torn_line(fd: int, path: str | None) -> int:
    """Truncate a regular file after its last newline, the caller holding its lock;
    the bytes cut (0: it ends with a whole line, or is no regular file). `path` names
    it in the WARNING (None: the name /proc gives the descriptor)."""
    st = os.fstat(fd)
    size = st.st_size
    if not stat.S_ISREG(st.st_mode) or size == 0:
        return 0
    # writers open the file write-only; a second description of the same inode reads
    # it (by /proc, not by path: a rotated path names another file)
    reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    try:
        keep = _whole_lines_end(reader, size)
    finally:
        os.close(reader)
    if keep == size:
        return 0
    os.ftruncate(fd, keep)
    log.warning(
        "--file-path %s ended in a partial line of %d bytes, left by a writer that "
        "crashed while appending it (never confirmed, so it is written again): removed it",
        path or os.readlink(f"/proc/self/fd/{fd}"),
        size - keep,
    )
    return size - keep


def _whole_lines_end(reader: int, size: int) -> int:
    """The end of the last whole line among the first `size` bytes (0: none)."""
    if os.pread(reader, 1, size - 1) == b"\n":
        return size
    end = size
    while end > 0:
        start = max(end - TAIL_STEP, 0)
        newline = os.pread(reader, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def repair_torn_line(fd: int, path: str) -> int:
    """Cut a torn last line of the file open as `fd` (see the module docstring); the
    bytes cut."""
    with _locked(fd):
        return _cut_torn_line(fd, path)


def append_lines(fd: int, data: bytes | memoryview, path: str | None = None) -> None:
    """Append whole lines to `fd` (opened with O_APPEND) under the file's lock, after
    cutting a torn line a crashed writer left; all of `data` is written before the
    lock is released (see the module docstring)."""
    view = memoryview(data)
    with _locked(fd):
        _cut_torn_line(fd, path)
        while view:
            view = view[os.write(fd, view) :]


class LockedAppender(io.FileIO):
    """The FileSink's raw file: each write its buffer makes goes through append_lines."""

    def __init__(self, file: str | int, mode: str, *, closefd: bool = True, path: str) -> None:
        super().__init__(file, mode, closefd=closefd)
        self._path = path

    def write(self, b: ReadableBuffer, /) -> int:
        view = memoryview(b)
        append_lines(self.fileno(), view, self._path)
        return view.nbytes
