"""Spark's console output goes into pg2sink's own log: with --log-format json every line
pg2sink writes to stderr stays a JSON object, Spark's start-up notes included."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.conftest import Database, Pg2Sink
from tests.imports.support import start_with_imports, wait_imported

pytestmark = pytest.mark.slow


def test_json_log_stays_json_through_spark(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO public.t SELECT generate_series(1, 100)")
    proc = start_with_imports(
        pg2sink_proc, tmp_path / "out.jsonl", "--log-format", "json", "--log-level", "debug"
    )
    wait_imported(db, {"public.t"}, proc)
    assert proc.stop() == 0
    lines = [line for line in proc.stderr().splitlines() if line.strip()]
    not_json = []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line)["event"])
        except (ValueError, KeyError):
            not_json.append(line)
    assert not not_json, "lines of stderr that are not JSON log records:\n" + "\n".join(not_json)
    # the JVM did print (its start-up notes), and it came through the log
    assert any(e.startswith("spark: ") for e in events), events
