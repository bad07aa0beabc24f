"""The file sink's import writer leaves no page of its lines in the page cache.

sinks/file/imports.py `CacheRelease`: every RELEASE_BYTES a task asks the kernel to write
the file's pages out and drop the written ones; after the final fsync it drops the rest.
Residency is read with mincore(2) on a mapping of the file, and the same writes without
the requests show that the pages would otherwise stay.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from pg2sink.sinks.file import imports
from pg2sink.sinks.file.imports import CacheRelease, FileImportWriter
from tests.conftest import Database
from tests.sinks.file.test_file_arrow_lines import batches_of, create_table, read_as_text

CHUNK = 256 << 10


def resident_pages(path: Path) -> int:
    """How many of the file's pages the page cache holds (mincore of a shared mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_long,
    ]  # fmt: skip
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            vector = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
            if libc.mincore(addr, size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return sum(b & 1 for b in vector.raw)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def append(
    path: Path, total: int, release: bool, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[int, int]]:
    """`total` bytes appended in CHUNKs, fsynced; with `release`, through CacheRelease.
    The (offset, length) of each posix_fadvise request made."""
    requests: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def recorded(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_DONTNEED
        requests.append((offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recorded)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        cache = CacheRelease(fd)
        for _ in range(total // CHUNK):
            os.write(fd, b"x" * (CHUNK - 1) + b"\n")
            if release:
                cache.appended(CHUNK)
        os.fsync(fd)
        if release:
            cache.written()
    finally:
        os.close(fd)
        monkeypatch.setattr(os, "posix_fadvise", real)
    return requests


def test_written_pages_are_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "RELEASE_BYTES", 1 << 20)
    kept, released = tmp_path / "kept", tmp_path / "released"
    # the file already holds a line: the task's requests start after it
    released.write_bytes(b"before\n")
    assert append(kept, 8 << 20, False, monkeypatch) == []
    assert resident_pages(kept) == (8 << 20) // mmap.PAGESIZE
    requests = append(released, 8 << 20, True, monkeypatch)
    # but the first page, which the line before shares (Linux keeps partial pages)
    assert resident_pages(released) == 1
    # one request per MiB, each from where the one two back ended; then the whole task
    mib, begin = 1 << 20, 7
    ends = [begin + mib * k for k in range(1, 9)]
    starts = [begin, begin, *ends[:6]]
    assert requests == [(s, e - s) for s, e in zip(starts, ends, strict=True)] + [(begin, 8 * mib)]
    assert released.read_bytes() == b"before\n" + (b"x" * (CHUNK - 1) + b"\n") * 32


def test_an_import_leaves_its_lines_out_of_the_page_cache(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(imports, "RELEASE_BYTES", 1 << 20)
    monkeypatch.setattr(imports, "WRITE_BYTES", 64 << 10)
    create_table(db.connect())
    job, rows = read_as_text(db)
    batches = batches_of(rows * 60, [len(rows)] * 59)
    path = tmp_path / "import.jsonl"
    assert FileImportWriter(str(path), job).write(iter(batches)) == len(rows) * 60
    assert path.stat().st_size > 3 << 20
    assert resident_pages(path) == 0
    # the lines are the writer's lines without the requests
    monkeypatch.setattr(imports, "RELEASE_BYTES", 1 << 40)
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: None)
    again = tmp_path / "again.jsonl"
    FileImportWriter(str(again), job).write(iter(batches))
    assert path.read_bytes() == again.read_bytes()
