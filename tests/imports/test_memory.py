"""Imports bounded by bytes, not rows (docs/imports.md, "Memory"), into the sinks that
need no server: the file, DuckDB and null sinks (tests/imports/memory_support.py says
what runs; test_memory_servers.py the sinks with a server); and a single value larger
than the heap holds: one line naming the option to raise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Database, Pg2Sink
from tests.imports.memory_support import HEAP, run_wide_import, wait_for_job
from tests.imports.support import IMPORTS_ON

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("sink", ["file", "duckdb", "null"])
def test_wide_rows_import_with_a_512m_driver_heap_while_streaming(
    sink: str, db: Database, pg2sink_proc: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run_wide_import(sink, db, pg2sink_proc, tmp_path, request)


def test_an_out_of_memory_error_names_the_option_to_raise(
    db: Database, pg2sink_proc: Any, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.huge (id int PRIMARY KEY, v text)")
    conn.execute("ALTER TABLE public.huge ALTER COLUMN v SET STORAGE EXTERNAL")
    # one value of 300 MB: more than a 512 MB heap holds in the copies a read makes
    conn.execute("INSERT INTO public.huge VALUES (1, repeat('x', 300000000))")
    proc: Pg2Sink = pg2sink_proc(
        "--file-path",
        str(tmp_path / "changes.jsonl"),
        "--spark-driver-memory",
        HEAP,
        "--spark-session-failures",
        "1",
        "--import-backoff-base",
        "10m",
        env=IMPORTS_ON,
    )
    proc.start()
    proc.wait_streaming(60)

    wait_for_job(db, proc, "public.huge", "failed", 240)
    assert proc.stop() == 0
    err = proc.stderr()
    said = [line for line in err.splitlines() if "import of public.huge failed" in line]
    assert len(said) == 1, err
    assert "ran out of memory (heap 512m): raise --spark-driver-memory" in said[0], err
    assert "Traceback" not in err, err
