"""The BigQuery sink (--sink=bigquery) end to end: a real PostgreSQL, pg2sink run as users
run it, and local-bigquery (`make services`' BigQuery API server, started by the
`bigquery_endpoint` fixture) read afterwards with google-cloud-bigquery
(docs/sinks/bigquery.md says what only the real BigQuery shows).

The latest-state view must equal `SELECT * FROM table` after the DuckDB sink's workload
(inserts, updates with key changes and unchanged TOASTed values, deletes, TRUNCATE) and
ADD/DROP COLUMN; a batch loaded again under the same job id is loaded once; nothing is
confirmed to PostgreSQL while the server has not finished the load.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
import services
from google.api_core import exceptions as google_errors

from pg2sink.errors import SinkUnavailableError
from pg2sink.sinks.bigquery.api import request_error
from pg2sink.sinks.bigquery.rows import state_rows
from pg2sink.sinks.bigquery.warehouse import STATE_TABLE, Warehouse, client
from tests.conftest import Database, Pg2Sink, run_cli, wait_for
from tests.imports.support import wait_imported
from tests.sinks.duckdb.test_duckdb import BIG, caught_up, create_workload_tables, run_workload
from tests.sinks.warehouse_support import PROJECT, UNSPACED, bq_rows, config, normal
from tests.support import FAST, Proc


@pytest.fixture
def dataset(topic_prefix: str) -> str:
    return f"d_{topic_prefix}"


@pytest.fixture
def conn(db: Database) -> psycopg.Connection[Any]:
    c = db.connect()
    c.execute("SET TimeZone = 'UTC'")
    return c


def start(proc: Proc, endpoint: str, dataset: str, load_interval: str = "0s") -> Pg2Sink:
    p = proc(
        "--sink", "bigquery", "--bigquery-project", PROJECT, "--bigquery-dataset", dataset,
        "--bigquery-endpoint", endpoint, "--bigquery-load-interval", load_interval, *FAST,
    ).start()  # fmt: skip
    p.wait_streaming(60)
    return p


def pg_rows(
    conn: psycopg.Connection[Any], query: str, arrays: frozenset[str] = frozenset()
) -> list[tuple[Any, ...]]:
    """PostgreSQL's rows as the view shows them: BigQuery has neither NULL arrays nor NULL
    elements in arrays, so both read as empty arrays in the `arrays` columns
    (docs/sinks/bigquery.md)."""
    cur = conn.execute(query)
    names = [d.name for d in cur.description or ()]
    out = []
    for row in cur.fetchall():
        values = [normal(v) for v in row]
        for i, name in enumerate(names):
            if name in arrays and (values[i] is None or None in values[i]):
                values[i] = []
        out.append(tuple(values))
    return out


# --- configuration -----------------------------------------------------------------------


def test_bigquery_needs_a_project_and_a_dataset() -> None:
    done = run_cli("stream", "--sink", "bigquery", "--bigquery-project", PROJECT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "needs --bigquery-project and --bigquery-dataset" in done.stderr


def test_a_dataset_name_bigquery_refuses_is_a_one_line_error() -> None:
    done = run_cli(
        "stream", "--sink", "bigquery", "--bigquery-project", PROJECT,
        "--bigquery-dataset", "shop-eu",
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--bigquery-dataset 'shop-eu'" in done.stderr


# --- what an error means ------------------------------------------------------------------


def _error(kind: Any, message: str, reason: str | None = None) -> Exception:
    """An error as Google's client raises it (its classes are untyped)."""
    if reason is None:
        return kind(message)  # type: ignore[no-any-return]
    return kind(message, errors=[{"reason": reason}])  # type: ignore[no-any-return]


def _gave_up(cause: Exception | None) -> Exception:
    """The client's RetryError once its deadline ran out on `cause`."""
    return google_errors.RetryError("Deadline of 3.0s exceeded", cause)  # type: ignore[no-untyped-call]


_LIMITED = _error(google_errors.Forbidden, "Exceeded rate limits", "rateLimitExceeded")
_QUOTA = _error(google_errors.Forbidden, "Quota exceeded", "quotaExceeded")


@pytest.mark.parametrize(
    ("error", "unavailable"),
    [
        (_LIMITED, True),  # BigQuery's rate limits are 403s with a reason, not 429s
        (_gave_up(_LIMITED), True),
        (_gave_up(None), True),
        (_error(google_errors.ServiceUnavailable, "down"), True),
        (requests.ConnectionError("Connection refused"), True),
        (_QUOTA, False),  # a day's quota spent: retried, each attempt spends more
        (_error(google_errors.Forbidden, "Access Denied", "accessDenied"), False),
        (_error(google_errors.BadRequest, "Invalid", "invalid"), False),
        (_error(google_errors.MethodNotImplemented, "not implemented"), False),
    ],
)
def test_an_error_is_an_outage_or_a_refusal(error: Exception, unavailable: bool) -> None:
    got = request_error("load t", error)
    assert isinstance(got, SinkUnavailableError) is unavailable, got
    assert str(got).startswith("bigquery: load t: ") and "\n" not in str(got)
    assert ("--bigquery-load-interval" in str(got)) is (error is _QUOTA)


