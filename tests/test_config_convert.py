"""`pg2sink config convert FILE` (pg2sink/convert/): the seed tools' own example files
(tests/fixtures/, written from their repositories and READMEs) converted, each result
loaded by `pg2sink config check`, its values asserted; every setting of the source file
either converted (named in a setting's comment) or noted with why not; and one converted
wal-listener configuration run for real against PostgreSQL and nats-server."""

from __future__ import annotations

import asyncio
import re
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import REPO, Database, Pg2Sink, clean_env, run_cli, wait_for
from tests.sinks.nats.nats_support import delete_stream, stored
from tests.sinks.nats.test_formats_nats import wal_listener_consumer

FIXTURES = REPO / "tests" / "fixtures"


def convert(path: Path | str, *extra: str) -> str:
    done = run_cli("config", "convert", str(path), *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def checked(path: Path) -> dict[str, Any]:
    """The file's settings, once `pg2sink config check` accepted it."""
    done = run_cli("config", "check", str(path))
    assert (done.returncode, done.stdout.strip()) == (0, f"{path}: ok"), done.stderr
    return tomllib.loads(path.read_text())


def prose(out: str) -> str:
    """The output's words, comment marks left out (a note may wrap over lines)."""
    return " ".join(w for w in out.split() if w != "#")


def keys_of(data: dict[str, Any], prefix: str = "") -> list[str]:
    """`section.key` of every setting of a seed file (nested tables walked)."""
    out = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name.count(".") < 2 and key not in ("tableTopicMapping",):
            out += keys_of(value, f"{name}.")
        else:
            out.append(name)
    return out


def test_psql_streamers_example_file(tmp_path: Path) -> None:
    """Its one sink reads its kafka source: a relay, written commented out (pg2sink relay
    cannot read psql-streamer's events yet); its postgres source feeds no sink."""
    out = convert(FIXTURES / "psql-streamer.toml")
    path = tmp_path / "kafka1-kafka1.toml"
    path.write_text(out)
    assert checked(path) == {}  # every setting commented out
    commented = "\n".join(line[2:] for line in out.splitlines() if re.match(r"# \w+ = ", line))
    settings = tomllib.loads(commented)
    assert settings == {
        "relay_bootstrap_servers": "kafka1:9092,kafka2:9092,kafka3:9092",
        "relay_topics": "^(topic1|topic2)$",
        "relay_group_id": "bar",
        "relay_batch_size": 400,
        "sink": "kafka",
        "kafka_bootstrap_servers": "kafka1:9092,kafka2:9092,kafka3:9092",
        "topic_map": ["public.table1=topic1", "public.table2=topic2"],
        "fallback_topic": "garbageBin",
        "kafka_config": [
            "batch.num.messages=100",
            "linger.ms=10",
            "topic.metadata.refresh.interval.ms=5000",
        ],
        "metrics_address": "127.0.0.1:12080",
    }
    text = prose(out)
    assert "Run: pg2sink relay --config kafka1-kafka1.toml" in text
    assert "source.db1 is read by no sink: not converted" in text
    assert "issue #29, item 5" in text
    seed = tomllib.loads((FIXTURES / "psql-streamer.toml").read_text())
    for key in keys_of(seed):
        # type and sources make the documents, named in each one's header
        if not key.startswith("source.db1") and not key.endswith((".type", ".sources")):
            assert key in text, f"{key}: neither converted nor noted"


def test_psql_streamer_fan_in_is_one_configuration_per_source_and_sink(tmp_path: Path) -> None:
    done = run_cli(
        "config", "convert", str(FIXTURES / "psql-streamer-fanin.toml"), "--output-dir",
        str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = sorted(Path(line).name for line in done.stdout.split())
    assert names == ["billing-events.toml", "orders-discard.toml", "orders-events.toml"]
    assert "hunter2" not in done.stdout + done.stderr
    orders = checked(tmp_path / "orders-events.toml")
    assert conninfo_to_dict(orders.pop("source")) == {
        "host": "db1.internal",
        "dbname": "orders",
        "user": "streamer",
        "sslmode": "require",
        "connect_timeout": "5",
    }
    assert orders == {
        "publication": "pub_orders",
        "publication_mode": "use",
        "slot": "psql_streamer_orders",
        "no_imports": True,
        "retry_initial": True,
        "retry_interval": "2s",
        "flush_interval": "1s",
        "sink": "kafka",
        "kafka_bootstrap_servers": "kafka1:9092,kafka2:9092",
        "format": "psql-streamer",
        "topic_map": ["public.orders=orders-events", "public.invoices=billing-events"],
        "fallback_topic": "cdc-other",
        "kafka_config": [
            "batch.num.messages=100",
            "linger.ms=10",
            "topic.metadata.refresh.interval.ms=5000",
        ],
        "metrics_address": "0.0.0.0:12080",
    }
    billing = checked(tmp_path / "billing-events.toml")
    assert conninfo_to_dict(billing["source"]) == {
        "host": "db2.internal",
        "port": "5433",
        "dbname": "billing",
        "user": "streamer",
    }
    assert (billing["slot"], billing["publication"]) == ("psql_streamer_billing", "pub_billing")
    # one listener per process: the second keeps the host, any free port
    assert billing["metrics_address"] == "0.0.0.0:0"
    discard = checked(tmp_path / "orders-discard.toml")
    # the source's second sink: another process, so another slot
    assert (discard["sink"], discard["slot"]) == ("null", "psql_streamer_orders_discard")
    text = prose((tmp_path / "orders-events.toml").read_text())
    for noted in (
        "source.orders.dsn: its password is not copied",
        "source.orders.walRetain = 1048576",
        "source.orders.batchSize",
        "sink.events.verbose = true",
        "sink.events.timeout, sink.events.maxAttempts: pg2sink waits",
        "tickerInterval",
        "boltdb",
    ):
        assert noted in text, noted
    seed = tomllib.loads((FIXTURES / "psql-streamer-fanin.toml").read_text())
    assert "As pg2sink does anyway: source.orders.walPositionOverride = 0" in text
    for key in keys_of(seed):
        if not key.startswith(("source.billing", "sink.discard")) and not key.endswith(
            (".type", ".sources")
        ):
            assert key in text, f"{key}: neither converted nor noted"


def test_wal_listeners_example_file(tmp_path: Path) -> None:
    out = convert(FIXTURES / "wal-listener.yml")
    path = tmp_path / "wal-listener.toml"
    path.write_text(out)
    settings = checked(path)
    assert conninfo_to_dict(settings.pop("source")) == {
        "host": "localhost",
        "port": "5432",
        "dbname": "test_db",
        "user": "back",
    }
    assert settings == {
        "sink": "nats",
        "format": "wal-listener",
        "table": ["users"],
        "only": ["users=insert,update"],
        "slot": "myslot_1_test_db",  # wal-listener's: slotName + "_" + database.name
        "heartbeat_interval": "10s",
        "nats_url": "nats://localhost:4222",
        "nats_subject_prefix": "pre",
        "log_level": "info",
        "log_format": "text",
        "no_imports": True,
    }
    assert not re.search(r"\bpass\b", out)  # database.password's value
    text = prose(out)
    seed = yaml.safe_load((FIXTURES / "wal-listener.yml").read_text())
    for key in keys_of(seed):
        assert key.rpartition(".")[2] in text, f"{key}: neither converted nor noted"
    for noted in (
        "database.password: not copied",
        "nats.clusterID: NATS Streaming's",
        "listener.refreshConnection",
        "logger.caller",
    ):
        assert noted in text, noted


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("x.conf", "hello: [", "neither psql-streamer's TOML"),
        ("x.toml", "a = ", "not TOML"),
        ("x.yml", "- a\n- b\n", "not a YAML mapping"),
        ("x.toml", '[sink.k]\ntype = "kafka"\nsources = ["nope"]\n', "no [source.nope]"),
        ("x.toml", '[source.s]\ntype = "mysql"\n[sink.k]\ntype = "kafka"\nsources = ["s"]\n',
         "source.s.type: expected postgres or kafka"),
        ("x.yml", "listener:\n  heartbeatInterval: soon\n", "not a Go duration"),
    ],
)  # fmt: skip
def test_a_file_it_cannot_convert_is_one_line_exit_2(
    tmp_path: Path, name: str, text: str, words: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    done = run_cli("config", "convert", str(path))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert words in done.stderr and str(path) in done.stderr


@pytest.mark.slow
def test_a_converted_wal_listener_configuration_streams(
    db: Database, nats_url: str, topic_prefix: str, tmp_path: Path
) -> None:
    """wal-listener's example, pointed at the test's servers, converted and run by
    `pg2sink --config` alone: a change of the filtered table arrives on wal-listener's
    subject; the action and the table the filter leaves out do not."""
    conn = db.connect()
    conn.execute("CREATE TABLE users (id int primary key, name text)")
    conn.execute("CREATE TABLE other (id int primary key)")
    seed = yaml.safe_load((FIXTURES / "wal-listener.yml").read_text())
    server = conninfo_to_dict(db.dsn)
    seed["database"].update(
        host=server["host"], port=int(str(server["port"])), name=db.name, user=server["user"]
    )
    seed["nats"].update(address=nats_url.removeprefix("nats://"), topicPrefix=topic_prefix)
    seed["listener"]["slotName"] = f"slot_{uuid.uuid4().hex[:8]}"
    (tmp_path / "config.yml").write_text(yaml.safe_dump(seed))
    config = tmp_path / "pg2sink.toml"
    config.write_text(convert(tmp_path / "config.yml"))
    # the file alone: no PG2SINK_SOURCE, _SLOT or _PUBLICATION
    p = Pg2Sink(["--config", str(config)], clean_env(), tmp_path).start()
    try:
        p.wait_streaming()
        conn.execute("INSERT INTO other VALUES (1)")
        conn.execute("INSERT INTO users VALUES (1, 'ada')")
        conn.execute("DELETE FROM users WHERE id = 1")  # the filter: insert and update
        conn.execute("UPDATE users SET name = 'x'")  # no row: nothing
        conn.execute("INSERT INTO users VALUES (2, 'bo')")
        got = wal_listener_consumer(nats_url, f"{topic_prefix}public_users", 2)
        assert [(m.value["action"], m.value["data"]) for m in got] == [
            ("INSERT", {"id": 1, "name": "ada"}),
            ("INSERT", {"id": 2, "name": "bo"}),
        ]
        assert {m.subject for m in stored(nats_url, topic_prefix)} == {
            f"{topic_prefix}public_users"
        }
        slot = f"{seed['listener']['slotName']}_{db.name}"
        wait_for(lambda: db.slot_confirmed_lsn(slot), 30, "the slot named as wal-listener did")
        assert p.stop() == 0
    finally:
        p.stop()
        asyncio.run(delete_stream(nats_url, topic_prefix))
