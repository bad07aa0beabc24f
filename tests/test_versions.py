"""What differs by PostgreSQL major is asked of the server: these run on the session's
major (PG2SINK_TEST_PG_VERSION, 14 to 18) and hold on each.

On 14, pg_publication_tables has no attnames or rowfilter (15+): an import that asked
for them failed at every attempt, and a keyless table's changes, held by the import
gate until its import, never reached the sink."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from psycopg import sql

from pg2sink.imports.plan import plan_import
from pg2sink.publication.manager import PublicationManager
from pg2sink.publication.patterns import TableFilter
from tests.conftest import Database, Pg2Sink, wait_for
from tests.imports.support import read_changelog, start_with_imports, wait_imported

Proc = Callable[..., Pg2Sink]


def test_an_import_plan_reads_the_published_columns(db: Database) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric, note text)")
    PublicationManager(conn, db.publication, ("public",), TableFilter()).reconcile()
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        plan = plan_import(
            conn, "public", "orders", target_partitions=1, publication=db.publication
        )
    assert [c.name for c in plan.columns] == ["id", "total", "note"]
    assert plan.row_filter is None


def test_a_replica_identity_full_table_is_imported_then_streamed(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE events (at int, what text)")
    conn.execute("ALTER TABLE events REPLICA IDENTITY FULL")
    conn.execute("INSERT INTO events VALUES (1, 'before')")
    out = tmp_path / "o.jsonl"
    p = start_with_imports(pg2sink_proc, out)
    wait_imported(db, {"public.events"}, p)
    conn.execute("UPDATE events SET what = 'after' WHERE at = 1")
    conn.execute(sql.SQL("TRUNCATE events"))

    def arrived() -> list[dict[str, object]]:
        return [r for r in read_changelog(out) if r.get("operation") in ("UPDATE", "TRUNCATE")]

    changes = wait_for(lambda: len(arrived()) == 2 and arrived(), 60, "the UPDATE and TRUNCATE")
    assert p.stop() == 0
    assert [r["operation"] for r in changes] == ["UPDATE", "TRUNCATE"]
    assert changes[0]["before"] == {"at": 1, "what": "before"}
    imported = [r for r in read_changelog(out) if r.get("operation") == "IMPORT"]
    assert [r["after"] for r in imported] == [{"at": 1, "what": "before"}]
