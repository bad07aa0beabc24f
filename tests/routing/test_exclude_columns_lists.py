"""--exclude-column end to end with publication column lists: pg2sink run as users run
it (file sink, imports on), a slot of the test's own on the same publication read raw.

The excluded values of a table with a list are in neither the raw pgoutput stream nor
the output, for an import, INSERT, UPDATE, and an INSERT in the transaction of an ADD
COLUMN (the new column present, a new excluded one absent). A REPLICA IDENTITY FULL
table cannot have such a list: its values still travel, one log line says so, and no
record holds them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import Database, read_jsonl
from tests.imports.support import start_with_imports, wait_confirmed, wait_imported
from tests.support import Proc

# an import; publication column lists are PostgreSQL 15+
pytestmark = [pytest.mark.slow, pytest.mark.pg_since(15)]

EXCLUDE = ("--exclude-column", "*.password", "--exclude-column", "users.secret*")
HIDDEN = (b"pw-imp-1", b"pw-ins-2", b"pw-upd-2", b"pw-ins-3", b"sec-3")


def _raw(db: Database, slot: str) -> bytes:
    conn = db.connect()
    time.sleep(1)  # synchronous_commit=off: decoding reads flushed WAL only
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
        " 'proto_version', '1', 'publication_names', %s)",
        (slot, db.publication),
    ).fetchall()
    return b"".join(bytes(r[0]) for r in rows)


def test_excluded_values_stay_on_the_server(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text, password text)")
    conn.execute("CREATE TABLE audit (id int PRIMARY KEY, password text, note text)")
    conn.execute("ALTER TABLE audit REPLICA IDENTITY FULL")
    conn.execute("INSERT INTO users VALUES (1, 'ann', 'pw-imp-1')")
    conn.execute("INSERT INTO audit VALUES (1, 'pw-aud-1', 'n1')")
    out = tmp_path / "out.jsonl"
    p = start_with_imports(pg2sink_proc, out, "--flush-interval", "0.1s", *EXCLUDE)
    wait_imported(db, {"public.users", "public.audit"}, p)
    raw_slot = f"{db.slot}_raw"
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (raw_slot,))
    conn.execute("INSERT INTO users VALUES (2, 'bob', 'pw-ins-2')")
    conn.execute("UPDATE users SET name = 'bobby', password = 'pw-upd-2' WHERE id = 2")
    with conn.transaction():
        conn.execute("ALTER TABLE users ADD COLUMN extra text, ADD COLUMN secret_2 text")
        conn.execute("INSERT INTO users VALUES (3, 'cat', 'pw-ins-3', 'xtra-3', 'sec-3')")
    conn.execute("INSERT INTO audit VALUES (2, 'pw-aud-2', 'n2')")
    wait_confirmed(db, p)
    assert p.stop() == 0

    raw = _raw(db, raw_slot)
    assert all(v in raw for v in (b"bobby", b"xtra-3", b"extra", b"n2")), raw
    assert not [v for v in HIDDEN if v in raw]
    assert b"pw-aud-2" in raw  # REPLICA IDENTITY FULL: published whole
    output, log = out.read_bytes(), p.stderr().encode()
    assert not [v for v in (*HIDDEN, b"pw-aud-1", b"pw-aud-2") if v in output + log]
    records = read_jsonl(out)
    after = {
        (r["name"], r["after"]["id"], r["operation"]): r["after"]
        for r in records
        if r["kind"] == "modification"
    }
    assert after[("users", 1, "IMPORT")] == {"id": 1, "name": "ann"}
    assert after[("users", 3, "INSERT")] == {"id": 3, "name": "cat", "extra": "xtra-3"}
    assert after[("audit", 2, "INSERT")] == {"id": 2, "note": "n2"}
    [line] = [x for x in p.stderr().splitlines() if "still travel" in x]
    assert "public.audit: REPLICA IDENTITY FULL" in line and "public.users" not in line
