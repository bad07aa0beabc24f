"""--exclude-column and --mask-column end to end: pg2sink run as a process on a real
PostgreSQL, the file sink's lines, the stream and an import (Spark) of the same table.

The excluded column and the clear values of masked ones appear in no record, no log line
(at debug level) and no error; the mask key neither, nor in `--help`. Through Kafka too,
whose sink encodes new rows straight from pgoutput's (rewritten) bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pg2sink.routing.masking import Mask
from tests.conftest import Database, KafkaStack, Pg2Sink, read_jsonl, run_cli, wait_for
from tests.imports.support import start_with_imports, wait_confirmed, wait_imported
from tests.sinks.kafka.test_kafka import Reader, reader, registry_get
from tests.sinks.kafka.test_kafka import start as kafka_start
from tests.support import Proc, modifications, start

__all__ = ["reader"]  # the fixture, imported for these tests

KEY = "k3y-s3cret-for-masks"
MASKS = (
    "--exclude-column",
    "public.users.password",
    "--mask-column",
    "users.email",  # hash, the default
    "--mask-column",
    "users.age=truncate:1",
    "--mask-column",
    'public."users".active=redact',
    "--mask-key",
    KEY,
    "--log-level",
    "debug",
)
#: clear values that must never leave pg2sink (nor PostgreSQL, for the import), the key
#: and the padded keys of the import's SQL HMAC (as good as the key)
CLEAR = (
    b"pw-ann",
    b"pw-bob",
    b"ann@example.com",
    b"bob@example.com",
    KEY.encode(),
    *(pad.hex().encode() for pad in Mask("hash", key=KEY.encode()).pads()),
)


def hashed(text: str) -> str:
    """What the hash mask makes of a value's PostgreSQL text."""
    return hmac.new(KEY.encode(), text.encode(), hashlib.sha256).hexdigest()


def _users(db: Database) -> Any:
    conn = db.connect()
    conn.execute(
        "CREATE TABLE users (id int PRIMARY KEY, email text, password text, age int,"
        " active bool, note text)"
    )
    conn.execute("ALTER TABLE users REPLICA IDENTITY FULL")  # old rows: masked too
    return conn


def _assert_nothing_clear(*outputs: bytes) -> None:
    for data in outputs:
        for clear in CLEAR:
            assert clear not in data, clear


def _schema_fields(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    [schema] = {json.dumps(r["schema"], sort_keys=True) for r in records if r["kind"] == "schema"}
    return {f["pg.column"]: f for f in json.loads(schema)["fields"]}


def test_excluded_and_masked_columns_in_the_stream(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = _users(db)
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out, *MASKS)
    conn.execute("INSERT INTO users VALUES (1, 'ann@example.com', 'pw-ann', 42, true, 'n')")
    conn.execute("INSERT INTO users VALUES (2, NULL, 'pw-bob', NULL, NULL, 'm')")
    conn.execute("UPDATE users SET email = 'bob@example.com', age = 7 WHERE id = 2")
    conn.execute("DELETE FROM users WHERE id = 1")
    wait_for(lambda: len(modifications(out)) == 4, what="four changes")
    assert p.stop() == 0

    mods = modifications(out)
    assert [m["operation"] for m in mods] == ["INSERT", "INSERT", "UPDATE", "DELETE"]
    ann = {"id": 1, "email": hashed("ann@example.com"), "age": "4", "active": "REDACTED"}
    assert mods[0]["after"] == {**ann, "note": "n"}
    # NULL stays NULL under every mask
    assert mods[1]["after"] == {"id": 2, "email": None, "age": None, "active": None, "note": "m"}
    assert mods[2]["before"] == mods[1]["after"]
    assert mods[2]["after"] == {**mods[1]["after"], "email": hashed("bob@example.com"), "age": "7"}
    assert mods[3]["before"] == {**ann, "note": "n"}
    fields = _schema_fields(read_jsonl(out))
    assert list(fields) == ["id", "email", "age", "active", "note"]
    assert fields["email"]["pg.mask"] == "hash" and fields["age"]["pg.mask"] == "truncate:1"
    assert fields["active"]["pg.mask"] == "redact" and "pg.mask" not in fields["id"]
    assert fields["age"]["type"] == ["null", {"type": "string", "pg.type": "text"}]
    _assert_nothing_clear(out.read_bytes(), p.stderr().encode())


def test_a_key_column_cannot_be_excluded(db: Database, pg2sink_proc: Proc, tmp_path: Path) -> None:
    """Refused at start for the publication's tables, before the slot exists; refused when
    a table joins while streaming, before any change of it is written."""
    conn = _users(db)
    done = run_cli("stream", "--source", db.dsn, "--exclude-column", "users.id")
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "pg2sink: error: --exclude-column public.users.id: id is a key column of public.users; "
            "a key column cannot be excluded"
        )
    )
    assert db.slot_confirmed_lsn() is None  # no slot was made
    out = tmp_path / "out.jsonl"
    p = start(pg2sink_proc, out, "--mask-column", "later.code=redact")
    conn.execute("CREATE TABLE later (code text PRIMARY KEY)")
    conn.execute("INSERT INTO later VALUES ('x1')")
    assert p.proc is not None and p.proc.wait(30) == 2
    assert (
        "--mask-column public.later.code=redact: code is a key column of public.later; only "
        "the hash mask keeps distinct keys distinct"
    ) in p.stderr()
    assert modifications(out) == []


