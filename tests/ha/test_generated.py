"""Generated columns on PostgreSQL 18: --publish-generated-columns.

With it, the publication's publish_generated_columns is `stored`, and the stored
generated column is in the Schema records, the Modifications and the import; without
it, in none of them. A virtual generated column (18's default kind) is never published.
Either way the import's rows have the stream's shape.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import services

from tests.conftest import Pg2Sink, clean_env, read_jsonl, wait_for
from tests.imports.support import IMPORTS_ON
from tests.support import FAST, modifications, own_server, scalar

VERSION = 18
TABLE = """
CREATE TABLE items (
    id int PRIMARY KEY,
    price int,
    doubled int GENERATED ALWAYS AS (price * 2) STORED,
    tripled int GENERATED ALWAYS AS (price * 3) VIRTUAL
)
"""


@pytest.fixture(scope="module")
def server() -> Iterator[services.Postgres]:
    with own_server(functools.partial(services.Postgres, version=VERSION), "pg18") as pg:
        yield pg


def _stream(server: services.Postgres, tmp_path: Path, *flags: str) -> tuple[Path, str]:
    """pg2sink with imports on a new database holding `items` (3 rows before the start,
    one inserted after the import); its output file and the publication's pubgencols."""
    tag = uuid.uuid4().hex[:10]
    dbname = f"t_{tag}"
    with psycopg.connect(server.dsn("postgres"), autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(dbname)))
    out = tmp_path / f"{tag}.jsonl"
    with psycopg.connect(server.dsn(dbname), autocommit=True) as c:
        c.execute(TABLE)
        c.execute("INSERT INTO items (id, price) VALUES (1, 10), (2, 20), (3, 30)")
        p = Pg2Sink(
            args=["--file-path", str(out), *FAST, *flags],
            env=clean_env(
                PG2SINK_SOURCE=server.dsn(dbname),
                PG2SINK_SLOT=f"slot_{tag}",
                PG2SINK_PUBLICATION=f"pub_{tag}",
                **IMPORTS_ON,
            ),
            workdir=tmp_path,
        ).start()
        try:
            p.wait_streaming(60)

            def imported() -> bool:
                assert p.proc is not None and p.proc.poll() is None, p.stderr()
                rows: int = sum(r.get("operation") == "IMPORT" for r in read_jsonl(out))
                return rows >= 3

            wait_for(imported, 240, "the import of items")
            c.execute("INSERT INTO items (id, price) VALUES (4, 40)")
            wait_for(lambda: len(modifications(out)) == 4, 60, "the INSERT after the import")
            gencols = scalar(
                c, "SELECT pubgencols::text FROM pg_publication WHERE pubname = %s", (f"pub_{tag}",)
            )
        finally:
            code = p.stop()
    assert code == 0, p.stderr()
    return out, gencols


def _shapes(out: Path) -> tuple[list[list[str]], dict[str, list[str]]]:
    """The Schema records' field names, and each operation's row keys."""
    records = read_jsonl(out)
    schemas = [[f["name"] for f in r["schema"]["fields"]] for r in records if r["kind"] == "schema"]
    rows = {m["operation"]: list(m["after"]) for m in modifications(out)}
    return schemas, rows


def test_publish_generated_columns_puts_stored_ones_in_schema_changes_and_import(
    server: services.Postgres, tmp_path: Path
) -> None:
    out, gencols = _stream(server, tmp_path, "--publish-generated-columns")
    assert gencols == "s"
    schemas, rows = _shapes(out)
    assert schemas and all(s == ["id", "price", "doubled"] for s in schemas)
    assert rows == {"IMPORT": ["id", "price", "doubled"], "INSERT": ["id", "price", "doubled"]}
    doubled = {m["after"]["id"]: m["after"]["doubled"] for m in modifications(out)}
    assert doubled == {1: 20, 2: 40, 3: 60, 4: 80}


def test_without_the_flag_no_generated_column_anywhere(
    server: services.Postgres, tmp_path: Path
) -> None:
    out, gencols = _stream(server, tmp_path)
    assert gencols == "n"
    schemas, rows = _shapes(out)
    assert schemas and all(s == ["id", "price"] for s in schemas)
    assert rows == {"IMPORT": ["id", "price"], "INSERT": ["id", "price"]}


def test_the_flag_alters_an_existing_publication(server: services.Postgres, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:10]
    dbname = f"t_{tag}"
    with psycopg.connect(server.dsn("postgres"), autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(dbname)))
    out = tmp_path / "out.jsonl"
    env = clean_env(
        PG2SINK_SOURCE=server.dsn(dbname), PG2SINK_SLOT=f"slot_{tag}", PG2SINK_PUBLICATION="pub"
    )
    with psycopg.connect(server.dsn(dbname), autocommit=True) as c:
        c.execute(TABLE)
        p = Pg2Sink(args=["--file-path", str(out), *FAST], env=env, workdir=tmp_path).start()
        p.wait_streaming(60)
        assert p.stop() == 0, p.stderr()
        assert scalar(c, "SELECT pubgencols::text FROM pg_publication") == "n"
        p.args.append("--publish-generated-columns")
        p.start()
        try:
            p.wait_streaming(60)
            assert "publication pub: publish_generated_columns set to stored" in p.stderr()
            assert scalar(c, "SELECT pubgencols::text FROM pg_publication") == "s"
            c.execute("INSERT INTO items (id, price) VALUES (1, 5)")
            wait_for(lambda: modifications(out), 60, "the INSERT")
        finally:
            assert p.stop() == 0, p.stderr()
    assert modifications(out)[0]["after"] == {"id": 1, "price": 5, "doubled": 10}
