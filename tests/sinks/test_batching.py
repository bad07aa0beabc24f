"""BackgroundCommits' spacing (pg2sink/sinks/warehouse/commits.py, Spacing): which batches wait
for `min_interval` and which go at once. The commit is a plain function that records its
calls: BackgroundCommits is pg2sink's own code, with no server behind it here (the
BigQuery tests run it against local-bigquery)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence

import pytest

from pg2sink.changelog.records import Record
from pg2sink.sinks.warehouse.commits import BackgroundCommits
from tests.conftest import wait_for
from tests.sinks.nats.test_nats import change, table_schema

INTERVAL = 1.0


class Recorder:
    """A commit that keeps (records, lsn) of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, records: Sequence[Record], lsn: int) -> int:
        self.calls.append((len(records), lsn))
        return lsn


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def commits(recorder: Recorder) -> Iterator[BackgroundCommits]:
    c = BackgroundCommits(recorder, "test-batching", max_records=5, min_interval=INTERVAL)
    c.start(0)
    yield c
    c.stop()


def transaction(commits: BackgroundCommits, lsn: int, rows: int = 1) -> None:
    for i in range(rows):  # sequences 0, 1, ... (a lower one would start it again)
        commits.write(dataclasses.replace(change(i), sequence=i))
    commits.checkpoint(lsn)


def test_a_batch_started_within_the_interval_waits_for_it(
    commits: BackgroundCommits, recorder: Recorder
) -> None:
    commits.write(table_schema("t"))
    transaction(commits, 100)
    commits.start_flush()
    wait_for(lambda: commits.acknowledged() == 100, 5, "the first batch")
    started = time.monotonic()
    transaction(commits, 200)
    commits.start_flush()  # too soon: held
    time.sleep(0.3)
    transaction(commits, 300)
    commits.start_flush()
    assert commits.acknowledged() == 100 and recorder.calls == [(2, 100)]
    while commits.acknowledged() != 300:
        commits.start_flush()  # as the stream's flushes do
        time.sleep(0.05)
    assert time.monotonic() - started >= INTERVAL * 0.9
    assert recorder.calls == [(2, 100), (2, 300)]  # the two transactions in one batch


def test_checkpoints_only_a_full_batch_and_a_flush_are_not_held(
    commits: BackgroundCommits, recorder: Recorder
) -> None:
    transaction(commits, 100)
    commits.start_flush()
    wait_for(lambda: commits.acknowledged() == 100, 5, "the first batch")
    commits.checkpoint(150)  # a keepalive's position: no records
    commits.start_flush()
    wait_for(lambda: commits.acknowledged() == 150, 0.5, "the checkpoint-only batch")
    transaction(commits, 200, rows=5)  # max_records: committed at its checkpoint
    wait_for(lambda: commits.acknowledged() == 200, 0.5, "the full batch")
    transaction(commits, 300)
    assert commits.flush() == 300  # a stop's flush commits at once
    assert recorder.calls == [(1, 100), (0, 150), (5, 200), (1, 300)]
