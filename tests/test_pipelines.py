"""Several pipelines in one process (`[pipeline.NAME]` tables, pg2sink/pipelines.py):
the file's tables checked and shown, clashes refused, every pg2sink_* series labelled
with its pipeline; and real processes: three databases on two PostgreSQL servers into
three file sinks with one server stopped for 30 s (the others keep streaming, the
stopped one resumes, nothing lost), two Kafka pipelines and a file one side by side, and
a pipeline that cannot start ending alone."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import services
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from pg2sink import logs
from pg2sink.observability.http import start_http_server
from pg2sink.observability.metrics import make_registry
from pg2sink.observability.stats import LogCounter, StreamStats
from tests.conftest import (
    Database,
    KafkaStack,
    Pg2Sink,
    clean_env,
    fresh_database,
    read_jsonl,
    run_cli,
    start_postgres,
    wait_for,
)
from tests.sinks.kafka.test_kafka import Reader

SECRET = "pipeline-s3cr3t"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pipelines.toml"
    path.write_text(text)
    return str(path)


def pipeline_table(name: str, db: Database, out: Path | None, **extra: str) -> str:
    lines = [
        f"[pipeline.{name}]",
        f'source = "{db.dsn}"',
        f'slot = "{db.slot}"',
        f'publication = "{db.publication}"',
        *([f'file_path = "{out}"'] if out is not None else []),
        *(f'{key} = "{value}"' for key, value in extra.items()),
    ]
    return "\n".join(lines) + "\n"


TOP = 'publication_poll_interval = "300ms"\nflush_interval = "100ms"\n'

TWO = (
    'sink = "file"\nflush_interval = "2s"\n'
    '[pipeline.orders]\nsource = "host=/nowhere dbname=orders password=${PW}"\n'
    'slot = "orders"\nfile_path = "/tmp/orders.jsonl"\n'
    '[pipeline.users]\nsource = "host=/nowhere dbname=users"\nslot = "users"\n'
    'file_path = "/tmp/users.jsonl"\nflush_interval = "500ms"\n'
)


# --- the file: checked, shown, clashes refused (no server) ---------------------------


def test_check_and_show_a_file_with_two_pipelines(tmp_path: Path) -> None:
    path = write(tmp_path, TWO)
    env = {"PW": SECRET}
    done = run_cli("config", "check", path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{path}: ok (2 pipelines: orders, users)"
    shown = run_cli("config", "show", "--config", path, env=env)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert SECRET not in out + shown.stderr
    orders, users = out.split("[pipeline.orders]\n")[1].split("\n\n[pipeline.users]\n")
    # the top level's value where a pipeline sets none, the pipeline's own where it does
    assert f"flush_interval = 2.0  # file {path}:2: flush_interval" in orders
    assert f"flush_interval = 0.5  # file {path}:11: [pipeline.users] flush_interval" in users
    assert f'slot = "orders"  # file {path}:5: [pipeline.orders] slot' in orders
    assert f"source = ***  # file {path}:4: [pipeline.orders] source" in orders
    assert 'sink = "file"' in users
    # the process's settings once, above the pipelines, as a file would have them
    assert out.index('metrics_address = "127.0.0.1:0"') < out.index("[pipeline.orders]")
    assert "metrics_address" not in orders + users
    one = run_cli("config", "show", "--config", path, "--pipeline", "users", env=env)
    assert one.returncode == 0, one.stderr
    assert not any(line.startswith("[pipeline") for line in one.stdout.splitlines())
    assert f'slot = "users"  # file {path}:9: [pipeline.users] slot' in one.stdout


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # a server's slot, a database's publication: never two pipelines'
        (TWO.replace('slot = "users"', 'slot = "orders"'), "pipelines orders and users both "
         "use slot orders on /nowhere:5432: each pipeline needs its own"),
        (TWO.replace("dbname=users", "dbname=orders").replace('slot = "users"', 'slot = "u"'),
         "both use publication pg2sink of database orders on /nowhere:5432"),
        (TWO.replace("/tmp/users.jsonl", "/tmp/orders.jsonl"),
         "both use the file /tmp/orders.jsonl"),
        (TWO + 'metrics_address = "127.0.0.1:1"\n',
         ":12: [pipeline.users] metrics_address: a setting of the whole process"),
        (TWO.replace('flush_interval = "500ms"', 'flush_interval = "soon"'),
         "invalid duration 'soon' (examples: 10s, 500ms, 2m) (from {path}:11: "
         "[pipeline.users] flush_interval)"),
        (TWO + 'slott = "x"\n', ":12: [pipeline.users] slott: unknown key (did you mean slot?)"),
        (TWO + 'password_file = "/etc/hostname"\n', "[pipeline.users] password_file: sets "
         "libpq's password for the whole process"),
        (TWO.replace("[pipeline.users]", "[pipeline.'bad name']"),
         "[pipeline.bad name]: a pipeline's name is letters, digits"),
        (TWO.replace('slot = "users"', 'slot = "Users"'), "pipeline users: invalid --slot"),
    ],
)  # fmt: skip
def test_a_bad_pipeline_is_one_line_naming_it(tmp_path: Path, text: str, words: str) -> None:
    path = write(tmp_path, text)
    for command in (["config", "check", path], ["--config", path]):
        done = run_cli(*command, env={"PW": SECRET})
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert words.replace("{path}", path) in done.stderr


def test_commands_of_one_pipeline_need_it_named(tmp_path: Path) -> None:
    path = write(tmp_path, TWO)
    done = run_cli("status", "--config", path, env={"PW": SECRET})
    assert done.returncode == 2
    assert "holds pipelines (orders, users): `pg2sink status` acts on one, choose it with " \
        "--pipeline NAME" in done.stderr  # fmt: skip
    done = run_cli("drop", "--config", path, "--pipeline", "nope", env={"PW": SECRET})
    assert done.returncode == 2
    assert f"--pipeline nope: {path} has no [pipeline.nope] (orders, users)" in done.stderr


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample `name` with `labels` (among others) in /metrics text."""
    values = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]
    assert len(values) == 1, (name, labels, values)
    return float(values[0])


