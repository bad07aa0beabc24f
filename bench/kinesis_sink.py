"""The Kinesis sink against a Kinesis API server: cost per record, and records a second.

Writes `--records` INSERT Modifications of bench-stream's row shape to a new stream of
`--shards` shards through KinesisSink (a checkpoint and a start_flush every 1,000, as
the stream's flush interval would), then flushes until every one is stored, and prints:

- the record's Entry (payload.py: partition key and JSON line), in microseconds;
- `write()`, in microseconds a record on the stream's thread (the queue's lock and the
  sending thread's share of the GIL included);
- records stored a second, from the first write to the last acknowledgement.

The server is KINESIS_ENDPOINT (`make services`; kinesalite signs with any credentials,
services.KINESIS_CLIENT_ENV): its own pace bounds the last figure, not pg2sink's.

    set -a; . .services/env; set +a
    .venv/bin/python bench/kinesis_sink.py [--records 50000] [--shards 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import boto3

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import services  # noqa: E402

from pg2sink.changelog.records import Modification, Operation, Schema  # noqa: E402
from pg2sink.sinks.kinesis.config import KinesisConfig  # noqa: E402
from pg2sink.sinks.kinesis.payload import Payload  # noqa: E402
from pg2sink.sinks.kinesis.sink import KinesisSink  # noqa: E402

#: The last checkpoint: everything written is below it.
END = 10**12


def changes(n: int) -> tuple[Schema, list[Modification]]:
    """A keyed table's Schema record and n INSERTs of bench-stream's row shape."""
    t = datetime.now(UTC)
    schema = Schema(t, 1, "public", "t", {"pg.primary_key": ["id"]}, primary_key=("id",))
    row = {"name": "name", "amount": "12.50", "at": "2024-05-06T07:08:09Z", "flag": True}
    records = [
        Modification(t, i, 100 + i, 7, Operation.INSERT, "public", "t", None, {"id": i, **row})
        for i in range(n)
    ]
    return schema, records


def create_stream(endpoint: str, shards: int) -> str:
    """A new ACTIVE stream; its name."""
    name = f"bench-{uuid.uuid4().hex[:8]}"
    client = boto3.client("kinesis", endpoint_url=endpoint)
    client.create_stream(StreamName=name, ShardCount=shards)
    while True:
        summary = client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
        if summary["StreamStatus"] == "ACTIVE":
            return name
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args()
    endpoint = os.environ.get("KINESIS_ENDPOINT")
    if not endpoint:
        sys.exit("KINESIS_ENDPOINT is not set: run `make services` and source .services/env")
    for key, value in services.KINESIS_CLIENT_ENV.items():
        os.environ.setdefault(key, value)
    schema, records = changes(args.records)

    payload = Payload()
    payload.learn(schema)
    t0 = time.perf_counter()
    for r in records:
        payload.entry(r)
    entry_us = (time.perf_counter() - t0) / len(records) * 1e6

    name = create_stream(endpoint, args.shards)
    sink = KinesisSink(KinesisConfig(name, kinesis_endpoint=endpoint))
    sink.open()
    try:
        t0 = time.perf_counter()
        sink.write(schema)
        for i, r in enumerate(records):
            sink.write(r)
            if i % 1000 == 999:
                sink.checkpoint(100 + i + 1)
                sink.start_flush()
        write_us = (time.perf_counter() - t0) / len(records) * 1e6
        sink.checkpoint(END)
        while sink.flush() != END:
            pass
        elapsed = time.perf_counter() - t0
    finally:
        sink.close()
        boto3.client("kinesis", endpoint_url=endpoint).delete_stream(StreamName=name)
    print(f"entry (key + JSON)  {entry_us:6.2f} us/record")
    print(f"write()             {write_us:6.2f} us/record")
    print(f"stored              {len(records) / elapsed:8.0f} records/s ({elapsed:.2f}s)")


if __name__ == "__main__":
    main()
