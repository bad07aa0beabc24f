"""scripts/services.py starts a real Kafka broker, a real schema registry,
nats-server with JetStream and kinesalite (the Kinesis API), and PostgreSQL
of each supported major.

The slow tests start Kafka and the registry (jars fetched from Maven Central
into a cache on the first run) in a temporary directory, talk to the
registry's Confluent-compatible API with the standard library and round-trip
a message through the broker with confluent_kafka. The NATS and Kinesis tests
take a second or two: they use the session's servers (tests/conftest.py:
`nats_url`, `kinesis_endpoint`) with the clients the sinks use, nats-py and
boto3, and start both through the script's CLI to see them survive a restart.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import confluent_kafka as ck
import nats
import psycopg
import pytest
import services
from botocore.exceptions import ClientError

from tests.conftest import start_postgres, wait_for
from tests.sinks.kinesis.kinesis_support import kinesis_client

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def test_kafka_config_is_a_single_kraft_node() -> None:
    kafka = services.Kafka(base=Path("/nonexistent"), port=19092, controller_port=19093)
    config = kafka.config()
    assert config["process.roles"] == "broker,controller"
    assert config["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert config["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert config["offsets.topic.replication.factor"] == "1"
    assert config["transaction.state.log.min.isr"] == "1"
    assert kafka.env() == {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:19092"}


def test_free_ports_are_distinct() -> None:
    ports = services.free_ports(5)
    assert len(set(ports)) == 5


def _request(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": CONTENT_TYPE})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        return json.loads(r.read())


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[services.Kafka, services.SchemaRegistry]]:
    base = Path(tempfile.mkdtemp(prefix="pg2sink-services-"))
    kafka_port, controller_port, registry_port = services.free_ports(3)
    kafka = services.Kafka(base=base / "kafka", port=kafka_port, controller_port=controller_port)
    registry = services.SchemaRegistry(base=base / "registry", port=registry_port)
    try:
        kafka.start()
        registry.start()
        yield kafka, registry
    finally:
        registry.stop()
        kafka.stop()
        assert not kafka.running() and not registry.running()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_registry_registers_avro_schema(
    stack: tuple[services.Kafka, services.SchemaRegistry],
) -> None:
    _, registry = stack
    assert registry.url.endswith("/apis/ccompat/v7")
    schema = json.dumps({"type": "string"})
    got = _request(f"{registry.url}/subjects/t-value/versions", {"schema": schema})
    assert isinstance(got["id"], int)
    assert json.loads(_request(f"{registry.url}/schemas/ids/{got['id']}")["schema"]) == {
        "type": "string"
    }
    assert "t-value" in _request(f"{registry.url}/subjects")


@pytest.mark.slow
def test_kafka_round_trip(stack: tuple[services.Kafka, services.SchemaRegistry]) -> None:
    kafka, _ = stack
    topic = f"t-{uuid.uuid4().hex[:8]}"
    producer = ck.Producer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.produce(topic, key=b"k", value=b"hello")
    assert producer.flush(30) == 0
    consumer = ck.Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        msg = None
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None, msg and msg.error()
        assert (msg.key(), msg.value()) == (b"k", b"hello")
    finally:
        consumer.close()


@pytest.mark.slow
def test_cli_start_is_idempotent_and_stop_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "state"
    try:
        assert services.main(["start", "kafka", "registry", "--dir", str(directory)]) == 0
        env = services.read_env(directory / "env")
        assert env["KAFKA_BOOTSTRAP_SERVERS"].startswith("127.0.0.1:")
        assert env["SCHEMA_REGISTRY_URL"].endswith("/apis/ccompat/v7")
        assert "PGHOST" not in env
        assert services.main(["start", "kafka", "registry", "--dir", str(directory)]) == 0
        out = capsys.readouterr().out
        assert "kafka: already running" in out and "registry: already running" in out
    finally:
        assert services.main(["stop", "--dir", str(directory)]) == 0
    for name in ("kafka", "registry"):
        svc = services.service_in(directory, name)
        assert not svc.running(), name


# --- NATS with JetStream ----------------------------------------------------------------


def test_nats_command_runs_jetstream_on_loopback() -> None:
    server = services.NatsServer(base=Path("/srv/x/nats"), port=14222)
    cmd = server.command()
    assert "--jetstream" in cmd
    assert cmd[cmd.index("--store_dir") + 1] == "/srv/x/nats/data"
    assert cmd[cmd.index("--addr") + 1] == "127.0.0.1"
    assert server.env() == {"NATS_URL": "nats://127.0.0.1:14222"}


async def _publish_twice(url: str, stream: str) -> tuple[list[tuple[str, int, bool]], bytes]:
    """Create `stream`, publish one message twice with the same Nats-Msg-Id; the acks
    (stream, sequence, duplicate) and the stream's first message. Deletes the stream."""
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=5)
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        try:
            acks = []
            for _ in range(2):
                ack = await js.publish(
                    f"{stream}.public.t", b"hello", headers={"Nats-Msg-Id": "0/1:1"}
                )
                acks.append((ack.stream, ack.seq, bool(ack.duplicate)))
            stored = await js.get_msg(stream, 1)
            assert stored.data is not None
            return acks, stored.data
        finally:
            await js.delete_stream(stream)
    finally:
        await nc.close()


