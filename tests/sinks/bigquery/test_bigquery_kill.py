"""kill -9 of `pg2sink --sink bigquery` (docs/sinks/bigquery.md "Delivery"): killed while
load jobs are in flight, and while a table is imported, then restarted, the stream
converges (the view equals the table) and no change is in the raw table twice, counted by
(lsn, sequence): a restart removes the rows of a batch whose state row was never loaded
before loading it again, and a batch retried within a process takes the same job ids.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from google.api_core.exceptions import NotFound

from tests.conftest import Database, Pg2Sink, wait_for
from tests.imports.support import IMPORTS_ON, wait_imported
from tests.sinks.bigquery.test_bigquery import pg_rows
from tests.sinks.duckdb.test_duckdb import Writer, caught_up
from tests.sinks.warehouse_support import PROJECT, UNSPACED, bq_rows
from tests.support import FAST, Proc

#: the seed of the writer and of the kill times (printed)
SEED = 1399
#: a restart finds a batch loaded in part within this many kills (each 0.3-1.2 s in)
MOST_KILLS = 6
#: tables the writer's trigger writes into
AUDITS = ("audit_1", "audit_2", "audit_3", "audit_4")


@pytest.fixture
def dataset(topic_prefix: str) -> str:
    return f"d_{topic_prefix}"


def start(proc: Proc, endpoint: str, dataset: str, imports: bool = False) -> Pg2Sink:
    # --retry-initial: the killed process's walsender may hold the slot for a moment
    p = proc(
        "--sink", "bigquery", "--bigquery-project", PROJECT, "--bigquery-dataset", dataset,
        "--bigquery-endpoint", endpoint, "--retry-initial", *FAST, *UNSPACED,
        env=IMPORTS_ON if imports else None,
    ).start()  # fmt: skip
    p.wait_streaming(60)
    return p


def converged(
    db: Database,
    conn: psycopg.Connection[Any],
    p: Pg2Sink,
    endpoint: str,
    dataset: str,
    audits: tuple[str, ...] = AUDITS,
    timeout: float = 120,
) -> None:
    """Once pg2sink caught up and stopped: table w's view equals the table, and no
    streamed change is in its raw table (nor in the `audits` tables') twice."""
    caught_up(db, timeout=timeout)
    assert p.stop() == 0
    ds = f"{PROJECT}.{dataset}"
    got = bq_rows(endpoint, f"SELECT * FROM `{ds}.public_w` ORDER BY id")
    assert got == pg_rows(conn, "SELECT * FROM w ORDER BY id")
    for table in ("w", *audits):
        twice = bq_rows(
            endpoint,
            f"SELECT _pg2sink_lsn, _pg2sink_sequence, COUNT(*) FROM `{ds}.public_{table}_raw` "
            "WHERE _pg2sink_operation <> 'IMPORT' GROUP BY 1, 2 HAVING COUNT(*) > 1",
        )
        assert twice == [], table


def loaded_in_part(endpoint: str, query: str) -> bool:
    try:
        return bq_rows(endpoint, query) == [(True,)]
    except NotFound:  # no raw table yet
        return False


@pytest.mark.slow
def test_kill_9_while_loading_loads_no_row_twice(
    db: Database,
    pg2sink_proc: Proc,
    bigquery_endpoint: str,
    dataset: str,
    tmp_path: Path,
) -> None:
    print(f"seed {SEED}")
    conn = db.connect()
    conn.execute("CREATE TABLE w (id int PRIMARY KEY, n int, s text)")
    # four more tables in every transaction (a trigger's rows are logged as the
    # writer's): a batch loads five tables, then its state row
    for table in AUDITS:
        conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, wid int, op text)")
    inserts = "".join(f"INSERT INTO {t} (wid, op) VALUES (w.id, TG_OP);" for t in AUDITS)
    conn.execute(
        "CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$ DECLARE w record; "
        f"BEGIN w := coalesce(NEW, OLD); {inserts} RETURN NULL; END $$"
    )
    conn.execute(
        "CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON w FOR EACH ROW "
        "EXECUTE FUNCTION audit()"
    )
    writer = Writer(db, seed=SEED)
    writer.pause = 0.05  # small batches
    p = start(pg2sink_proc, bigquery_endpoint, dataset)
    writer.start()
    kills = 0
    ds = f"{PROJECT}.{dataset}"
    # w's rows of a batch are loaded, the last table's not yet (nor the state row)
    in_part = (
        f"SELECT (SELECT MAX(_pg2sink_position) FROM `{ds}.public_w_raw`) > "
        f"(SELECT MAX(_pg2sink_position) FROM `{ds}.public_{AUDITS[-1]}_raw`)"
    )
    try:
        while kills < MOST_KILLS and "loaded in part" not in p.stderr():
            # killed while a batch's load jobs are in flight (or done meanwhile: then
            # this restart finds nothing to remove, and the loop kills again)
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline and not loaded_in_part(bigquery_endpoint, in_part):
                pass  # each poll is a query job: no pause needed (not seen: killed anyway)
            p.stop(signal.SIGKILL)
            kills += 1
            p.start().wait_streaming(60)
        time.sleep(1)
    finally:
        writer.stopped.set()
        writer.join(30)
    assert writer.error is None and writer.transactions > 20
    print(f"{kills} kills, {writer.transactions} transactions")
    converged(db, conn, p, bigquery_endpoint, dataset)
    # a restart found rows of a batch whose state row was not loaded, and removed them
    logs = [f.read_text() for f in tmp_path.glob("stderr.*.log")]
    assert any("loaded in part" in log for log in logs), "no kill hit a batch being loaded"


@pytest.mark.slow
def test_kill_9_during_an_import_converges(
    db: Database, pg2sink_proc: Proc, bigquery_endpoint: str, dataset: str
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE w (id int PRIMARY KEY, n int, s text)")
    # two partitions (10,000 rows at least each: pg2sink/imports/plan.py)
    conn.execute("INSERT INTO w SELECT g, g, 'x' || g FROM generate_series(1, 20500) g")
    writer = Writer(db, seed=SEED, keys=20_500, truncate=False)
    writer.pause = 0.1  # the changes held while the import runs are loaded after it
    writer.start()  # transactions are in flight when the table joins
    try:
        p = start(pg2sink_proc, bigquery_endpoint, dataset, imports=True)

        def some_done() -> bool:
            assert p.proc is not None and p.proc.poll() is None, p.stderr()
            try:
                done = conn.execute(
                    "SELECT count(*) FILTER (WHERE done) FROM pg2sink.import_partitions"
                ).fetchone()
            except psycopg.errors.UndefinedTable:
                return False
            return done is not None and done[0] >= 1

        wait_for(some_done, 240, "a partition of public.w to be staged")
        p.stop(signal.SIGKILL)
        p.start().wait_streaming(60)
        wait_imported(db, {"public.w"}, p)
        time.sleep(1.0)
    finally:
        writer.stopped.set()
        writer.join(30)
    assert writer.error is None and writer.transactions > 20
    # the changes held while the import ran, loaded after it
    converged(db, conn, p, bigquery_endpoint, dataset, (), timeout=300)
    # a key is imported once per snapshot: a partition staged twice is not moved twice
    ds = f"{PROJECT}.{dataset}"
    repeated = bq_rows(
        bigquery_endpoint,
        f"SELECT id, _pg2sink_lsn FROM `{ds}.public_w_raw` WHERE _pg2sink_operation = 'IMPORT' "
        "GROUP BY 1, 2 HAVING COUNT(*) > 1",
    )
    assert repeated == []
