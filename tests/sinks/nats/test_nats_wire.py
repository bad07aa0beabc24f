"""The NATS sink's hot path without a server: the HPUB frames of a write, and a read's
replies taken a run of successful PubAcks at once or one at a time (wire.py), counted
by the Publisher as the server's replies would be (client.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from pg2sink.sinks.nats.client import Publisher
from pg2sink.sinks.nats.config import NatsConfig
from pg2sink.sinks.nats.wire import AckClient, Outgoing, frames

SID = 7
SIZES = [1, 10, 100, 1000, 10000]


def test_frames_are_the_protocols_hpub() -> None:
    header = b"NATS/1.0\r\nNats-Msg-Id: 1:a\r\n\r\n"
    large = b"x" * 10_000
    for payload, size in ((b"[1]", b"15"), (large, b"10012")):
        columns = ([b"p.a", b"p.b"], [b"{}", payload], [header, b"NATS/1.0\r\n\r\n"])
        header_sizes = [len(h) for h in columns[2]]
        sizes = [h + len(p) for h, p in zip(header_sizes, columns[1], strict=True)]
        got = frames(*columns, header_sizes, sizes, b"_I.%1.", 5)
        assert got == (
            b"HPUB p.a _I.%1.5 30 32\r\n" + header + b"{}\r\n"
            b"HPUB p.b _I.%1.6 12 " + size + b"\r\nNATS/1.0\r\n\r\n" + payload + b"\r\n"
        )


def pub_ack(subject: bytes, seq: int, extra: bytes = b"", stream: bytes = b"S") -> bytes:
    """The MSG frame of JetStream's PubAck to `subject`, as nats-server 2.9 writes it."""
    data = b'{"stream":"%s", "seq":%d%s}' % (stream, seq, extra)
    return b"MSG %s %d  %d\r\n%s\r\n" % (subject, SID, len(data), data)


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    """A Publisher (never connected) of generation 2 on the inbox `_I.`, its
    acknowledgement subscription's replies read by an AckClient, with SIZES sent."""
    publisher = Publisher(NatsConfig(nats_subject_prefix="S"))
    client = AckClient()
    client._ack_sid = SID
    client._on_ack = publisher._on_ack
    publisher._nc, publisher._inbox = client, b"_I."
    publisher._restart(2)
    messages: list[Outgoing] = [(b"S.t", b"x" * n, b"") for n in SIZES]
    publisher._sent.keep(messages[:2], SIZES[:2])  # two writes
    publisher._sent.keep(messages[2:], SIZES[2:])
    yield publisher
    publisher.stop()


def read(publisher: Publisher, *parts: bytes) -> None:
    """The replies arriving in `parts`, one read each."""
    assert publisher._nc is not None
    for part in parts:
        asyncio.run(publisher._nc._ps.parse(part))


def test_a_run_of_pub_acks_is_counted_at_once_wherever_reads_cut_it(
    publisher: Publisher,
) -> None:
    replies = b"".join(pub_ack(b"_I.2.%d" % i, 40 + i) for i in range(4))
    replies += pub_ack(b"_I.2.4", 40, b',"duplicate": true')  # a repeat stored before
    runs: list[list[bytes]] = []
    on_acks = publisher._on_acks

    def seen(reply: bytes, serials: list[bytes]) -> None:
        runs.append(serials)
        on_acks(reply, serials)

    for cut in range(len(replies) + 1):
        publisher._restart(2)
        publisher._sent.keep([(b"S.t", b"x" * n, b"") for n in SIZES], SIZES)
        runs.clear()
        publisher._nc.expect_acks(publisher._reply, seen)  # type: ignore[union-attr]
        read(publisher, replies[:cut], replies[cut:])
        assert publisher.acked == (2, 5, 11111), cut
        assert [s for run in runs for s in run] == [b"0", b"1", b"2", b"3", b"4"], cut
        assert publisher._sent.resend() == []


def test_an_error_among_pub_acks_fails_the_generation_after_the_acks_before_it(
    publisher: Publisher,
) -> None:
    refused = b'{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}'
    replies = (
        pub_ack(b"_I.2.0", 1)
        + pub_ack(b"_I.2.1", 2)
        + b"MSG _I.2.2 %d  %d\r\n%s\r\n" % (SID, len(refused), refused)
        + pub_ack(b"_I.2.3", 3)
    )
    read(publisher, replies)
    assert publisher.acked == (2, 2, 11)  # 3 waits behind 2 for ever
    assert publisher.failure is not None and publisher.failure[0] == 2
    assert "maximum messages exceeded (10077)" in str(publisher.failure[1])


def test_no_responders_in_a_read_of_pub_acks_fails_the_generation(
    publisher: Publisher,
) -> None:
    no_responders = b"HMSG _I.2.1 %d 16 16\r\nNATS/1.0 503\r\n\r\n\r\n" % SID
    read(publisher, pub_ack(b"_I.2.0", 1) + no_responders + pub_ack(b"_I.2.2", 2))
    assert publisher.acked == (2, 1, 1)
    assert publisher.failure is not None
    assert "no JetStream stream holds the subjects S.>" in str(publisher.failure[1])


def test_pub_acks_out_of_order_or_of_another_generation_count_without_gaps(
    publisher: Publisher,
) -> None:
    read(publisher, pub_ack(b"_I.2.1", 2) + pub_ack(b"_I.2.2", 3))
    assert publisher.acked == (2, 0, 0)  # 0 is missing: 1 and 2 wait
    read(publisher, pub_ack(b"_I.1.0", 1) + pub_ack(b"_I.2.1", 2))  # an older generation's
    assert publisher.acked == (2, 0, 0)
    read(publisher, pub_ack(b"_I.2.0", 1) + pub_ack(b"_I.2.3", 4))
    assert publisher.acked == (2, 4, 1111)
    read(publisher, pub_ack(b"_I.2.0", 1) + pub_ack(b"_I.2.9", 9))  # a repeat, one never sent
    assert publisher.acked == (2, 4, 1111) and publisher._sent._early == set()
    assert publisher._sent.resend() == [(b"S.t", b"x" * 10000, b"")]


def test_pub_acks_of_any_stream_or_shape_count(publisher: Publisher) -> None:
    """Successful PubAcks start with {"stream": (ack_error's test), whatever follows."""
    read(
        publisher,
        pub_ack(b"_I.2.0", 1, stream=b"other")
        + pub_ack(b"_I.2.1", 2, b', "domain":"hub"')
        + b'MSG _I.2.2 7  23\r\n{"stream":"S","seq":3}\r\n',
    )
    assert publisher.acked == (2, 3, 111) and publisher.failure is None


def test_a_read_with_anything_but_pub_acks_is_read_one_reply_at_a_time(
    publisher: Publisher,
) -> None:
    runs: list[list[bytes]] = []
    publisher._nc.expect_acks(publisher._reply, lambda _, serials: runs.append(serials))  # type: ignore[union-attr]
    for other in (
        pub_ack(b"_I.2.1", 2).replace(b" 7 ", b" 8 "),  # another subscription's
        b"+OK\r\n",
        pub_ack(b"_I.1.1", 2),  # an older generation's
    ):
        read(publisher, other + pub_ack(b"_I.2.0", 1))
        assert runs == [], other
    assert publisher.acked == (2, 1, 1)  # the exact path counted the current one