def test_every_series_is_labelled_with_its_pipeline() -> None:
    a, b = StreamStats(), StreamStats()
    a.replication_up()
    a.sink_up()
    a.table_changes("public", "t")["INSERT"] += 3
    b.heartbeats = 2
    text = generate_latest(make_registry({"a": a, "b": b})).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    ours = [f for name, f in families.items() if name.startswith("pg2sink_")]
    assert all(s.labels["pipeline"] in ("a", "b") for f in ours for s in f.samples)
    for name in ("pg2sink_up", "pg2sink_heartbeats", "pg2sink_errors", "pg2sink_info"):
        assert {s.labels["pipeline"] for s in families[name].samples} == {"a", "b"}, name
    assert text.count("# TYPE pg2sink_up gauge") == 1  # one family, both pipelines in it
    assert 'pg2sink_up{pipeline="a"} 1.0' in text and 'pg2sink_up{pipeline="b"} 0.0' in text
    inserts = {"pipeline": "a", "schema": "public", "table": "t", "operation": "INSERT"}
    assert sample(text, "pg2sink_changes_total", **inserts) == 3
    assert 'pg2sink_heartbeats_total{pipeline="b"} 2.0' in text
    # a pipeline alone keeps today's series
    assert "pg2sink_up 1.0" in generate_latest(make_registry(a)).decode()


