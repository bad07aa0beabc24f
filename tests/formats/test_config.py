"""The shared --format option (formats/config.py): which format a sink gets, and whom
the messages name (the source's host and database, never its password)."""

from __future__ import annotations

import pytest

from pg2sink.errors import ConfigError
from pg2sink.formats.config import FormatConfig, choose, origin_of

MESSAGE = ("json", "pg-kinesis", "wal-listener", "psql-streamer", "debezium")


def test_the_sinks_default_is_the_first_it_takes() -> None:
    assert choose("kafka", ("avro", *MESSAGE), FormatConfig()) == "avro"
    assert choose("nats", MESSAGE, FormatConfig()) == "json"
    assert choose("kinesis", MESSAGE, FormatConfig("wal-listener")) == "wal-listener"
    assert choose("file", (), FormatConfig()) is None


@pytest.mark.parametrize(
    ("sink", "supported", "config", "message"),
    [
        ("nats", MESSAGE, FormatConfig("avro"), "--sink=nats does not take --format avro"),
        ("file", (), FormatConfig("json"), "--format is for --sink kafka, nats or kinesis"),
        ("kafka", ("avro", *MESSAGE), FormatConfig("json", True), "--debezium-schemas needs"),
        ("nats", MESSAGE, FormatConfig("debezium", debezium_avro=True), "--debezium-avro needs"),
        ("kafka", MESSAGE, FormatConfig("json", debezium_avro=True), "--debezium-avro needs"),
        ("kafka", MESSAGE, FormatConfig("debezium", True, True), "choose one"),
    ],
)
def test_refusals(
    sink: str, supported: tuple[str, ...], config: FormatConfig, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        choose(sink, supported, config)


def test_origin_from_the_dsn_or_libpq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGHOST", raising=False)
    monkeypatch.delenv("PGDATABASE", raising=False)
    assert origin_of("host=db1 dbname=app password=Hunter2") == ("db1", "app")
    assert origin_of("postgresql://u:Hunter2@h.example:5432/shop") == ("h.example", "shop")
    monkeypatch.setenv("PGHOST", "envhost")
    monkeypatch.setenv("PGDATABASE", "envdb")
    assert origin_of("") == ("envhost", "envdb")
    monkeypatch.delenv("PGDATABASE")
    assert origin_of("user=ann") == ("envhost", "ann")  # libpq: the database is the user's
    assert origin_of("not a dsn") == ("envhost", origin_of("")[1])  # the source reports it