def test_bad_column_options_are_one_line_errors_without_the_key(db: Database) -> None:
    for args, words in [
        (("--mask-column", "users.email"), "the hash mask needs --mask-key"),
        (("--mask-column", "users.email=blur", "--mask-key", KEY), "unknown mask 'blur'"),
        (("--mask-column", "users.e=truncate:0", "--mask-key", KEY), "unknown mask"),
        (("--exclude-column", "password", "--mask-key", KEY), "[SCHEMA.]TABLE.COLUMN"),
    ]:
        done = run_cli("stream", "--source", db.dsn, *args)
        assert done.returncode == 2, done.stderr
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert KEY not in done.stderr
    shown = run_cli("stream", "--help", env={"PG2SINK_MASK_KEY": KEY})
    assert shown.returncode == 0 and "--mask-key" in shown.stdout and KEY not in shown.stdout


@pytest.mark.slow
def test_an_import_reads_masked_values_only(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    conn = _users(db)
    conn.execute("INSERT INTO users VALUES (1, 'ann@example.com', 'pw-ann', 42, true, 'n')")
    conn.execute("INSERT INTO users VALUES (2, NULL, 'pw-bob', NULL, false, 'm')")
    out = tmp_path / "out.jsonl"
    p = start_with_imports(pg2sink_proc, out, *MASKS)
    wait_imported(db, {"public.users"}, p)
    conn.execute("INSERT INTO users VALUES (3, 'ann@example.com', 'pw-ann', 42, true, 'o')")
    wait_confirmed(db, p)
    assert p.stop() == 0

    records = read_jsonl(out)
    imported = {r["after"]["id"]: r["after"] for r in records if r.get("operation") == "IMPORT"}
    [streamed] = [r["after"] for r in records if r.get("operation") == "INSERT"]
    assert imported[1] == {**streamed, "id": 1, "note": "n"}  # the same masks, the same text
    assert imported[2] == {"id": 2, "email": None, "age": None, "active": "REDACTED", "note": "m"}
    fields = _schema_fields(records)  # the import's Schema record is the stream's
    assert fields["email"]["pg.mask"] == "hash" and "password" not in fields
    _assert_nothing_clear(out.read_bytes(), p.stderr().encode())


def test_masks_through_kafka_avro(
    db: Database,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    pg2sink_proc: Callable[..., Pg2Sink],
    reader: Callable[..., Reader],
) -> None:
    """The Kafka sink encodes new rows straight from pgoutput's bytes (its native
    encoder): the rewritten bytes, so the masked text and no excluded column."""
    conn = _users(db)
    p = kafka_start(pg2sink_proc, kafka_stack, topic_prefix, *MASKS)
    conn.execute("INSERT INTO users VALUES (1, 'ann@example.com', 'pw-ann', 42, true, 'n')")
    conn.execute("UPDATE users SET age = 51 WHERE id = 1")
    topic = f"{topic_prefix}.public.users"
    got = reader(topic).read(2)
    assert p.stop() == 0
    ann = {"id": 1, "email": hashed("ann@example.com"), "age": "4", "active": "REDACTED"}
    assert got[0].value["after"] == {**ann, "note": "n"}
    assert got[1].value["after"] == {**ann, "age": "5", "note": "n"}
    assert got[1].value["before"] == {**ann, "note": "n"}
    _assert_nothing_clear(*(m.raw_value or b"" for m in got), p.stderr().encode())
    fields = registry_get(kafka_stack, f"subjects/{topic}-value/versions/latest")["schema"]
    assert '"pg.mask":"hash"' in fields.replace(" ", "") and "password" not in fields
