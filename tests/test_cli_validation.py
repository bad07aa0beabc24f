"""Bad input on the real CLI: one line on stderr, exit 2, never a traceback.

Flags given twice, names PostgreSQL would refuse half way through a start, environment
values checked like flags, schemas that do not exist, `pg2sink import --table` names.
Options that are not the subject of a case point pg2sink at an unreachable server, so
that a value accepted by mistake shows as a connection error instead of a stream that
never ends.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from tests.conftest import Database, Pg2Sink, run_cli

Proc = Callable[..., Pg2Sink]

UNREACHABLE = "host=127.0.0.1 port=1 connect_timeout=2"


def one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a run that exited 2 (asserts both)."""
    assert res.returncode == 2, res
    stderr = res.stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "Traceback" not in stderr
    return stderr


def publications(db: Database) -> list[str]:
    with psycopg.connect(db.dsn, autocommit=True) as c:
        return [r[0] for r in c.execute("SELECT pubname FROM pg_publication ORDER BY 1")]


@pytest.mark.parametrize(
    "args",
    [
        ("--source", UNREACHABLE, "--source", "dbname=other"),
        ("--slot", "a", "--slot=b"),
        ("--sink", "file", "--sink", "kafka"),
        ("--heartbeat-interval", "1s", "--heartbeat-interval", "2s"),
        ("status", "--publication", "a", "--publication", "b"),
        ("drop", "--internal-schema", "a", "--internal-schema", "b"),
    ],
)
def test_single_valued_flag_given_twice_exits_2_naming_it(args: tuple[str, ...]) -> None:
    flag = next(a for a in args if a.startswith("--")).split("=")[0]
    err = one_line_error(run_cli(*args))
    assert flag in err and "more than once" in err
    assert "other" not in err  # the values are not repeated back


def test_repeatable_flags_stay_repeatable(db: Database) -> None:
    res = run_cli(
        "status",
        "--source",
        db.dsn,
        "--slot",
        db.slot,
        "--publication",
        db.publication,
        "--schema",
        "public",
        "--schema",
        "public",
        "-t",
        "a*",
        "--table",
        "b*",
        "-T",
        "c",
        "-T",
        "d",
    )
    assert res.returncode == 0, res.stderr
    # the Kafka options: the error is the missing broker, not the repeated flags
    err = one_line_error(
        run_cli(
            "--sink=kafka",
            "--format=json",
            "--kafka-config",
            "linger.ms=5",
            "--kafka-config",
            "acks=all",
            "--topic-map",
            "public.a=x",
            "--topic-map",
            "public.b=y",
            "--schema-registry-config",
            "timeout=5",
            "--schema-registry-config",
            "a=b",
        )
    )
    assert "needs --kafka-bootstrap-servers" in err


def test_invalid_slot_name_exits_2_before_anything_is_created(db: Database) -> None:
    db.connect().execute("CREATE TABLE t (id int primary key)")
    err = one_line_error(
        run_cli("--source", db.dsn, "--slot", "Bad!Slot", "--publication", db.publication)
    )
    assert "--slot 'Bad!Slot'" in err and "lower-case letters, digits and underscores" in err
    assert publications(db) == []


@pytest.mark.parametrize("schema", ["pg_catalog", "information_schema", "pg_toast"])
def test_system_schema_is_refused(db: Database, schema: str) -> None:
    err = one_line_error(
        run_cli("--source", db.dsn, "--slot", db.slot, "--schema", "public", "--schema", schema)
    )
    assert f"--schema {schema}" in err and "system schema" in err
    assert publications(db) == []


def test_schema_that_does_not_exist_exits_2(db: Database, pg2sink_proc: Proc) -> None:
    db.connect().execute("CREATE TABLE t (id int primary key)")
    p = pg2sink_proc("--schema", "public", "--schema", "nope", "--file-path", "/dev/null").start()
    assert p.proc is not None
    assert p.proc.wait(30) == 2, p.stderr()
    stderr = p.stderr()
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"pg2sink: error: --schema nope: no such schema in database {db.name}"
    )
    assert publications(db) == []


@pytest.mark.parametrize(
    ("internal", "extra", "reason"),
    [
        ("public", (), "--internal-schema public: it must not be a published schema"),
        ("app", ("--schema", "app"), "--internal-schema app: it must not be a published schema"),
        ("public", ("--schema", "app"), "--internal-schema public: public holds user tables"),
        ("pg_catalog", (), "--internal-schema pg_catalog: system schema"),
        ("information_schema", (), "--internal-schema information_schema: system schema"),
    ],
)
def test_internal_schema_that_holds_user_tables_is_refused(
    db: Database, internal: str, extra: tuple[str, ...], reason: str
) -> None:
    db.connect().execute("CREATE TABLE t (id int primary key)")
    err = one_line_error(
        run_cli("--source", db.dsn, "--slot", db.slot, "--internal-schema", internal, *extra)
    )
    assert reason in err
    assert publications(db) == []


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("PG2SINK_LOG_LEVEL", "verbose", "invalid choice: 'verbose'"),
        ("PG2SINK_LOG_FORMAT", "yaml", "invalid choice: 'yaml'"),
        ("PG2SINK_FORMAT", "xml", "invalid choice: 'xml'"),
        ("PG2SINK_SINK", "s3", "invalid choice: 's3'"),
        ("PG2SINK_FLUSH_INTERVAL", "-1s", "invalid duration '-1s'"),
        ("PG2SINK_IMPORT_BACKOFF_FACTOR", "lots", "invalid factor 'lots'"),
        ("PG2SINK_STREAMING", "perhaps", "PG2SINK_STREAMING='perhaps' is not a boolean"),
    ],
)
def test_environment_values_are_validated_like_flags(
    variable: str, value: str, expected: str
) -> None:
    err = one_line_error(run_cli("--source", UNREACHABLE, env={variable: value}))
    assert expected in err
    assert variable in err
    # the same value as a flag: the same check
    if variable not in ("PG2SINK_STREAMING",):
        flag = "--" + variable.removeprefix("PG2SINK_").lower().replace("_", "-")
        assert expected in one_line_error(run_cli("--source", UNREACHABLE, f"{flag}={value}"))


