"""The publishing hot path's protocol bytes: HPUB frames written a batch at a time, and
JetStream's PubAck replies taken straight from nats-py's parser.

Why not nats-py's `publish` and a subscription callback: per message, `publish`
validates both subjects, builds the header block from a dict (a regex per key), formats
the HPUB line and may queue a flush; on the way back, each reply has its headers parsed,
becomes a `Msg`, goes through an asyncio.Queue to the subscription's task, and is awaited
in a callback: most of the sink's CPU per message (`make bench-stream ARGS="--sink
nats"`). Here the sink builds a message's header block once (`msg_id_header`),
the loop thread builds the frames of up to a chunk of messages into one write with one
bytes formatting each and no Python code per message (`frames`), and the replies of the
acknowledgement subscription go to plain functions (`AckClient`), not through nats-py's
parser: the successful PubAcks of a whole read by one regular expression (`AckParser`,
`ack_pattern`), the serials of a run of them handed over at once; any other reply one at
a time, by one regular expression each.

The frame, per the NATS protocol (https://docs.nats.io/reference/reference-protocols/nats-protocol#hpub):

    HPUB <subject> <reply> <header bytes> <total bytes>\\r\\n<headers><payload>\\r\\n

with the header block `NATS/1.0\\r\\nNats-Msg-Id: <id>\\r\\n\\r\\n` (or no header at all,
`NATS/1.0\\r\\n\\r\\n`). The subjects are pg2sink's own (subjects.py escapes names), so
they need no check here; the outbox's destinations are checked by the sink.

nats-py internals this relies on (nats-py 2.x; every test of the sink exercises them):
`Client._send_command(bytes)` (appends to the pending buffer, written in order with
nats-py's own commands), `Client._flush_pending()` (wakes its flusher),
`Client._process_msg(sid, subject, reply, data, headers)` (the parser's call for each
MSG and HMSG), `Client._ps` (its parser), `Subscription._id`, and the parser's `buf` and
`state`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from itertools import chain, repeat

from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.protocol.parser import AWAITING_CONTROL_LINE, Parser

__all__ = [
    "NO_HEADERS",
    "AckClient",
    "AckParser",
    "Outgoing",
    "ack_error",
    "ack_pattern",
    "frames",
    "msg_id_header",
]

#: One message: its subject, its payload and its header block (msg_id_header).
Outgoing = tuple[bytes, bytes, bytes]

#: The header block of a message without a Nats-Msg-Id.
NO_HEADERS = b"NATS/1.0\r\n\r\n"

#: A successful PubAck: {"stream":"<name>","seq":<n>[,"duplicate":true]} (the server's
#: JSON puts "error" first when there is one, and then no "stream").
_PUB_ACK = b'{"stream":'
#: The status line of "no responders": no stream holds the subject.
_NO_RESPONDERS = b"NATS/1.0 503"

#: What an acknowledgement subscription's messages go to: (subject, data, headers).
AckHandler = Callable[[bytes, bytes, bytes | None], None]
#: What a run of successful PubAcks goes to: (the reply subjects' start the pattern was
#: made for, the serials after it, in the order of the replies).
AcksHandler = Callable[[bytes, list[bytes]], None]

#: A reply without headers nor reply subject: `MSG <subject> <sid> <size>\r\n` (the
#: server writes two spaces before the size, where a reply subject would be).
_MSG = re.compile(rb"MSG ([^ \r\n]+) (\d+) +(\d+)\r\n")


def msg_id_header(msg_id: bytes) -> bytes:
    """The header block carrying `msg_id` as Nats-Msg-Id (JetStream's de-duplication)."""
    return b"NATS/1.0\r\nNats-Msg-Id: " + msg_id + b"\r\n\r\n"


def frames(
    subjects: Sequence[bytes],
    payloads: Sequence[bytes],
    headers: Sequence[bytes],
    header_sizes: Sequence[int],
    sizes: Sequence[int],
    reply: bytes,
    serial: int,
) -> bytes:
    """The HPUB frames of messages (the columns of a list of Outgoing; `header_sizes` the
    lengths of the header blocks, `sizes` those of header and payload) replied to at
    `<reply><serial>`, `<reply><serial + 1>`, ... in one piece.

    No Python code runs per message (a loop building each frame cost twice the
    instructions): map and zip drive one bytes formatting of each command line and
    header block, small enough for Python's allocator (with the payload, most frames
    were not), and the payloads are joined in between."""
    template = b"HPUB %s " + reply.replace(b"%", b"%%") + b"%d %d %d\r\n%s"
    numbers = range(serial, serial + len(subjects))
    lines = map(template.__mod__, zip(subjects, numbers, header_sizes, sizes, headers, strict=True))
    crlfs = repeat(b"\r\n", len(subjects))
    return b"".join(chain.from_iterable(zip(lines, payloads, crlfs, strict=True)))


def ack_pattern(reply: bytes, sid: int) -> re.Pattern[bytes]:
    """What AckParser finds a read's successful PubAcks with: the whole frame of one, a
    reply on subscription `sid` to `<reply><serial>` whose payload starts with
    `{"stream":` (ack_error's test), the serial captured; or else anything up to the
    next LF, the serial empty. Every byte of a read is in one match or the other, so a
    read whose matches all have a serial is nothing but successful PubAcks, back to back.

    The payload is read up to CR, not by its size: a PubAck, JSON, holds no raw CR or
    LF. Every byte costs the regular expression engine some 25 instructions, so the
    pattern checks nothing more (spelling out nats-server's `{"stream":"<name>",
    "seq":<n>}` cost 40% more)."""
    return re.compile(
        rb"MSG %s(\d+) %d +\d+\r\n\{\"stream\":[^\r]*\r\n" % (re.escape(reply), sid)
        + rb"|[^\n]*\n|[^\n]+"  # (findall: an empty serial)
    )


def ack_error(data: bytes, headers: bytes | None) -> str | None:
    """None for JetStream's PubAck; else why the message was not stored, in one line."""
    if data.startswith(_PUB_ACK):
        return None
    if not data and headers is not None and headers.startswith(_NO_RESPONDERS):
        return "no responders"
    try:
        error = json.loads(data)["error"]
        return f"{error['description']} ({error.get('err_code', error.get('code'))})"
    except (ValueError, KeyError, TypeError):
        return f"an answer that is not a PubAck: {data[:200]!r}"


class AckParser(Parser):
    """nats-py's parser, reading first the replies of the acknowledgement subscription
    at the head of what arrived: a read (up to its last complete frame) of nothing but
    successful PubAcks in one step (`AckClient.expect_acks`), else MSG frames one at a
    time (one cut at the end of a read waits for the next); then it leaves the rest to
    nats-py: any other frame, a reply with headers."""

    def __init__(self, nc: AckClient) -> None:
        super().__init__(nc)
        self._client = nc

    async def parse(self, data: bytes = b"") -> None:
        nc = self._client
        sid, handler = nc._ack_sid, nc._on_ack
        if self.state == AWAITING_CONTROL_LINE and handler is not None:
            buf = self.buf
            buf.extend(data)
            data = b""
            if nc._acks is not None:
                self._take_run(nc._acks)
            pos, size, match = 0, len(buf), _MSG.match
            cut = False
            while (m := match(buf, pos)) is not None and int(m[2]) == sid:
                start = m.end()
                end = start + int(m[3])
                if end + 2 > size:
                    cut = True  # its payload has not all arrived: read on
                    break
                handler(m[1], bytes(buf[start:end]), None)
                pos = end + 2  # past the payload's CRLF
            if pos:
                del buf[:pos]
            if cut:
                return  # the next read completes it (nats-py would then parse the rest)
        await super().parse(data)

    def _take_run(self, acks: tuple[bytes, re.Pattern[bytes], AcksHandler]) -> None:
        """Hand over the serials of the buffer up to its last `}\r\n` (a complete PubAck
        when it is one) if that is nothing but successful PubAcks (see ack_pattern)."""
        buf = self.buf
        end = buf.rfind(b"}\r\n") + 3
        if end < 3:
            return
        reply, pattern, handler = acks
        serials = pattern.findall(buf, 0, end)
        if serials and b"" not in serials:
            del buf[:end]
            handler(reply, serials)


class AckClient(Client):
    """A nats-py Client handing the messages of one subscription (`take_acks`) straight
    to a function, in the parser's order, instead of through a queue and a task."""

    _ack_sid: int | None = None
    _on_ack: AckHandler | None = None
    #: (reply subjects' start, its ack_pattern, the handler of a run of PubAcks)
    _acks: tuple[bytes, re.Pattern[bytes], AcksHandler] | None = None

    def __init__(self) -> None:
        super().__init__()
        self._ps = AckParser(self)

    def take_acks(self, subscription: Subscription, handler: AckHandler) -> None:
        """Send `subscription`'s messages to `handler` from now on."""
        self._ack_sid, self._on_ack = subscription._id, handler

    def expect_acks(self, reply: bytes, handler: AcksHandler) -> None:
        """Hand the serials of successful PubAcks to replies at `<reply><serial>` to
        `handler`, a read's run at once (take_acks first)."""
        assert self._ack_sid is not None
        self._acks = (reply, ack_pattern(reply, self._ack_sid), handler)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        if sid == self._ack_sid and self._on_ack is not None:
            # nats-py passes None for a message without headers (its annotation says bytes)
            self._on_ack(subject, data, headers or None)
        else:
            await super()._process_msg(sid, subject, reply, data, headers)
