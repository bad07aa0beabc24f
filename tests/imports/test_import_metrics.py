"""The IMPORT records an import writes are counted in pg2sink_changes_total, as served
on /metrics by a real pg2sink: {operation="IMPORT"} equals the rows written, as
pg2sink_import_rows_read_total does."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Database, Pg2Sink
from tests.imports.support import read_changelog, start_with_imports, wait_imported

pytestmark = pytest.mark.slow

ROWS = 30_000


def _sample(metrics: str, name: str, **labels: str) -> float:
    """The value of the one sample of `name` whose labels include `labels`."""
    found = []
    for line in metrics.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            found.append(float(match.group(2)))
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_import_records_are_counted_as_changes(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE public.items (id int PRIMARY KEY, v text)")
    conn.execute(
        "INSERT INTO public.items SELECT g, 'v' || g FROM generate_series(1, %s) g", (ROWS,)
    )
    out = tmp_path / "changes.jsonl"
    proc = start_with_imports(pg2sink_proc, out)
    wait_imported(db, {"public.items"}, proc)
    match = re.search(r"/metrics on (http://\S+)", proc.stderr())
    assert match, proc.stderr()
    with urllib.request.urlopen(match.group(1) + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert proc.stop() == 0
    written = sum(r.get("operation") == "IMPORT" for r in read_changelog(out))
    assert written == ROWS
    table = {"schema": "public", "table": "items"}
    assert _sample(metrics, "pg2sink_import_rows_read_total", **table) == ROWS
    assert _sample(metrics, "pg2sink_changes_total", operation="IMPORT", **table) == ROWS
