"""pg2sink as a managed service's role: REPLICATION, owner of the published tables, not a
superuser (RDS, Cloud SQL, Azure, Supabase). The stream, an import, routing and status
work; each feature that needs a superuser (event triggers) says so once at start and in
`pg2sink status`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from psycopg import sql

from tests.conftest import Database, Pg2Sink, run_cli, wait_for
from tests.imports.support import read_changelog, start_with_imports, wait_imported

Proc = Callable[..., Pg2Sink]


def test_stream_import_routing_and_status_as_a_non_superuser(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    role = f"app_{db.name}"
    admin = db.connect()
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
    try:
        admin.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(db.name), sql.Identifier(role)
            )
        )
        dsn = f"{db.dsn} user={role}"
        admin.execute("CREATE TABLE users (id int PRIMARY KEY, name text, password text)")
        admin.execute(sql.SQL("ALTER TABLE users OWNER TO {}").format(sql.Identifier(role)))
        owner = db.connect(user=role)
        owner.execute(
            "INSERT INTO users SELECT g, 'n' || g, 'secret' || g FROM generate_series(1, 20) g"
        )
        out = tmp_path / "o.jsonl"
        p = start_with_imports(
            pg2sink_proc,
            out,
            "--capture-ddl",
            "--exclude-column",
            "users.password",
            env={"PG2SINK_SOURCE": dsn},
        )
        wait_imported(db, {"public.users"}, p)
        owner.execute("INSERT INTO users VALUES (21, 'new', 'secret21')")
        owner.execute("UPDATE users SET name = 'changed' WHERE id = 1")
        owner.execute("DELETE FROM users WHERE id = 2")

        def streamed() -> bool:
            ops = [r.get("operation") for r in read_changelog(out)]
            return "DELETE" in ops

        wait_for(streamed, 60, "the changes")
        status = json.loads(run_cli("status", "--json", env={**p.env}).stdout)
        assert p.stop() == 0
        records = read_changelog(out)
        assert b"secret" not in out.read_bytes()  # routing: no password reached the file
        imported = [r for r in records if r.get("operation") == "IMPORT"]
        assert sorted(r["after"]["id"] for r in imported) == list(range(1, 21))
        ops = [
            r["operation"] for r in records if r.get("operation") in ("INSERT", "UPDATE", "DELETE")
        ]
        assert ops == ["INSERT", "UPDATE", "DELETE"]
        # one WARNING each for the two features that need a superuser, and nothing fails
        log = p.stderr()
        ddl = [line for line in log.splitlines() if "DDL is not captured" in line]
        assert len(ddl) == 1 and "WARNING" in ddl[0], log
        lists = [line for line in log.splitlines() if "excluded columns still travel" in line]
        why = "needs a superuser" if owner.info.server_version >= 150000 else "before 15"
        assert len(lists) == 1 and why in lists[0], log
        assert " ERROR " not in log, log
        # status as the role: the slot, the publication, the imports, and what it lacks
        assert status["role"]["name"] == role and status["role"]["superuser"] is False
        assert status["slot"]["exists"] and status["tables"] == ["public.users"]
        assert status["publication_managed"] is True
        assert [j["state"] for j in status["imports"]] == ["done"]
        needs = status["role"]["needs_more"]
        assert len(needs) == 2 and any("--capture-ddl" in n for n in needs), needs
        assert set(needs) <= set(status["warnings"])
        text = run_cli("status", env=p.env).stdout
        assert f"role {role}: not superuser, replication" in text
    finally:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s AND NOT active",
            (db.slot,),
        )
        admin.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
