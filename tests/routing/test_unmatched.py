"""Routing rules that match nothing (a misspelt --mask-column would send the real column in
clear): a WARNING at start and at each reconcile, a warning in `pg2sink status`, and with
--strict-routing a refusal; pg2sink run as a process on a real PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Database, run_cli, wait_for
from tests.support import Proc, start

RULES = (
    "--mask-column",
    "public.users.emial=redact",  # the typo: users has `email`
    "--exclude-column",
    "public.users.password",  # matches
    "--only",
    "public.user=insert",  # the typo: the table is users
)
MASK_LINE = "--mask-column public.users.emial matches no column of a published table"
ONLY_LINE = "--only public.user=insert matches no published table"


def test_a_rule_matching_nothing_is_a_warning_at_start_at_reconciles_and_in_status(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE users (id int PRIMARY KEY, email text, password text)")
    p = start(pg2sink_proc, tmp_path / "out.jsonl", *RULES)
    # FAST polls every 0.3 s: the warnings come back at each reconcile, not once
    wait_for(lambda: p.stderr().count(MASK_LINE) >= 3, what="the mask rule's warnings")
    assert p.stop() == 0
    warned = {line.split(": ", 1)[1] for line in p.stderr().splitlines() if "WARNING" in line}
    assert warned == {MASK_LINE, ONLY_LINE}

    status = run_cli(
        "status", "--source", db.dsn, "--slot", db.slot, "--publication", db.publication,
        "--json", *RULES,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    warnings = json.loads(status.stdout)["warnings"]
    assert MASK_LINE in warnings and ONLY_LINE in warnings
    assert not any("password" in w for w in warnings)


def test_strict_routing_refuses_a_rule_matching_nothing(db: Database, tmp_path: Path) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE users (id int PRIMARY KEY, email text, password text)")
    done = run_cli(
        "stream", "--source", db.dsn, "--slot", db.slot, "--publication", db.publication,
        "--file-path", str(tmp_path / "out.jsonl"), "--strict-routing", *RULES,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "--strict-routing" in errors[0], done.stderr
    assert "matches no" in errors[0]
    # nothing streamed: the refusal comes before the slot is read
    assert (
        not (tmp_path / "out.jsonl").exists()
        or "modification" not in (tmp_path / "out.jsonl").read_text()
    )
