"""The BigQuery sink through an outage longer than the Google client's retries (issue 13):
the test's own local-bigquery (scripts/services.py's LocalBigQuery, so the shared one of
`make services` is never stopped) is stopped for 30 s mid-stream and started again on
the same port and data directory.

pg2sink runs with --bigquery-retry-deadline 3s, so every request of the first batch after
the stop gives up within seconds (with the client's default, 10 minutes, the outage would
stay inside its retries). The batch is then retried with backoff until BigQuery answers:
the stream waits, logs one line when the outage starts and one when it ends, says so on
GET /status, confirms nothing that is not loaded, and afterwards the view equals the
table and no change is twice in the raw table. (Before those retries, such a batch
failed the sink for good: every session after it raised the same error until a restart.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import services

from pg2sink.errors import SinkUnavailableError
from pg2sink.sinks.bigquery import sink as bigquery_sink
from pg2sink.sinks.bigquery.api import upload_retries
from pg2sink.sinks.bigquery.config import BigQueryConfig
from pg2sink.sinks.bigquery.sink import BigQuerySink
from pg2sink.sinks.bigquery.warehouse import Warehouse
from tests.conftest import Database, Pg2Sink, wait_for
from tests.sinks.bigquery.test_bigquery import pg_rows
from tests.sinks.duckdb.test_duckdb import caught_up
from tests.sinks.kafka.test_kafka_health import api_url, status, status_without_slot
from tests.sinks.nats.test_nats import change, table_schema
from tests.sinks.warehouse_support import PROJECT, UNSPACED, bq_rows
from tests.support import FAST, Proc, own_server

#: How long BigQuery stays away, in seconds (the 30 s of the other sinks' outage tests).
OUTAGE = 30.0


@pytest.fixture
def own_bigquery() -> Iterator[services.LocalBigQuery]:
    """A local-bigquery of the test's own on a free port (its data survives a restart)."""
    with own_server(services.LocalBigQuery, "bigquery") as server:
        yield server


def start(
    db: Database, proc: Proc, server: services.LocalBigQuery, dataset: str
) -> tuple[psycopg.Connection[Any], Pg2Sink]:
    """Table kv, and pg2sink streaming it into `dataset` of `server`, its requests retried
    for 3 s."""
    conn: psycopg.Connection[Any] = db.connect()
    conn.execute("CREATE TABLE kv (id int PRIMARY KEY, v text)")
    p = proc(
        "--sink", "bigquery", "--bigquery-project", PROJECT, "--bigquery-dataset", dataset,
        "--bigquery-endpoint", server.url, "--bigquery-retry-deadline", "3s", *FAST, *UNSPACED,
    ).start()  # fmt: skip
    p.wait_streaming(60)
    return conn, p


def assert_loaded_once(conn: psycopg.Connection[Any], url: str, dataset: str) -> None:
    """The view equals the table, and no change is twice in the raw table."""
    ds = f"{PROJECT}.{dataset}"
    got = bq_rows(url, f"SELECT * FROM `{ds}.public_kv` ORDER BY id")
    assert got == pg_rows(conn, "SELECT * FROM kv ORDER BY id")
    twice = bq_rows(
        url,
        f"SELECT _pg2sink_lsn, _pg2sink_sequence FROM `{ds}.public_kv_raw` "
        "GROUP BY 1, 2 HAVING COUNT(*) > 1",
    )
    assert twice == []


@pytest.mark.slow
def test_a_30s_outage_is_waited_out_and_every_change_is_loaded_once(
    db: Database, pg2sink_proc: Proc, own_bigquery: services.LocalBigQuery, topic_prefix: str
) -> None:
    dataset = f"d_{topic_prefix}"
    conn, p = start(db, pg2sink_proc, own_bigquery, dataset)
    conn.execute("INSERT INTO kv SELECT g, 'v' || g FROM generate_series(1, 5) g")
    caught_up(db, timeout=60)
    own_bigquery.stop()  # between batches: no load job is cut short
    stopped = time.monotonic()
    conn.execute("UPDATE kv SET v = 'during' WHERE id = 1")
    first_in_outage = db.current_lsn()
    last = 5
    while time.monotonic() - stopped < OUTAGE:
        with conn.transaction():
            conn.execute(
                "INSERT INTO kv SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
                (last + 1, last + 10),
            )
            conn.execute("UPDATE kv SET v = v || '+' WHERE id = %s", (last - 2,))
            conn.execute("DELETE FROM kv WHERE id = %s", (last - 3,))
        last += 10
        time.sleep(1)
    confirmed = db.slot_confirmed_lsn()
    assert confirmed is not None and confirmed < first_in_outage  # nothing confirmed early
    code, during = status(api_url(p))
    assert code == 500 and "Connection refused" in during["problems"]["sink"], (during, p.stderr())
    own_bigquery.start()
    conn.execute("INSERT INTO kv VALUES (%s, 'after')", (last + 1,))
    caught_up(db, timeout=60)
    assert status_without_slot(api_url(p)) == (
        200,
        {"status": "ok", "replication": "ok", "sink": "ok"},
    )
    assert p.stop() == 0
    assert_loaded_once(conn, own_bigquery.url, dataset)
    assert (conn.execute("SELECT count(*) FROM kv").fetchone() or (0,))[0] > 100
    err = p.stderr()
    # the stream waited (no session ended): one line when BigQuery went, one when it came
    assert err.count("retrying with backoff until it answers") == 1, err
    assert err.count("the sink answers again after") == 1, err
    assert "streaming stopped" not in err