def test_one_http_api_for_every_pipeline() -> None:
    a, b = StreamStats(), StreamStats()
    a.replication_up()
    a.sink_up()
    b.heartbeats = 4
    with start_http_server("127.0.0.1:0", {"a": a, "b": b}) as srv:
        status, body = get(f"{srv.url}/status")
        assert status == 500 and body["status"] == "unhealthy" and body["unhealthy"] == ["b"]
        assert body["pipelines"]["a"]["status"] == "ok"
        assert body["pipelines"]["b"]["problems"]["replication"] == "not connected yet"
        assert get(f"{srv.url}/status/a") == (200, body["pipelines"]["a"])
        assert get(f"{srv.url}/status/b")[0] == 500
        assert get(f"{srv.url}/stats/b")[1]["heartbeats"] == 4
        assert set(get(f"{srv.url}/stats")[1]["pipelines"]) == {"a", "b"}
        missing = get(f"{srv.url}/status/c")
        assert missing[0] == 404 and missing[1]["pipelines"] == ["a", "b"]
        a.replication_down("lost")
        assert get(f"{srv.url}/status")[1]["unhealthy"] == ["a", "b"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_pipeline_s_log_lines_name_it(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stats = StreamStats()
    counter = LogCounter(stats, "shop")
    try:
        logs.setup("info", fmt)
        root.addHandler(counter)

        def in_pipeline() -> None:
            logs.PIPELINE.set("shop")
            logging.getLogger("pg2sink.service").warning("streaming stopped: %s", "why")

        thread = threading.Thread(target=in_pipeline)
        thread.start()
        thread.join()
        logging.getLogger("pg2sink.pipelines").warning("the process's own line")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    first, second = capsys.readouterr().err.splitlines()
    if fmt == "text":
        assert first.endswith("pg2sink.service: pipeline shop: streaming stopped: why")
        assert second.endswith("pg2sink.pipelines: the process's own line")
    else:
        assert json.loads(first)["pipeline"] == "shop"
        assert json.loads(first)["event"] == "streaming stopped: why"
        assert "pipeline" not in json.loads(second)
    assert stats.log_messages["warning"] == 1  # the pipeline's line only


# --- real servers ----------------------------------------------------------------


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        body, status = e.read().decode(), e.code
    return status, json.loads(body) if body.startswith("{") else body


def api_url(p: Pg2Sink) -> str:
    match = re.search(r"/metrics on (http://\S+)", p.stderr())
    assert match, p.stderr()
    return match.group(1).rstrip("/")


def ids(path: Path) -> list[int]:
    return [r["after"]["id"] for r in read_jsonl(path) if r.get("kind") == "modification"]


def holds(path: Path, rows: int) -> Callable[[], bool]:
    """Whether the file holds at least `rows` changes (for wait_for)."""
    return lambda: len(ids(path)) >= rows


def insert(db: Database, first: int, count: int) -> int:
    """Rows `first`... in one transaction; an LSN inside it (before its commit): a slot
    confirmed at or past it holds the transaction."""
    with psycopg.connect(db.dsn) as conn:  # one transaction, committed at the end
        conn.execute(
            "INSERT INTO t SELECT generate_series(%s::int, %s::int)", (first, first + count - 1)
        )
        row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'").fetchone()
    assert row is not None
    return int(row[0])


def streaming(p: Pg2Sink, *names: str) -> bool:
    assert p.proc is not None and p.proc.poll() is None, p.stderr()
    return all(f"pipeline {name}: pg2sink is streaming" in p.stderr() for name in names)


@pytest.fixture
def second_server() -> Iterator[services.Postgres]:
    with start_postgres() as server:
        yield server


@pytest.mark.slow
def test_three_databases_on_two_servers_one_stopped_for_30s(
    pg_server: services.Postgres, second_server: services.Postgres, tmp_path: Path
) -> None:
    with (
        fresh_database(pg_server) as a,
        fresh_database(pg_server) as b,
        fresh_database(second_server) as c,
    ):
        dbs = {"a": a, "b": b, "c": c}
        outs = {name: tmp_path / f"{name}.jsonl" for name in dbs}
        for db in dbs.values():
            with psycopg.connect(db.dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        path = write(tmp_path, TOP + "".join(pipeline_table(n, dbs[n], outs[n]) for n in dbs))
        p = Pg2Sink(args=["--config", path], env=clean_env(), workdir=tmp_path).start()
        try:
            wait_for(lambda: streaming(p, "a", "b", "c"), 60, "three pipelines streaming")
            url = api_url(p)
            last = {name: insert(db, 1, 100) for name, db in dbs.items()}
            for name, out in outs.items():
                wait_for(holds(out, 100), 30, f"{name}'s first rows")

            second_server.stop()
            outage = time.monotonic()
            # the others go on streaming while c's server is down: their files grow
            first = 101
            while time.monotonic() - outage < 30:
                last["a"] = insert(a, first, 10)
                last["b"] = insert(b, first, 10)
                first += 10
                wait_for(holds(outs["a"], first - 1), 10, "a's rows during the outage")
                wait_for(holds(outs["b"], first - 1), 10, "b's rows during the outage")
                time.sleep(0.5)
            assert first > 150  # a, b wrote at least five batches during the 30 s
            status, body = get(f"{url}/status")
            assert status == 500, body
            assert body["unhealthy"] == ["c"], body
            assert body["pipelines"]["a"]["status"] == "ok"
            assert body["pipelines"]["c"]["replication"] == "failing"
            assert get(f"{url}/status/c")[0] == 500
            assert get(f"{url}/status/a")[0] == 200

            second_server.start()
            last["c"] = insert(c, 101, 50)
            wait_for(lambda: set(ids(outs["c"])) >= set(range(1, 151)), 60, "c resuming")
            wait_for(lambda: get(f"{url}/status")[0] == 200, 30, "every pipeline healthy")
            assert "pipeline c: streaming stopped" in p.stderr()
            assert "pipeline c: streaming again after" in p.stderr()

            status, metrics = get(f"{url}/metrics")
            assert status == 200
            for name in dbs:
                assert f'pg2sink_up{{pipeline="{name}"}} 1.0' in metrics
            inserts = sample(metrics, "pg2sink_changes_total", pipeline="c", operation="INSERT")
            assert inserts >= 150, metrics

            started = time.monotonic()
            assert p.stop() == 0, p.stderr()
            assert time.monotonic() - started < 10
        finally:
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)
        # nothing lost anywhere; a and b were never disturbed: not a row twice. c's slot
        # resends what its last confirmation did not cover (at-least-once)
        assert sorted(ids(outs["a"])) == list(range(1, first))
        assert sorted(ids(outs["b"])) == list(range(1, first))
        assert set(ids(outs["c"])) == set(range(1, 151))
        assert len(ids(outs["c"])) - 150 <= 100
        # each slot confirmed what its own sink holds, up to the last transaction
        for name, db in dbs.items():
            confirmed = db.slot_confirmed_lsn()
            assert confirmed is not None and confirmed >= last[name], name


def test_a_pipeline_that_cannot_start_ends_alone(db: Database, tmp_path: Path) -> None:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        role = f"norepl_{db.slot[5:]}"
        # no REPLICATION: an error retrying cannot help
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    no_replication = Database(
        db.server, db.name, db.slot + "_bad", db.publication + "_bad", f"{db.dsn} user={role}"
    )
    path = write(
        tmp_path,
        TOP + pipeline_table("good", db, good) + pipeline_table("bad", no_replication, bad),
    )
    p = Pg2Sink(args=["--config", path], env=clean_env(), workdir=tmp_path).start()
    try:
        wait_for(lambda: streaming(p, "good"), 60, "the good pipeline streaming")
        wait_for(lambda: "pipeline bad: role" in p.stderr(), 30, "the bad one's error")
        assert f"pipeline bad: role '{role}' may not use replication" in p.stderr()
        assert "this pipeline stopped, the others go on" in p.stderr()
        insert(db, 1, 20)
        wait_for(lambda: ids(good) == list(range(1, 21)), 30, "the good pipeline's rows")
        status, body = get(f"{api_url(p)}/status")
        assert status == 500 and body["unhealthy"] == ["bad"], body
        assert "may not use replication" in body["pipelines"]["bad"]["problems"]["replication"]
        code = p.stop()
    finally:
        if p.proc is not None and p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait(10)
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert code == 2
    last = p.stderr().strip().splitlines()[-1]
    assert last.startswith("pg2sink: error: pipeline bad: role"), last


def test_kafka_and_file_pipelines_side_by_side(
    pg_server: services.Postgres, kafka_stack: KafkaStack, topic_prefix: str, tmp_path: Path
) -> None:
    """Two pipelines into one Kafka cluster (Avro, the registry: each its own producer and
    encoders, in threads side by side) and one into a file, all in one process."""
    with (
        fresh_database(pg_server) as shop,
        fresh_database(pg_server) as hr,
        fresh_database(pg_server) as billing,
    ):
        dbs = {"shop": shop, "hr": hr, "billing": billing}
        for db in dbs.values():
            with psycopg.connect(db.dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        top = (
            f'{TOP}sink = "kafka"\nkafka_bootstrap_servers = "{kafka_stack.bootstrap_servers}"\n'
            f'schema_registry_url = "{kafka_stack.registry_url}"\n'
        )
        out = tmp_path / "billing.jsonl"
        tables = [
            pipeline_table(name, dbs[name], None, topic_prefix=f"{topic_prefix}_{name}")
            for name in ("shop", "hr")
        ]
        tables.append(pipeline_table("billing", billing, out, sink="file"))
        path = write(tmp_path, top + "".join(tables))
        p = Pg2Sink(args=["--config", path], env=clean_env(), workdir=tmp_path).start()
        topics = [f"{topic_prefix}_{name}.public.t" for name in ("shop", "hr")]
        reader = Reader(kafka_stack.bootstrap_servers, topics, kafka_stack.registry_url)
        try:
            wait_for(lambda: streaming(p, *dbs), 60, "three pipelines streaming")
            for start in range(1, 301, 50):  # the pipelines' transactions interleaved
                for db in dbs.values():
                    insert(db, start, 50)
            messages = reader.read(600)
            for name, topic in zip(("shop", "hr"), topics, strict=True):
                rows = [m.value["after"]["id"] for m in messages if m.topic == topic]
                assert sorted(rows) == list(range(1, 301)), name
                assert len(rows) == 300, name  # no stream resent anything
            wait_for(holds(out, 300), 30, "billing's file")
            assert sorted(ids(out)) == list(range(1, 301))
            metrics = get(f"{api_url(p)}/metrics")[1]
            for name in dbs:
                value = sample(metrics, "pg2sink_changes_total", pipeline=name, operation="INSERT")
                assert value == 300, name
            started = time.monotonic()
            assert p.stop() == 0, p.stderr()
            assert time.monotonic() - started < 10
        finally:
            reader.close()
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)
