"""Imports bounded by bytes, not rows (docs/imports.md, "Memory"), into the sinks with a
server: Kafka, NATS, Kinesis and BigQuery (tests/imports/memory_support.py says what
runs; in a module of its own so that the test session's two processes share the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Database
from tests.imports.memory_support import large_payload_nats, run_wide_import

pytestmark = pytest.mark.slow

__all__ = ["large_payload_nats"]  # the fixture, for the NATS sink's run


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("sink", ["kafka", "nats", "kinesis", "bigquery"])
def test_wide_rows_import_with_a_512m_driver_heap_while_streaming(
    sink: str, db: Database, pg2sink_proc: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run_wide_import(sink, db, pg2sink_proc, tmp_path, request)
