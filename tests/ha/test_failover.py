"""Failover slots (PostgreSQL 17+): --slot-failover on a real primary and physical
standby (tests/ha/pair.py), the primary stopped and the standby promoted.

The standby keeps a synchronized copy of the slot (sync_replication_slots = on); the
primary's synchronized_standby_slots holds pg2sink back until the standby has the WAL
it was sent. pg2sink, given both hosts with target_session_attrs=read-write, reconnects
to the promoted standby and goes on from the synced slot: every row reaches the file
(at least once), and no import starts again.
"""

from __future__ import annotations

import functools
from pathlib import Path

import psycopg
import services

from tests.conftest import Pg2Sink, clean_env, read_jsonl, run_cli, wait_for
from tests.ha.pair import PHYSICAL_SLOT, standby_pair
from tests.imports.support import IMPORTS_ON
from tests.support import FAST, modifications, own_server, scalar

VERSION = 17
DB = "app"
SLOT = "pg2sink_failover"


def _ids(out: Path) -> set[int]:
    return {m["after"]["id"] for m in modifications(out) if m["after"] is not None}


def test_after_a_promotion_pg2sink_goes_on_from_the_synced_slot(tmp_path: Path) -> None:
    with standby_pair(
        VERSION,
        primary_settings={"synchronized_standby_slots": PHYSICAL_SLOT},
        standby_settings={"sync_replication_slots": "on"},
    ) as pair:
        pair.create_database(DB)
        primary = psycopg.connect(pair.primary.dsn(DB), autocommit=True)
        primary.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
        out = tmp_path / "out.jsonl"
        env = clean_env(PG2SINK_SOURCE=pair.both(DB), PG2SINK_SLOT=SLOT, **IMPORTS_ON)
        # an earlier run made the slot without failover: --slot-failover alters it
        p = Pg2Sink(args=["--file-path", str(out), *FAST], env=env, workdir=tmp_path).start()
        p.wait_streaming(60)
        assert p.stop() == 0, p.stderr()
        assert not scalar(
            primary, "SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
        )
        p.args.append("--slot-failover")
        p.start()
        try:
            p.wait_streaming(60)
            # the empty table's import is done at once (no rows, no Spark)
            wait_for(
                lambda: scalar(primary, "SELECT state FROM pg2sink.import_jobs") == "done",
                60,
                "the import job of orders",
            )
            assert scalar(
                primary, "SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
            )
            primary.execute("INSERT INTO orders SELECT i, 'before' FROM generate_series(1, 50) i")
            wait_for(lambda: _ids(out) >= set(range(1, 51)), 60, "rows 1-50 in the file")
            # the standby's copy has caught up with what pg2sink confirmed (the sync
            # worker naps up to 30 s between rounds when nothing changes)
            confirmed = scalar(
                primary,
                "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
                (SLOT,),
            )
            with psycopg.connect(pair.standby.dsn(DB), autocommit=True) as s:
                wait_for(
                    lambda: s.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND synced"
                        " AND confirmed_flush_lsn - '0/0' >= %s",
                        (SLOT, confirmed),
                    ).fetchone(),
                    90,
                    "the standby's synced copy of the slot",
                )
            # rows the stream may not have confirmed when the primary goes: at least once
            primary.execute("INSERT INTO orders SELECT i, 'late' FROM generate_series(51, 60) i")
            primary.close()
            pair.primary.stop()
            res = pair.standby._pg_ctl("promote", "-w")
            assert res.returncode == 0, res.stderr
            with psycopg.connect(pair.standby.dsn(DB), autocommit=True) as promoted:
                promoted.execute(
                    "INSERT INTO orders SELECT i, 'after' FROM generate_series(61, 100) i"
                )
                wait_for(lambda: _ids(out) >= set(range(1, 101)), 120, "rows 1-100 in the file")
                # the import was not started again: one job, done, and no IMPORT record
                assert scalar(promoted, "SELECT count(*) FROM pg2sink.import_jobs") == 1
                assert scalar(promoted, "SELECT state FROM pg2sink.import_jobs") == "done"
            assert not [r for r in read_jsonl(out) if r.get("operation") == "IMPORT"]
            assert p.proc is not None and p.proc.poll() is None, p.stderr()
        finally:
            code = p.stop()
        assert code == 0, p.stderr()
        assert f"replication slot {SLOT} is now a failover slot" in p.stderr()
        assert "streaming again" in p.stderr()
        assert "created replication slot" not in p.stderr()  # the second run's log


def test_flags_of_newer_majors_are_one_line_on_16() -> None:
    """--slot-failover (17+) and --publish-generated-columns (18+) on a 16: one line,
    exit 2, no slot."""
    with own_server(functools.partial(services.Postgres, version=16), "pg16") as server:
        for flag, says in [
            ("--slot-failover", "--slot-failover needs PostgreSQL 17"),
            ("--publish-generated-columns", "--publish-generated-columns needs PostgreSQL 18"),
        ]:
            res = run_cli(
                "stream", "--file-path", "-", flag, env={"PG2SINK_SOURCE": server.dsn("postgres")}
            )
            assert res.returncode == 2, res.stderr
            lines = res.stderr.strip().splitlines()
            assert len(lines) == 1, res.stderr
            assert says in lines[0]
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as c:
            assert scalar(c, "SELECT count(*) FROM pg_replication_slots") == 0
