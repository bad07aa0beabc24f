"""The README's `--decode-only` example, run as written: the Quick start's table, one
INSERT, and pg2sink's lines equal to the README's but for positions, ids and times."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import Database, wait_for
from tests.readme_support import readme_block
from tests.support import Proc

#: what differs from run to run: WAL positions (but 0/0), xids, oids, commit times
_VARYING = [
    (re.compile(r"\b(?!0/0\b)[0-9A-F]+/[0-9A-F]+\b"), "LSN"),
    (re.compile(r"xid=\d+"), "xid=N"),
    (re.compile(r"RELATION \d+"), "RELATION OID"),
    (re.compile(r"commit_time=\S+"), "commit_time=T"),
]


def normal(line: str) -> str:
    for pattern, replacement in _VARYING:
        line = pattern.sub(replacement, line)
    return line


def test_the_decode_only_example_is_what_pg2sink_prints(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    block = readme_block("console", "$ pg2sink --decode-only").splitlines()
    assert block[0].startswith("$ pg2sink --decode-only")
    expected = [normal(line) for line in block[1:]]
    with db.connect() as conn:
        conn.execute("CREATE TABLE public.customers (id serial PRIMARY KEY, name text)")
    out = tmp_path / "decoded.txt"
    p = pg2sink_proc("--decode-only", "--file-path", str(out)).start()
    p.wait_streaming()
    with db.connect() as conn:
        conn.execute("INSERT INTO customers (name) VALUES ('Ada')")
    wait_for(lambda: out.exists() and " COMMIT " in out.read_text(), what="the COMMIT line")
    assert p.stop() == 0
    assert [normal(line) for line in out.read_text().splitlines()] == expected