def test_nats_jetstream_acks_and_deduplicates(nats_url: str, topic_prefix: str) -> None:
    acks, data = asyncio.run(_publish_twice(nats_url, topic_prefix))
    # the second publish is acknowledged as a duplicate of the first, not stored again
    assert acks == [(topic_prefix, 1, False), (topic_prefix, 1, True)]
    assert data == b"hello"


# --- kinesalite -------------------------------------------------------------------------


def create_active_stream(client: KinesisClient, name: str) -> str:
    """Create a one-shard stream, wait until it is ACTIVE; its shard id."""
    client.create_stream(StreamName=name, ShardCount=1)

    def active() -> bool:
        summary = client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
        return summary["StreamStatus"] == "ACTIVE"

    wait_for(active, 10, f"stream {name} to be ACTIVE")
    return client.list_shards(StreamName=name)["Shards"][0]["ShardId"]


def read_shard(client: KinesisClient, name: str, shard: str) -> list[tuple[str, bytes]]:
    """Every record of the shard from its start: (partition key, data)."""
    iterator = client.get_shard_iterator(
        StreamName=name, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records = client.get_records(ShardIterator=iterator)["Records"]
    return [(r["PartitionKey"], r["Data"]) for r in records]


def test_kinesalite_puts_and_gets_records(kinesis_endpoint: str, topic_prefix: str) -> None:
    client = kinesis_client(kinesis_endpoint)
    shard = create_active_stream(client, topic_prefix)
    try:
        sent = [("k1", b"a"), ("k2", b"b"), ("k1", b"c")]
        res = client.put_records(
            StreamName=topic_prefix, Records=[{"PartitionKey": k, "Data": d} for k, d in sent]
        )
        assert res["FailedRecordCount"] == 0
        assert [r["ShardId"] for r in res["Records"]] == [shard] * 3
        assert read_shard(client, topic_prefix, shard) == sent
        # PutRecords' limit of 500 records a call holds here as on AWS
        with pytest.raises(ClientError) as err:
            client.put_records(
                StreamName=topic_prefix, Records=[{"PartitionKey": "k", "Data": b"x"}] * 501
            )
        assert err.value.response["Error"]["Code"] == "ValidationException"
    finally:
        client.delete_stream(StreamName=topic_prefix)


# --- both through the CLI, across a restart ---------------------------------------------


async def _stream_messages(url: str, stream: str, publish: bool) -> int:
    """Messages in `stream` (created, and one message published, when `publish`)."""
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=5)
        if publish:
            await js.add_stream(name=stream, subjects=[f"{stream}.>"])
            await js.publish(f"{stream}.x", b"kept")
        info = await js.stream_info(stream)
        return info.state.messages
    finally:
        await nc.close()


def test_cli_starts_nats_and_kinesis_and_their_data_survives_a_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "state"
    names = ["nats", "kinesis"]
    try:
        assert services.main(["start", *names, "--dir", str(directory)]) == 0
        env = services.read_env(directory / "env")
        assert env["NATS_URL"].startswith("nats://127.0.0.1:")
        assert env["KINESIS_ENDPOINT"].startswith("http://127.0.0.1:")
        assert asyncio.run(_stream_messages(env["NATS_URL"], "kept", publish=True)) == 1
        client = kinesis_client(env["KINESIS_ENDPOINT"])
        shard = create_active_stream(client, "kept")
        client.put_record(StreamName="kept", PartitionKey="k", Data=b"kept")

        assert services.main(["stop", *names, "--dir", str(directory)]) == 0
        assert not any(services.service_in(directory, n).running() for n in names)
        capsys.readouterr()
        assert services.main(["start", *names, "--dir", str(directory)]) == 0
        assert services.read_env(directory / "env") == env  # the same ports again
        out = capsys.readouterr().out
        assert "nats: started" in out and "kinesis: started" in out

        assert asyncio.run(_stream_messages(env["NATS_URL"], "kept", publish=False)) == 1
        assert read_shard(kinesis_client(env["KINESIS_ENDPOINT"]), "kept", shard) == [
            ("k", b"kept")
        ]
    finally:
        assert services.main(["stop", "--dir", str(directory)]) == 0
    assert not any(services.service_in(directory, n).running() for n in names)


