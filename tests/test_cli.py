"""The command line as users type it: help, flag errors, environment, secrets, logs."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql

from tests.conftest import Database, Pg2Sink, read_jsonl, run_cli, wait_for

Proc = Callable[..., Pg2Sink]


def test_help_lists_commands_and_stream_options() -> None:
    top = run_cli("--help")
    assert top.returncode == 0
    assert "stream" in top.stdout and "drop" in top.stdout
    stream = run_cli("stream", "--help")
    assert stream.returncode == 0
    for flag in (
        "--source",
        "--publication",
        "--slot",
        "--schema",
        "--table",
        "--exclude-table",
        "--sink",
        "--file-path",
        "--decode-only",
        "--heartbeat-interval",
        "--publication-poll-interval",
        "--retry-initial",
        "--log-level",
        "--log-format",
        "PG2SINK_SOURCE",
    ):
        assert flag in stream.stdout, flag
    # `pg2sink --flag` is `pg2sink stream --flag`: the same parser answers
    assert run_cli("--sink", "nope").stderr == run_cli("stream", "--sink", "nope").stderr


def test_unknown_flag_exits_2_with_one_line() -> None:
    res = run_cli("--no-such-flag")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1
    assert "--no-such-flag" in res.stderr


def test_bad_duration_from_the_environment_exits_2() -> None:
    res = run_cli(env={"PG2SINK_HEARTBEAT_INTERVAL": "soon"})
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1
    assert "--heartbeat-interval: invalid duration 'soon'" in res.stderr


def test_bad_table_pattern_exits_2(db: Database) -> None:
    res = run_cli("--source", db.dsn, "--slot", db.slot, "-t", '"unterminated')
    assert res.returncode == 2
    assert "unterminated double quote" in res.stderr


def test_role_without_replication_exits_2_naming_the_fix(db: Database) -> None:
    admin = db.connect()
    role = f"norepl_{db.name}"
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        res = run_cli("--source", db.dsn.replace("user=postgres", f"user={role}"))
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert res.returncode == 2
    assert res.stderr.startswith(f"pg2sink: error: role '{role}' may not use replication")
    assert "ALTER ROLE" in res.stderr


def test_password_never_appears_in_logs_or_records(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    """The test server trusts local logins, so a password in the DSN is accepted
    and ignored: every path that could print the DSN runs with it present."""
    secret = "s3cr3t-Pa55word"
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key, note text)")
    out = tmp_path / "out.jsonl"
    p = pg2sink_proc(
        "--file-path",
        str(out),
        "--log-level",
        "debug",
        "--flush-interval",
        "100ms",
        env={"PG2SINK_SOURCE": f"{db.dsn} password={secret}"},
    ).start()
    p.wait_streaming()
    conn.execute("INSERT INTO t VALUES (1, 'hello')")
    wait_for(lambda: read_jsonl(out), what="the insert")
    # every HTTP endpoint, metrics included, while it runs
    match = re.search(r"/metrics on (http://\S+)", p.stderr())
    assert match, p.stderr()
    served = ""
    for path in ("/metrics", "/stats", "/status", "/health"):
        try:
            with urllib.request.urlopen(match.group(1) + path, timeout=10) as resp:
                served += resp.read().decode()
        except urllib.error.HTTPError as e:  # /status may answer 500 with a JSON body
            served += e.read().decode()
    p.stop()
    assert "pg2sink_changes_total" in served
    assert secret not in served
    assert "pg2sink is streaming" in p.stderr()
    assert secret not in p.stderr()
    assert secret not in out.read_text()
    # and a failing connection with a password does not echo it either
    bad = run_cli("--source", f"host=127.0.0.1 port=1 user=x password={secret} connect_timeout=2")
    assert bad.returncode == 2 and secret not in bad.stderr + bad.stdout


def test_log_format_json_is_one_object_per_line(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    db.connect().execute("CREATE TABLE t (id int primary key)")
    p = pg2sink_proc("--file-path", str(tmp_path / "o.jsonl"), "--log-format", "json").start()
    p.wait_streaming()
    p.stop()
    lines = [json.loads(line) for line in p.stderr().splitlines() if line.strip()]
    assert lines, "no log lines"
    for entry in lines:
        assert {"ts", "level", "logger", "event"} <= entry.keys()
    assert any(e["event"].startswith("pg2sink is streaming") for e in lines)


def test_environment_configures_and_flags_win(
    db: Database, pg2sink_proc: Proc, tmp_path: Path
) -> None:
    db.connect().execute("CREATE TABLE t (id int primary key)")
    from_env = tmp_path / "env.jsonl"
    p = pg2sink_proc(env={"PG2SINK_FILE_PATH": str(from_env), "PG2SINK_SLOT": "env_slot"}).start()
    p.wait_streaming()
    p.stop()
    with psycopg.connect(db.dsn, autocommit=True) as c:
        slots = {r[0] for r in c.execute("SELECT slot_name FROM pg_replication_slots")}
    assert "env_slot" in slots
    flagged = tmp_path / "flag.jsonl"
    p = pg2sink_proc(
        "--file-path", str(flagged), "--slot", db.slot, env={"PG2SINK_FILE_PATH": str(from_env)}
    ).start()
    p.wait_streaming()
    db.connect().execute("INSERT INTO t VALUES (1)")
    wait_for(lambda: read_jsonl(flagged), what="records in the flag's file")
    p.stop()


def test_an_unknown_pg2sink_variable_is_a_warning_naming_the_closest_option() -> None:
    """A typo in a variable's name would leave its option at the default in silence."""
    res = run_cli(
        "status",
        "--source",
        "host=/nonexistent",
        env={"PG2SINK_SLOTT": "mine", "PG2SINK_SLOT": "s", "PG2SINK_ZZZZ": "secret-value"},
    )
    lines = [line for line in res.stderr.splitlines() if "WARNING" in line]
    assert [line.split(": ", 1)[1] for line in lines] == [
        "environment variable PG2SINK_SLOTT is not a pg2sink setting "
        "(did you mean PG2SINK_SLOT, --slot?); it is ignored",
        "environment variable PG2SINK_ZZZZ is not a pg2sink setting; it is ignored",
    ]
    assert "secret-value" not in res.stderr and res.returncode == 2  # the source: unreachable
