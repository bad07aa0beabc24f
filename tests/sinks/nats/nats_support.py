"""NATS helpers of the tests of several modules: what JetStream stored, read back as a
consumer would, streams deleted (they outlive a test), and a nats-server that takes
messages larger than its default 1 MB max_payload."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import nats
import nats.js.errors
import services
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from pg2sink.formats.jsonenc import loads
from tests.conftest import Pg2Sink
from tests.support import FAST, Proc


@dataclass
class Stored:
    """One message as JetStream stored it."""

    subject: str
    data: bytes
    headers: dict[str, str]

    @property
    def value(self) -> Any:
        return loads(self.data, exact_numbers=True)


async def _stored(url: str, stream: str, batch: int) -> list[Stored]:
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=5)
        total = (await js.stream_info(stream)).state.messages
        out: list[Stored] = []
        if not total:
            return out
        # an ephemeral pull consumer of the whole stream
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
        sub = await js.pull_subscribe(">", stream=stream, config=config)
        while len(out) < total:
            for m in await sub.fetch(min(batch, total - len(out)), timeout=30):
                out.append(Stored(m.subject, m.data, dict(m.headers or {})))
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


def stored(url: str, stream: str, batch: int = 1000) -> list[Stored]:
    """Every message of `stream`, in stream order, `batch` messages a request (fewer for
    large messages: a request's answer must arrive within its timeout)."""
    return asyncio.run(_stored(url, stream, batch))


async def delete_stream(url: str, stream: str) -> None:
    """Delete `stream` (streams outlive a test); a missing one is fine."""
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream(timeout=5).delete_stream(stream)
    finally:
        await nc.close()


class LargePayloadNats(services.NatsServer):
    """A nats-server whose max_payload is 8 MiB (the default, 1 MB, refuses a 2 MB row)."""

    def command(self) -> list[str]:
        conf = self.base / "max_payload.conf"
        conf.write_text("max_payload: 8388608\n")
        return [*super().command(), "--config", str(conf)]


def nats_args(url: str, prefix: str, *extra: str) -> list[str]:
    return ["--sink", "nats", "--nats-url", url, "--nats-subject-prefix", prefix, *FAST, *extra]


def start(proc: Proc, url: str, prefix: str, *extra: str) -> Pg2Sink:
    p = proc(*nats_args(url, prefix, *extra)).start()
    p.wait_streaming()
    return p