# --- PostgreSQL of every supported major ------------------------------------------------


@pytest.mark.parametrize("version", services.POSTGRES_VERSIONS)
def test_postgres_major_decodes_for_debian_clients(version: int) -> None:
    """Each major (15 Debian's, the others npm builds) runs initdb, starts, creates a
    pgoutput slot, and Debian's psql and pg_recvlogical 15 read from it."""
    with start_postgres(version) as server:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            assert conn.info.server_version // 10000 == version
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            conn.execute("CREATE PUBLICATION p FOR TABLE t")
            conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
            conn.execute("INSERT INTO t VALUES (1, 'seen by pg_recvlogical')")
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
        psql = subprocess.run(
            ["psql", "-XAt", "-d", server.dsn(), "-c", "SHOW server_version_num"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert int(psql.stdout) // 10000 == version
        options = ["-o", "proto_version=1", "-o", "publication_names=p", "-E", row[0]]
        recv = subprocess.run(
            ["pg_recvlogical", "-d", server.dsn(), "-S", "s", "--start", "-f", "-", *options],
            capture_output=True,
            timeout=60,
            check=True,
        )
        assert b"seen by pg_recvlogical" in recv.stdout


def test_postgres_refuses_a_data_directory_of_another_major(tmp_path: Path) -> None:
    server = services.Postgres(base=tmp_path / "pg", port=services.free_port(), version=16)
    server.data.mkdir(parents=True)
    (server.data / "PG_VERSION").write_text("15\n")
    with pytest.raises(services.ServiceError, match="holds a PostgreSQL 15 cluster, not 16"):
        server.start()


def test_cli_starts_the_major_pg_version_names(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="pg2sink-services-"))
    directory.chmod(0o755)  # the server may run as the postgres user
    try:
        monkeypatch.setenv("PG_VERSION", "17")
        assert services.main(["start", "postgres", "--dir", str(directory)]) == 0
        assert "postgres 17: started on" in capsys.readouterr().out
        env = services.read_env(directory / "env")
        with psycopg.connect(
            host=env["PGHOST"], port=env["PGPORT"], user=env["PGUSER"], dbname=env["PGDATABASE"]
        ) as conn:
            assert conn.info.server_version // 10000 == 17
        # one postgres service at a time: .services/env has one PGPORT
        monkeypatch.setenv("PG_VERSION", "15")
        assert services.main(["start", "postgres", "--dir", str(directory)]) == 1
        assert "PostgreSQL 17 runs from" in capsys.readouterr().err
    finally:
        assert services.main(["stop", "postgres", "--dir", str(directory)]) == 0
    assert not (directory / "postgres17" / "data" / "postmaster.pid").exists()
    shutil.rmtree(directory, ignore_errors=True)


def test_standby_from_a_base_backup_by_the_wheels_pg_basebackup() -> None:
    """The npm builds have no pg_basebackup and Debian's 15 refuses newer servers:
    PyPI's PostgreSQL 18 clients copy a 16 primary, and start_postgres starts the copy
    as a hot standby that replays what the primary commits, and is promoted."""
    pg_basebackup = services.postgres_client_bindir() / "pg_basebackup"
    with start_postgres(16) as primary:
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        scratch = Path(tempfile.mkdtemp(prefix="pg2sink-backup-"))
        try:
            backup = scratch / "data"
            cmd = [str(pg_basebackup), "-d", primary.dsn(), "-D", str(backup)]
            subprocess.run([*cmd, "-X", "stream", "-c", "fast"], capture_output=True, check=True)
            # not -R: 18's pg_basebackup writes a primary_conninfo with options (e.g.
            # sslnegotiation) that an older server's libpq refuses
            (backup / "standby.signal").touch()
            with start_postgres(16, data=backup, primary_conninfo=primary.dsn()) as standby:
                with psycopg.connect(primary.dsn(), autocommit=True) as conn:
                    conn.execute("INSERT INTO t VALUES (1)")
                with psycopg.connect(standby.dsn(), autocommit=True) as conn:
                    assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
                    wait_for(
                        lambda: conn.execute("SELECT count(*) FROM t").fetchone() == (1,),
                        what="the standby to replay the primary's insert",
                    )
                primary.stop()
                standby.promote()
                with psycopg.connect(standby.dsn(), autocommit=True) as conn:
                    assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
                    conn.execute("INSERT INTO t VALUES (2)")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def test_cli_refuses_a_major_out_of_support(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("PG_VERSION", "13")
    with pytest.raises(SystemExit) as exit_info:
        services.main(["start", "postgres", "--dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "PG_VERSION: postgres: version '13' is not one of 14, 15, 16, 17, 18" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "postgres").exists()
