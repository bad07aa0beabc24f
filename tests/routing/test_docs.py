"""docs/routing.md's worked example, run: its SQL, its pg2sink command line and the records
it shows are what a real PostgreSQL and pg2sink give.

The example's fenced blocks carry a second word in their info string: `sql
example-setup` (run before pg2sink starts), `sh example-run` (the command line: `pg2sink`
then its options), `sql example-workload` (run while it streams) and `json
example-output` (one record per line, showing only some of its members: those are
compared), `json example-schema-field` (the email field of the users Schema record).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from tests.conftest import REPO, Database, read_jsonl, wait_for
from tests.support import Proc, modifications, start

DOC = REPO / "docs" / "routing.md"
_BLOCK = re.compile(r"^```(\w+) (example-[\w-]+)\n(.*?)^```$", re.M | re.S)


def example_blocks() -> dict[str, str]:
    """The example's blocks by their second word."""
    return {m.group(2): m.group(3) for m in _BLOCK.finditer(DOC.read_text())}


def test_the_worked_example_gives_what_the_doc_shows(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    blocks = example_blocks()
    assert set(blocks) == {
        "example-setup",
        "example-run",
        "example-workload",
        "example-output",
        "example-schema-field",
    }
    conn = db.connect()
    conn.execute(blocks["example-setup"])
    words = shlex.split(blocks["example-run"].replace("\\\n", " "))
    assert words[0] == "pg2sink"
    out = tmp_path / "out.jsonl"
    expected = [json.loads(line) for line in blocks["example-output"].splitlines() if line]
    p = start(pg2sink_proc, out, *words[1:])
    conn.execute(blocks["example-workload"])
    wait_for(lambda: len(modifications(out)) >= len(expected), what="the example's records")
    assert p.stop() == 0
    got = [{k: m[k] for k in shown} for m, shown in zip(modifications(out), expected, strict=True)]
    assert got == expected
    [users] = [r for r in read_jsonl(out) if r["kind"] == "schema" and r["name"] == "users"]
    fields = {f["name"]: f for f in users["schema"]["fields"]}
    assert fields["email"] == json.loads(blocks["example-schema-field"])
    assert "password" not in fields