def test_status_and_drop_validate_the_environment_too() -> None:
    for command in ("status", "drop", "migrate", "import"):
        err = one_line_error(
            run_cli(command, "--source", UNREACHABLE, env={"PG2SINK_LOG_LEVEL": "loud"})
        )
        assert "invalid choice: 'loud'" in err
    # a switch's variable too, even one this run does not use (--tombstones: Kafka only)
    err = one_line_error(
        run_cli("--sink=file", "--source", UNREACHABLE, env={"PG2SINK_TOMBSTONES": "maybe"})
    )
    assert "PG2SINK_TOMBSTONES='maybe' is not a boolean" in err


def test_created_publication_is_logged_only_after_commit(db: Database) -> None:
    """The role may create the publication but not add a table it does not own: the
    transaction rolls back, so the publication was never created and must not be said to."""
    admin = db.connect()
    admin.execute("CREATE TABLE owned_by_admin (id int primary key)")
    role = f"r_{db.name}"
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
    try:
        admin.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(db.name), sql.Identifier(role)
            )
        )
        res = run_cli(
            "--source",
            db.dsn.replace("user=postgres", f"user={role}"),
            "--slot",
            db.slot,
            "--publication",
            db.publication,
            "--file-path",
            "/dev/null",
        )
    finally:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert res.returncode == 2, res.stderr
    assert "ownership" in res.stderr
    assert "created publication" not in res.stderr
    assert publications(db) == []


def _publish(db: Database, *tables: str) -> psycopg.Connection[psycopg.rows.TupleRow]:
    conn = db.connect()
    conn.execute(
        'CREATE SCHEMA "my.schema"; CREATE SCHEMA my;'
        ' CREATE TABLE "my.schema".t (id int primary key);'
        ' CREATE TABLE my."schema.t" (id int primary key);'
        ' CREATE TABLE public."Mixed" (id int primary key)'
    )
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(db.publication), sql.SQL(", ").join(sql.SQL(t) for t in tables)
        )
    )
    return conn


def _jobs(conn: psycopg.Connection[psycopg.rows.TupleRow]) -> list[tuple[str, str]]:
    rows = conn.execute("SELECT schema_name, table_name FROM pg2sink.import_jobs ORDER BY id")
    return [(r[0], r[1]) for r in rows]


def test_import_table_accepts_quoted_identifiers(db: Database) -> None:
    conn = _publish(db, '"my.schema".t', 'my."schema.t"', 'public."Mixed"')
    env = {"PG2SINK_SOURCE": db.dsn, "PG2SINK_PUBLICATION": db.publication}
    res = run_cli("import", "--table", '"my.schema".t', "--table", 'my."schema.t"', env=env)
    assert res.returncode == 0, res.stderr
    assert _jobs(conn) == [("my.schema", "t"), ("my", "schema.t")]
    assert 'created for "my.schema".t' in res.stdout
    assert 'created for my."schema.t"' in res.stdout
    res = run_cli("import", "--table", 'public."Mixed"', env=env)
    assert res.returncode == 0, res.stderr
    assert _jobs(conn)[-1] == ("public", "Mixed")


def test_import_table_never_guesses_a_dotted_name(db: Database) -> None:
    conn = _publish(db, '"my.schema".t', 'my."schema.t"', 'public."Mixed"')
    env = {"PG2SINK_SOURCE": db.dsn, "PG2SINK_PUBLICATION": db.publication}
    err = one_line_error(run_cli("import", "--table", "my.schema.t", env=env))
    assert "invalid --table 'my.schema.t'" in err and "ambiguous" in err
    assert '"my.schema".t' in err  # how to say either reading
    # unquoted names fold to lower case, as in SQL; the error names the quoted spelling
    err = one_line_error(run_cli("import", "--table", "public.Mixed", env=env))
    assert "table public.mixed is not in publication" in err
    assert 'public."Mixed"' in err
    # refused before anything was written: not even the internal schema exists
    assert conn.execute("SELECT to_regclass('pg2sink.import_jobs')").fetchone() == (None,)


def test_unterminated_quote_in_import_table(db: Database) -> None:
    env = {"PG2SINK_SOURCE": db.dsn, "PG2SINK_PUBLICATION": db.publication}
    err = one_line_error(run_cli("import", "--table", '"public.t', env=env))
    assert "unterminated double quote" in err


@pytest.mark.parametrize(
    ("sink", "fmt"),
    [("kinesis", "pg-kinesis"), ("nats", "wal-listener"), ("kafka", "psql-streamer")],
)
@pytest.mark.parametrize("switch", ["--messages", "--capture-ddl"])
def test_a_seed_format_refuses_pg2sink_s_message_records(sink: str, fmt: str, switch: str) -> None:
    """A pg_kinesis, wal-listener or psql-streamer consumer meets only its tool's records."""
    done = run_cli("stream", "--sink", sink, "--format", fmt, switch)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert f"--format {fmt} carries" in done.stderr and switch in done.stderr
