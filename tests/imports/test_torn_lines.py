"""kill -9 while Spark executors append an import to the file sink (issue #11 item 2).

A kill inside an executor's write(2) leaves a torn line at the end of the file; the
next run must cut it before it appends (else its first line glues to the torn one),
and the file must still converge to the table. Real PostgreSQL, real Spark (local
mode), pg2sink run as users run it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Database, Pg2Sink, descendants, wait_for
from tests.imports.support import (
    replay,
    select_rows,
    start_with_imports,
    wait_confirmed,
    wait_imported,
)

pytestmark = pytest.mark.slow

#: Rows of about 2 kB: an Arrow batch (10,000 rows) is one append of about 20 MB, long
#: enough to be caught half written.
ROWS = 60_000
#: Bytes past the last newline that only an executor's append writes (the stream
#: writes a few small lines here).
HALF_WRITTEN = 1 << 20


def strict_changelog(path: Path) -> list[dict[str, Any]]:
    """Every line parsed (tests/imports/support.py's read_changelog skips bad ones)."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), f"a partial last line: {data[-80:]!r}"
    return [json.loads(line, parse_float=Decimal) for line in data.split(b"\n")[:-1]]


def _process_groups(pids: list[int]) -> set[int]:
    """The process groups of `pids` (PySpark's daemon and its workers have their own)."""
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    return groups


def _kill_inside_an_executor_write(proc: Pg2Sink, out: Path) -> int:
    """SIGKILL pg2sink, its JVM and every Python worker while an executor's append is
    half written; the bytes of the torn line left at the end of the file."""
    assert proc.proc is not None
    pid = proc.proc.pid
    own_group = os.getpgid(0)  # pytest's, which pg2sink shares: never killed as a group

    def worker_groups() -> set[int]:
        """PySpark's daemon and workers: a process group of their own."""
        assert proc.proc is not None and proc.proc.poll() is None, proc.stderr()
        return _process_groups(descendants(pid)) - {own_group}

    groups = wait_for(worker_groups, 120, "Spark's Python workers")
    whole_end, looked = 0, time.monotonic()
    deadline = looked + 240
    with open(out, "rb") as f:
        while time.monotonic() < deadline:
            size = os.fstat(f.fileno()).st_size
            if size and os.pread(f.fileno(), 1, size - 1) == b"\n":
                whole_end = size
            elif size - whole_end > HALF_WRITTEN:
                break
            if time.monotonic() - looked > 0.1:  # workers come and go between tasks
                groups, looked = worker_groups() or groups, time.monotonic()
        else:
            raise AssertionError("no executor append was seen half written")
    killed = 0
    for group in groups:  # the writers first: the append is still going on
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
            killed += 1
    assert killed, "the Python workers were gone before the kill"
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    proc.proc.wait(10)
    data = out.read_bytes()
    return len(data) - (data.rfind(b"\n") + 1)


def test_kill_9_while_executors_write_leaves_only_whole_lines(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.big (id int PRIMARY KEY, pad text)")
    conn.execute(
        "INSERT INTO public.big SELECT g, repeat('x', 2000) || g FROM generate_series(1, %s) g",
        (ROWS,),
    )
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(pg2sink_proc, out)
    torn = _kill_inside_an_executor_write(proc, out)
    assert torn > 0  # the kill landed inside an append: the file ends in a torn line

    proc.start()
    proc.wait_streaming(60)
    wait_imported(db, {"public.big"}, proc)
    conn.execute("UPDATE public.big SET pad = 'changed' WHERE id % 1000 = 0")
    wait_confirmed(db, proc)
    assert proc.stop() == 0
    records = strict_changelog(out)  # no torn or glued line anywhere
    assert f"partial line of {torn} bytes" in proc.stderr()
    state = replay(records, "public.big", ("id",))
    want = {(r["id"],): r for r in select_rows(conn, "public.big", ("id", "pad"))}
    assert len(want) == ROWS
    assert state == want