# --- the view equals the table ------------------------------------------------------------


@pytest.mark.slow
def test_the_view_equals_the_table_after_a_workload_and_schema_changes(
    db: Database,
    conn: psycopg.Connection[Any],
    pg2sink_proc: Proc,
    bigquery_endpoint: str,
    dataset: str,
) -> None:
    create_workload_tables(conn)
    p = start(pg2sink_proc, bigquery_endpoint, dataset)
    run_workload(conn)
    conn.execute("ALTER TABLE items ADD COLUMN note text")
    conn.execute("ALTER TABLE items ADD COLUMN qty int DEFAULT 7")
    conn.execute("UPDATE items SET note = 'noted' WHERE id = 2")
    conn.execute("ALTER TABLE items DROP COLUMN flag")
    conn.execute("INSERT INTO items (id, name, price, note) VALUES (400, 'late', 1.5, 'n')")
    caught_up(db, timeout=120)
    assert p.stop() == 0
    ds = f"{PROJECT}.{dataset}"
    for view, table, order in (
        ("public_items", "items", "id"),
        ("public_docs", "docs", "lang, id"),
        ("public_log", "log", "line"),
    ):
        got = bq_rows(bigquery_endpoint, f"SELECT * FROM `{ds}.{view}` ORDER BY {order}")
        expected = pg_rows(conn, f"SELECT * FROM {table} ORDER BY {order}", frozenset({"tags"}))
        assert got == expected, view
    # the raw table keeps every change and the dropped column; TOAST filled and said so
    (filled,) = bq_rows(
        bigquery_endpoint,
        f"SELECT COUNT(*) FROM `{ds}.public_items_raw` "
        "WHERE 'big' IN UNNEST(_pg2sink_unchanged_toast)",
    )
    assert filled[0] >= 2
    bq = client(config(bigquery_endpoint, dataset))
    raw = bq.get_table(f"{ds}.public_items_raw")
    bq.close()  # type: ignore[no-untyped-call]
    assert {"flag", "note", "qty"} <= {f.name for f in raw.schema}
    assert raw.time_partitioning.field == "_pg2sink_timestamp"
    assert raw.clustering_fields == ["id"]
    types = {f.name: (f.field_type, f.precision, f.scale) for f in raw.schema}
    assert types["price"] == ("NUMERIC", 10, 2) and types["at"][0] == "TIMESTAMP"


@pytest.mark.slow
def test_a_restart_continues_without_duplicates(
    db: Database,
    conn: psycopg.Connection[Any],
    pg2sink_proc: Proc,
    bigquery_endpoint: str,
    dataset: str,
) -> None:
    conn.execute("CREATE TABLE docs (lang text, id int, body text, PRIMARY KEY (lang, id))")
    p = start(pg2sink_proc, bigquery_endpoint, dataset)
    conn.execute("INSERT INTO docs VALUES ('en', 1, 'one')")
    caught_up(db, timeout=120)
    assert p.stop() == 0
    p.start().wait_streaming(60)
    conn.execute("INSERT INTO docs VALUES ('en', 2, 'two')")
    caught_up(db, timeout=120)
    assert p.stop() == 0
    ds = f"{PROJECT}.{dataset}"
    assert bq_rows(bigquery_endpoint, f"SELECT * FROM `{ds}.public_docs` ORDER BY id") == [
        ("en", 1, "one"),
        ("en", 2, "two"),
    ]
    assert bq_rows(bigquery_endpoint, f"SELECT COUNT(*) FROM `{ds}.public_docs_raw`") == [(2,)]


# --- imports -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tables_existing_rows_are_imported(
    db: Database,
    conn: psycopg.Connection[Any],
    pg2sink_proc: Proc,
    bigquery_endpoint: str,
    dataset: str,
) -> None:
    conn.execute("CREATE TABLE old (id int PRIMARY KEY, s text, big text, at timestamptz)")
    conn.execute("ALTER TABLE old ALTER COLUMN big SET STORAGE EXTERNAL")
    conn.execute(
        "INSERT INTO old SELECT g, 's' || g, CASE WHEN g = 7 THEN %s END, "
        "'2024-01-01 00:00+00'::timestamptz + g * interval '1 hour' "
        "FROM generate_series(1, 3000) g",
        (BIG,),
    )
    p = pg2sink_proc(
        "--sink", "bigquery", "--bigquery-project", PROJECT, "--bigquery-dataset", dataset,
        "--bigquery-endpoint", bigquery_endpoint, *FAST, *UNSPACED,
        env={"PG2SINK_NO_IMPORTS": "0"},
    ).start()  # fmt: skip
    p.wait_streaming(60)
    wait_imported(db, {"public.old"}, p)
    conn.execute("UPDATE old SET s = 'streamed' WHERE id IN (7, 8)")  # 7: TOAST unchanged
    conn.execute("DELETE FROM old WHERE id = 9")
    caught_up(db, timeout=120)
    assert p.stop() == 0
    ds = f"{PROJECT}.{dataset}"
    got = bq_rows(bigquery_endpoint, f"SELECT * FROM `{ds}.public_old` ORDER BY id")
    assert got == pg_rows(conn, "SELECT * FROM old ORDER BY id")
    count = f"SELECT COUNT(*) FROM `{ds}.public_old_raw` WHERE _pg2sink_operation = 'IMPORT'"
    assert bq_rows(bigquery_endpoint, count) == [(3000,)]
    # the staging tables are gone once a batch named them in its state row
    bq = client(config(bigquery_endpoint, dataset))
    names = [t.table_id for t in bq.list_tables(ds)]
    bq.close()  # type: ignore[no-untyped-call]
    assert not [n for n in names if n.startswith("_pg2sink_import_")], names


