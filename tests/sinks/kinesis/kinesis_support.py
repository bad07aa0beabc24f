"""Kinesis helpers of the tests of several modules: a boto3 client of kinesalite, streams
created and read back shard by shard as a consumer reads them, and pg2sink started on one."""

from __future__ import annotations

from typing import TYPE_CHECKING

import boto3
import services

from tests.conftest import Pg2Sink, wait_for
from tests.support import FAST, Proc

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

#: kinesalite's dummy credentials and region, for pg2sink's environment
AWS_ENV = services.KINESIS_CLIENT_ENV


def kinesis_client(endpoint: str) -> KinesisClient:
    env = services.KINESIS_CLIENT_ENV
    return boto3.client(
        "kinesis",
        endpoint_url=endpoint,
        region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


def create_stream(client: KinesisClient, name: str, shards: int) -> None:
    client.create_stream(StreamName=name, ShardCount=shards)

    def active() -> bool:
        summary = client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
        return summary["StreamStatus"] == "ACTIVE"

    wait_for(active, 10, f"stream {name} to be ACTIVE")


def read_stream(client: KinesisClient, name: str) -> list[tuple[str, str, bytes]]:
    """Every record of every shard, from the start: (shard, partition key, data), each
    shard's in its order."""
    out = []
    for shard in client.list_shards(StreamName=name)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=name, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while True:
            got = client.get_records(ShardIterator=iterator, Limit=10000)
            out += [(shard["ShardId"], r["PartitionKey"], r["Data"]) for r in got["Records"]]
            # a response holds at most 10 MB: MillisBehindLatest may say 0 (the records
            # were put within the same millisecond) while more follow; the shard is read
            # to its end when a response is empty and not behind
            if not got["Records"] and got.get("MillisBehindLatest", 0) == 0:
                break
            iterator = got["NextShardIterator"]
    return out


def kinesis_args(endpoint: str, stream: str, *extra: str) -> list[str]:
    return [
        "--sink",
        "kinesis",
        "--kinesis-stream",
        stream,
        "--kinesis-endpoint",
        endpoint,
        *FAST,
        *extra,
    ]


def start(proc: Proc, endpoint: str, stream: str, *extra: str) -> Pg2Sink:
    p = proc(*kinesis_args(endpoint, stream, *extra), env=dict(AWS_ENV)).start()
    p.wait_streaming()
    return p
