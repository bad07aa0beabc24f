"""Decoding on a hot standby (PostgreSQL 16+): --source is the standby, --primary the
primary, on a real pair of servers (tests/ha/pair.py).

The slot, the stream and the imports' reads are on the standby; the publication,
pg2sink's schema and the import jobs on the primary. A standby without --primary is one
line; a slot the standby invalidated (a conflict with recovery) stops pg2sink with the
way back, never a retry loop.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import TupleRow

from tests.conftest import Pg2Sink, clean_env, read_jsonl, run_cli, wait_for
from tests.ha.pair import PHYSICAL_SLOT, Pair, standby_pair
from tests.imports.support import IMPORTS_ON
from tests.support import FAST, modifications, scalar

#: The oldest major that decodes on a standby.
VERSION = 16


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with standby_pair(VERSION) as p:
        yield p


@dataclass
class Names:
    """A database of the pair's, and the names of one test's pg2sink in it."""

    pair: Pair
    dbname: str
    slot: str
    publication: str

    @property
    def primary_dsn(self) -> str:
        return self.pair.primary.dsn(self.dbname)

    @property
    def standby_dsn(self) -> str:
        return self.pair.standby.dsn(self.dbname)

    def primary(self) -> psycopg.Connection[TupleRow]:
        return psycopg.connect(self.primary_dsn, autocommit=True)

    def standby(self) -> psycopg.Connection[TupleRow]:
        return psycopg.connect(self.standby_dsn, autocommit=True)

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(
            PG2SINK_SOURCE=self.standby_dsn,
            PG2SINK_SLOT=self.slot,
            PG2SINK_PUBLICATION=self.publication,
            **extra,
        )


@pytest.fixture
def names(pair: Pair) -> Names:
    tag = uuid.uuid4().hex[:10]
    found = Names(pair, f"t_{tag}", f"slot_{tag}", f"pub_{tag}")
    pair.create_database(found.dbname)
    return found


def _proc(names: Names, tmp_path: Path, out: Path, **env: str) -> Pg2Sink:
    return Pg2Sink(
        args=["--file-path", str(out), *FAST],
        env=names.env(PG2SINK_PRIMARY=names.primary_dsn, **env),
        workdir=tmp_path,
    )


def test_streams_and_imports_from_the_standby_writing_only_on_the_primary(
    names: Names, tmp_path: Path
) -> None:
    with names.primary() as c:
        c.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
        c.execute("INSERT INTO orders SELECT i, 'row ' || i FROM generate_series(1, 300) i")
    names.pair.wait_replayed()
    out = tmp_path / "out.jsonl"
    p = _proc(names, tmp_path, out, **IMPORTS_ON).start()
    try:
        p.wait_streaming(90)

        def imported() -> bool:
            assert p.proc is not None and p.proc.poll() is None, p.stderr()
            rows = [r for r in read_jsonl(out) if r.get("operation") == "IMPORT"]
            return len(rows) >= 300

        wait_for(imported, 240, "the import of orders read from the standby")
        with names.primary() as c:
            c.execute("INSERT INTO orders VALUES (301, 'after the import')")
            c.execute("UPDATE orders SET note = 'changed' WHERE id = 1")

        def streamed() -> list[str]:
            return [m["operation"] for m in modifications(out) if m["operation"] != "IMPORT"]

        wait_for(lambda: streamed() == ["INSERT", "UPDATE"], 60, "the changes after the import")
        imports = {r["after"]["id"] for r in modifications(out) if r["operation"] == "IMPORT"}
        assert imports == set(range(1, 301))
        with names.primary() as c:
            # written on the primary: the publication, the schema and the finished job
            assert (
                scalar(
                    c,
                    "SELECT count(*) FROM pg_publication WHERE pubname = %s",
                    (names.publication,),
                )
                == 1
            )
            assert scalar(c, "SELECT state FROM pg2sink.import_jobs") == "done"
            assert (
                scalar(
                    c,
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                    (names.slot,),
                )
                == 0
            )
        with names.standby() as s:
            assert (
                scalar(
                    s,
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                    (names.slot,),
                )
                == 1
            )
    finally:
        code = p.stop()
    assert code == 0, p.stderr()
    assert " ERROR " not in p.stderr()


def test_a_standby_without_primary_is_one_line_naming_what_to_pass(names: Names) -> None:
    res = run_cli("stream", "--file-path", "-", env=names.env())
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "hot standby" in lines[0] and "--primary" in lines[0]
    assert names.publication in lines[0]
    with names.primary() as c:
        assert scalar(c, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pg2sink'") == 0
    with names.standby() as s:
        assert (
            scalar(
                s, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (names.slot,)
            )
            == 0
        )


def test_a_slot_invalidated_by_a_conflict_stops_with_the_way_back(
    names: Names, tmp_path: Path
) -> None:
    with names.primary() as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY)")
    out = tmp_path / "out.jsonl"
    p = _proc(names, tmp_path, out).start()
    standby = psycopg.connect(names.pair.standby.dsn("postgres"), autocommit=True)
    try:
        p.wait_streaming(90)
        # without feedback the primary no longer keeps the catalog rows the slot needs
        standby.execute("ALTER SYSTEM SET hot_standby_feedback = off")
        standby.execute("SELECT pg_reload_conf()")
        with names.primary() as c:
            wait_for(
                lambda: scalar(
                    c,
                    "SELECT xmin IS NULL AND catalog_xmin IS NULL FROM pg_replication_slots"
                    " WHERE slot_name = %s",
                    (PHYSICAL_SLOT,),
                ),
                30,
                "the standby's feedback to stop",
            )
            # catalog rows removed by VACUUM: a conflict with the slot's catalog_xmin
            c.execute("CREATE TABLE conflict (x int)")
            c.execute("DROP TABLE conflict")
            c.execute("VACUUM pg_class")
            c.execute("INSERT INTO t VALUES (1)")
        assert p.proc is not None
        code = p.proc.wait(60)
    finally:
        standby.execute("ALTER SYSTEM RESET hot_standby_feedback")
        standby.execute("SELECT pg_reload_conf()")
        standby.close()
        p.stop()
    assert code == 2, p.stderr()
    last = p.stderr().strip().splitlines()[-1]
    assert "invalidated by a conflict with recovery" in last, p.stderr()
    assert "hot_standby_feedback" in last and f"pg2sink drop --slot {names.slot}" in last
    # the way back: drop drops the standby's slot and the primary's publication
    res = run_cli("drop", env=names.env(PG2SINK_PRIMARY=names.primary_dsn))
    assert res.returncode == 0, res.stderr
    assert f"dropped replication slot {names.slot}" in res.stdout
    assert f"dropped publication {names.publication}" in res.stdout


def test_after_the_standby_is_promoted_everything_goes_to_it(tmp_path: Path) -> None:
    """--primary is used only while --source is in recovery: once promoted, the standby
    takes the publication's changes and the import jobs itself."""
    with standby_pair(VERSION) as own:
        names = Names(own, "app", "slot_promoted", "pub_promoted")
        own.create_database(names.dbname)
        with names.primary() as c:
            c.execute("CREATE TABLE before (id int PRIMARY KEY)")
        out = tmp_path / "out.jsonl"
        p = _proc(names, tmp_path, out, **IMPORTS_ON).start()
        try:
            p.wait_streaming(90)
            with names.primary() as c:
                c.execute("INSERT INTO before VALUES (1)")
            wait_for(lambda: len(modifications(out)) == 1, 60, "the change on the primary")
            own.primary.stop()
            res = own.standby._pg_ctl("promote", "-w")
            assert res.returncode == 0, res.stderr
            with names.standby() as promoted:
                promoted.execute("INSERT INTO before VALUES (2)")
                # a table that joins now is imported through the promoted server's jobs
                promoted.execute("CREATE TABLE later (id int PRIMARY KEY)")
                promoted.execute("INSERT INTO later SELECT generate_series(1, 5)")

                def imported() -> bool:
                    assert p.proc is not None and p.proc.poll() is None, p.stderr()
                    rows = [m for m in modifications(out) if m["name"] == "later"]
                    return len(rows) == 5

                wait_for(imported, 240, "the import of a table created after the promotion")
                assert [m["after"]["id"] for m in modifications(out) if m["name"] == "before"] == [
                    1,
                    2,
                ]
                wait_for(
                    lambda: (
                        scalar(
                            promoted,
                            "SELECT count(*) FROM pg2sink.import_jobs WHERE state = 'done'",
                        )
                        == 2
                    ),
                    60,
                    "both import jobs done on the promoted server",
                )
        finally:
            code = p.stop()
        assert code == 0, p.stderr()