# --- delivery -----------------------------------------------------------------------------


def test_a_batch_loaded_again_under_its_job_id_is_loaded_once(
    bigquery_endpoint: str, dataset: str
) -> None:
    warehouse = Warehouse(config(bigquery_endpoint, dataset), "slot_a")
    try:
        warehouse.open()
        job = warehouse.job_id(STATE_TABLE, 0x10, 0x20)
        assert job == warehouse.job_id(STATE_TABLE, 0x10, 0x20)
        assert job != warehouse.job_id(STATE_TABLE, 0x10, 0x21)
        for _ in range(2):  # the retry finds the first job DONE
            warehouse.load(STATE_TABLE, state_rows("slot_a", 0x20, 5), job)
        rows = warehouse.query(
            f"SELECT slot, lsn, position FROM `{warehouse.dataset}.{STATE_TABLE}`"
        )
        assert [tuple(r) for r in rows] == [("slot_a", 0x20, 5)]
        assert warehouse.client.get_job(f"{job}_0").state == "DONE"
        with pytest.raises(Exception, match="Not found"):
            warehouse.client.get_job(f"{job}_1")
    finally:
        warehouse.close()


def test_batches_are_spaced_by_the_load_interval_and_idle_positions_load_nothing(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, bigquery_endpoint: str,
    dataset: str,
) -> None:  # fmt: skip
    """BigQuery counts each load job against a table's daily quota (1,500): with
    --bigquery-load-interval 4s, 16 transactions over 8 s make at most 4 batches (state
    rows; unspaced, each 0.1 s flush made one), and an idle stream's keepalive positions
    are confirmed without loading a state row."""
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    p = start(pg2sink_proc, bigquery_endpoint, dataset, load_interval="4s")
    state = f"SELECT COUNT(*) FROM `{PROJECT}.{dataset}._pg2sink_state`"
    for i in range(16):
        conn.execute("INSERT INTO t VALUES (%s, 'v')", (i,))
        time.sleep(0.5)
    caught_up(db, timeout=60)
    (batches,) = bq_rows(bigquery_endpoint, state)[0]
    assert 1 <= batches <= 4, batches
    # transactions that publish nothing move the slot (keepalive positions) and load nothing
    for _ in range(5):
        conn.execute("SELECT txid_current()")
        time.sleep(0.3)
    caught_up(db, timeout=60)
    assert bq_rows(bigquery_endpoint, state) == [(batches,)]
    assert p.stop() == 0
    got = bq_rows(bigquery_endpoint, f"SELECT * FROM `{PROJECT}.{dataset}.public_t` ORDER BY id")
    assert got == pg_rows(conn, "SELECT * FROM t ORDER BY id")


@pytest.mark.slow
def test_nothing_is_confirmed_before_the_load_job_is_done(
    db: Database, conn: psycopg.Connection[Any], pg2sink_proc: Proc, dataset: str
) -> None:
    # a server of the test's own, stopped (SIGSTOP) while pg2sink streams
    base = Path(tempfile.mkdtemp(prefix="pg2sink-bq-"))
    server = services.LocalBigQuery(base=base / "bigquery", port=services.free_port())
    server.start()
    try:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        p = start(pg2sink_proc, server.url, dataset)
        conn.execute("INSERT INTO t VALUES (1, 'a')")
        caught_up(db, timeout=120)
        pid = server.pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            before = db.slot_confirmed_lsn()
            conn.execute("INSERT INTO t VALUES (2, 'b')")
            target = db.current_lsn()
            time.sleep(4)  # several flush intervals (FAST)
            confirmed = db.slot_confirmed_lsn()
            assert confirmed is not None and confirmed < target and confirmed == before
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: (db.slot_confirmed_lsn() or 0) >= target, 120, "the load after SIGCONT")
        assert p.stop() == 0
        ds = f"{PROJECT}.{dataset}"
        assert bq_rows(server.url, f"SELECT * FROM `{ds}.public_t` ORDER BY id") == [
            (1, "a"),
            (2, "b"),
        ]
    finally:
        server.destroy()
