"""The default `--file-path -` on every kind of standard output a user gives it.

A pipe (`pg2sink | consumer`), a terminal and /dev/null cannot be fsynced (EINVAL):
the file sink flushes them and counts that as durable. Each test runs pg2sink as users
do, with only its standard output changed, commits rows and checks that the records
arrive (where they can be read), that the slot confirms them, and that pg2sink keeps
streaming through many flush intervals instead of exiting.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import orjson
import pytest

from tests.conftest import Database, Pg2Sink, pg2sink_for, wait_for
from tests.support import FAST, Proc, start

#: Flush intervals (FAST: 0.1 s) pg2sink must outlive after the rows are confirmed.
INTERVALS = 20


@dataclass
class Output(Pg2Sink):
    """pg2sink with its standard output on `stdout` (the fixture's goes to /dev/null)."""

    stdout: int | IO[bytes] = subprocess.DEVNULL

    def start(self) -> Output:
        self.runs += 1
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pg2sink", *self.args],
                env=self.env,
                stdout=self.stdout,
                stderr=err,
                cwd=self.workdir,
            )
        return self


class Reader:
    """Reads a descriptor to its end in a thread, so that pg2sink never blocks on it."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._data = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except OSError:  # a pty's master reads EIO once the other side closed
                return
            if not chunk:
                return
            with self._lock:
                self._data += chunk

    def records(self) -> list[dict[str, object]]:
        """The complete lines so far, parsed (a terminal ends them with \\r\\n)."""
        with self._lock:
            data = bytes(self._data)
        lines = data.replace(b"\r\n", b"\n").split(b"\n")[:-1]
        return [orjson.loads(line) for line in lines if line]


@pytest.fixture(params=["pipe", "pty", "devnull"])
def output(request: pytest.FixtureRequest) -> Iterator[tuple[int | IO[bytes], Reader | None]]:
    """What pg2sink's standard output is, and a reader of it (None: /dev/null)."""
    if request.param == "devnull":
        yield subprocess.DEVNULL, None
        return
    if request.param == "pipe":
        read_fd, write_fd = os.pipe()
    else:
        read_fd, write_fd = os.openpty()
    reader = Reader(read_fd)
    try:
        yield write_fd, reader
    finally:
        os.close(write_fd)
        os.close(read_fd)


def test_standard_output_that_cannot_be_fsynced_keeps_streaming(
    db: Database, tmp_path: Path, output: tuple[int | IO[bytes], Reader | None]
) -> None:
    stdout, reader = output
    conn = db.connect()
    conn.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    base = pg2sink_for(db, tmp_path, *FAST)  # no --file-path: standard output
    proc = Output(base.args, base.env, base.workdir, stdout=stdout).start()
    try:
        proc.wait_streaming()
        for first in (1, 101, 201):
            conn.execute(
                "INSERT INTO public.t SELECT g, 'v' FROM generate_series(%s::int, %s::int) g",
                (first, first + 99),
            )
            _wait_confirmed(db, proc)
        if reader is not None:
            wait_for(lambda: len(_inserts(reader)) == 300, 10, "300 INSERT records on stdout")
            assert sorted(_inserts(reader)) == list(range(1, 301))
        deadline = time.monotonic() + INTERVALS * 0.1
        while _running(proc) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.stop(signal.SIGTERM) == 0, proc.stderr()
        assert "fsync" not in proc.stderr()
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait(10)


def test_decode_only_cuts_a_torn_line_of_its_output_file(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    """--decode-only appends to --file-path too: a line a kill -9 tore is cut first,
    not glued to the first line of the next run."""
    conn = db.connect()
    conn.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
    out = tmp_path / "decoded.txt"
    whole, torn = b"0/1 BEGIN xid=1\n", b"0/2 INSERT public.t (id="
    out.write_bytes(whole + torn)
    proc = start(pg2sink_proc, out, "--decode-only")
    conn.execute("INSERT INTO public.t VALUES (1)")
    wait_for(lambda: b"COMMIT" in out.read_bytes(), what="the commit decoded")
    assert proc.stop() == 0
    data = out.read_bytes()
    assert data.startswith(whole)
    assert torn not in data  # cut, not glued to the next run's first line
    assert data.endswith(b"\n") and b"COMMIT" in data
    assert f"partial line of {len(torn)} bytes" in proc.stderr()


def _wait_confirmed(db: Database, proc: Pg2Sink) -> None:
    """Until the slot confirmed everything committed so far, pg2sink running all along."""
    target = db.current_lsn()
    wait_for(
        lambda: _running(proc) and (db.slot_confirmed_lsn() or 0) >= target,
        what="the slot to confirm the last commit",
    )


def _running(proc: Pg2Sink) -> bool:
    """True, or an AssertionError with pg2sink's standard error when it exited."""
    assert proc.proc is not None
    code = proc.proc.poll()
    assert code is None, f"pg2sink exited {code}:\n{proc.stderr()}"
    return True


def _inserts(reader: Reader) -> list[int]:
    ids = []
    for r in reader.records():
        after = r.get("after")
        if r.get("operation") == "INSERT" and isinstance(after, dict):
            ids.append(int(after["id"]))
    return ids