@pytest.mark.slow
def test_a_stop_during_an_outage_confirms_nothing_and_the_next_start_loads_it(
    db: Database, pg2sink_proc: Proc, own_bigquery: services.LocalBigQuery, topic_prefix: str
) -> None:
    dataset = f"d_{topic_prefix}"
    conn, p = start(db, pg2sink_proc, own_bigquery, dataset)
    conn.execute("INSERT INTO kv VALUES (1, 'before')")
    caught_up(db, timeout=60)
    own_bigquery.stop()
    conn.execute("INSERT INTO kv VALUES (2, 'during')")
    conn.execute("UPDATE kv SET v = 'changed' WHERE id = 1")
    during = db.current_lsn()
    wait_for(lambda: "retrying with backoff" in p.stderr(), 30, "the outage to be noticed")
    stopping = time.monotonic()
    assert p.stop(timeout=20) == 0  # the stop does not wait for BigQuery
    assert time.monotonic() - stopping < 15
    assert "stopped while the sink was unavailable" in p.stderr()
    confirmed = db.slot_confirmed_lsn()
    assert confirmed is not None and confirmed < during
    own_bigquery.start()
    p.start().wait_streaming(60)
    caught_up(db, timeout=60)
    assert p.stop() == 0
    assert_loaded_once(conn, own_bigquery.url, dataset)


def test_a_full_batch_behind_a_commit_in_an_outage_is_dropped_and_loaded_once_later(
    own_bigquery: services.LocalBigQuery,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sink in process (batches of 3 records): while a commit waits out the outage, a
    full batch behind it raises SinkUnavailableError and is forgotten; the replay from
    the confirmed LSN (what PostgreSQL sends again after the reconnect) loads it once."""
    caplog.set_level(logging.INFO, logger="pg2sink")
    monkeypatch.setattr(bigquery_sink, "MAX_BATCH_RECORDS", 3)
    dataset = f"d_{topic_prefix}"
    sink = BigQuerySink(
        BigQueryConfig(
            bigquery_project=PROJECT,
            bigquery_dataset=dataset,
            bigquery_endpoint=own_bigquery.url,
            bigquery_retry_deadline=1.0,
            bigquery_load_interval=0.0,
        )
    )
    sink.open()
    try:
        sink.write(table_schema("t"))
        sink.write(change(1))
        sink.checkpoint(1101)
        assert sink.flush() == 1101
        own_bigquery.stop()
        sink.write(change(2))
        sink.checkpoint(1102)
        sink.start_flush()
        wait_for(lambda: "retrying with backoff" in caplog.text, 30, "the outage")
        assert sink.flush() == 1101  # no wait, nothing new
        with pytest.raises(SinkUnavailableError, match="a full batch waits behind it"):
            for i in (3, 4, 5):
                sink.write(change(i))
                sink.checkpoint(1100 + i)
        own_bigquery.start()
        wait_for(lambda: sink.flush() == 1102, 60, "the retried commit")
        sink.write(table_schema("t"))  # the replay: a new session describes the table again
        for i in (2, 3, 4, 5):
            sink.write(change(i))
            sink.checkpoint(1100 + i)
        wait_for(lambda: sink.flush() == 1105, 60, "the batches after the outage")
    finally:
        sink.close()
    lsns = bq_rows(
        own_bigquery.url,
        f"SELECT _pg2sink_lsn, COUNT(*) FROM `{PROJECT}.{dataset}.public_t_raw` GROUP BY 1 "
        "ORDER BY 1",
    )
    assert lsns == [(1000 + i, 1) for i in range(1, 6)]
    assert caplog.text.count("the sink answers again") == 1


def test_a_load_upload_to_a_server_gone_away_gives_up_within_the_retry_deadline(
    own_bigquery: services.LocalBigQuery, topic_prefix: str
) -> None:
    """A load's upload (google-resumable-media, which takes no `retry`) is held to
    --bigquery-retry-deadline too: with the client's default of 6 retries it gave up after
    65 s, so a server stopped between a batch's job lookup and its upload went unreported
    for over a minute (CI saw GET /status say ok 30 s into an outage)."""
    import pyarrow as pa  # type: ignore[import-untyped]

    config = BigQueryConfig(
        bigquery_project=PROJECT,
        bigquery_dataset=f"d_{topic_prefix}",
        bigquery_endpoint=own_bigquery.url,
        bigquery_retry_deadline=2.0,
    )
    warehouse = Warehouse(config, "slot")
    try:
        own_bigquery.stop()
        started = time.monotonic()
        with pytest.raises(SinkUnavailableError, match="Connection refused"):
            warehouse.load("t_raw", pa.table({"a": [1]}), "job")
        assert time.monotonic() - started < 10
        started = time.monotonic()
        with pytest.raises(SinkUnavailableError, match=r"load t_raw: .*Connection refused"):
            warehouse._start_load("t_raw", pa.table({"a": [1]}), "job_0")
        assert time.monotonic() - started < 10
    finally:
        warehouse.close()


@pytest.mark.parametrize(
    ("deadline", "retries"), [(0.5, 0), (1.0, 1), (3.0, 2), (63.0, 6), (600.0, 14)]
)
def test_the_upload_retries_are_the_waits_that_fit_in_the_deadline(
    deadline: float, retries: int
) -> None:
    # waits of 1, 2, 4, ... 64, 64 ... s: 3 s holds 1 + 2; 600 s holds 63 + 8 * 64
    assert upload_retries(deadline) == retries
