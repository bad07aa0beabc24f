"""The NATS connection, on an asyncio event loop of its own thread.

nats-py is asyncio; the stream is not. `Publisher` runs an event loop in a background
thread ("pg2sink-nats") holding one connection, and the sink hands it batches of
(subject, payload, header block) with `submit`, which never waits (it wakes the loop
only when the loop has not yet taken what was submitted before). The loop publishes
each message with a reply subject of its own, `<inbox>.<generation>.<serial>`, on which
JetStream answers with its PubAck once the message is stored (or with an error); one
subscription to `<inbox>.*.*` receives them all (no future, no timer per message), and
up to CHUNK messages go out in one write (wire.py: the frames, and the replies taken
from nats-py's parser). The acknowledged count is the number of messages acknowledged
with no gap before them (the delivery engine's Sent: the serials of a read's run of
successful PubAcks move it in one step; any other reply is read alone).

Generations: after a failure the sink starts over (PostgreSQL replays from the last
confirmed position) under a new generation; acks of the messages of an older one are
ignored when they come late, so they can never acknowledge a message of the replay.

Outages: nats-py does not reconnect by itself (allow_reconnect off): its reconnect
buffer would send, after reconnecting, messages published after one the dead connection
swallowed, so that one would be stored after them, out of order. Instead the loop keeps
every message it sent until JetStream acknowledges it; when the connection is lost it
connects again, waiting between attempts as pg2sink.retry says (up to RECONNECT_WAIT;
creating the stream again if the server lost it), then publishes again, in their order,
every message not yet acknowledged (with the same Nats-Msg-Id: JetStream drops the ones
it had stored), and goes on with the rest. Nothing is lost and the order holds, without
the stream stopping: it only stops confirming. One WARNING when the connection is lost,
one INFO when it is back, and the sink unhealthy in between (`outages`: the delivery
engine's Outages, which the sink reports to GET /status).

What the sink reads from the loop's thread (`acked`, `failure`, `progress_at`) is
written whole by that thread (one tuple or float at a time), so a read sees either the
old or the new value.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from operator import add
from typing import Any, TypeVar

import nats.errors
from nats.aio.client import Client

from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.retry import Backoff
from pg2sink.sinks.delivery import Outages, Sent
from pg2sink.sinks.nats.config import NatsConfig, shown_url
from pg2sink.sinks.nats.subjects import add_subject, covers, ensure_stream
from pg2sink.sinks.nats.wire import AckClient, Outgoing, ack_error, frames

log = logging.getLogger(__name__)

__all__ = ["Outgoing", "Publisher"]

#: Longest wait for the first connection and the stream's creation, in seconds.
CONNECT_WAIT = 10.0
#: Longest wait for the connection to close at the end, in seconds.
CLOSE_WAIT = 5.0
#: The first and the longest wait between attempts to connect again after the
#: connection was lost, in seconds (the server's return shows within RECONNECT_WAIT and
#: the time to connect).
FIRST_RECONNECT_WAIT = 0.1
RECONNECT_WAIT = 1.0
#: The share of each wait left to chance.
RECONNECT_JITTER = 0.2
#: Messages written to the connection in one piece at most.
CHUNK = 512

T = TypeVar("T")


def _not_eof_noise(record: logging.LogRecord) -> bool:
    """Drops asyncio's "returning true from eof_received() has no effect when using
    ssl": nats-py upgrades a plain connection to TLS (start_tls, after the server's
    INFO), so asyncio's stream protocol does not know it is over TLS and warns each
    time a TLS server closes the connection (a refused login: then the error line would
    not be the only one)."""
    return not record.getMessage().startswith("returning true from eof_received()")


logging.getLogger("asyncio").addFilter(_not_eof_noise)


class Publisher:
    """One NATS connection on a loop thread; see the module docstring."""

    def __init__(self, cfg: NatsConfig) -> None:
        self.cfg = cfg
        self.url = shown_url(cfg.nats_url)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pg2sink-nats")
        self._thread.daemon = True  # a stuck server must not keep the process alive
        self._nc: AckClient | None = None
        self._inbox = b""
        #: `<inbox>.<generation>.`: the start of this generation's reply subjects
        self._reply = b""
        # written by the loop thread, read by the sink's
        self.acked: tuple[int, int, int] = (0, 0, 0)
        """(generation, messages acknowledged with no gap before them, their bytes)."""
        self.failure: tuple[int, SinkError] | None = None
        """(generation, the error that ended it)."""
        self.progress_at = time.monotonic()
        """When the acknowledged count last grew, messages started waiting for it, or
        the connection came back."""
        self.outages = Outages(f"NATS at {self.url} is unreachable")
        """The connection's outages: logged once each way, the sink's health."""
        # the loop thread's own
        self._generation = 0
        #: the messages to publish, in order
        self._queue: list[Outgoing] = []
        #: what the sink's thread submitted and the loop has not taken yet, and whether
        #: the loop has been woken to take it
        self._submitted: deque[tuple[int, Sequence[Outgoing]]] = deque()
        self._woken = False
        self._sent: Sent[Outgoing] = Sent()
        self._pump: asyncio.Task[None] | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._closing = False
        #: the current connection's token: the disconnection of any other (one
        #: drop_connection() closed, one replaced since) is no news
        self._connection: object = None
        self._last_error = "no answer"
        #: the subjects the stream is created with: `PREFIX.>` and those `cover` added
        self._subjects = [f"{cfg.nats_subject_prefix.removesuffix('.')}.>"]
        #: the stream's subjects as last read or set (written whole by the loop thread)
        self.stream_subjects: tuple[str, ...] = ()

    @property
    def away_since(self) -> float | None:
        """When the connection was lost, while it is (None: connected)."""
        return self.outages.since

    # -- the sink's thread ----------------------------------------------------------

    def start(self) -> None:
        """Connect, and create the stream when it is missing; SinkError naming why not."""
        self._thread.start()
        self._call(self._connect(), CONNECT_WAIT, "connect")

    def submit(self, generation: int, batch: Sequence[Outgoing]) -> None:
        """Publish `batch` after everything submitted before (never waits)."""
        # A wake-up is a write to the loop's self-pipe (and a GIL hand-over): one per
        # batch was the cost of a checkpoint of each small transaction. The append comes
        # before the flag is read, and the loop clears the flag before it takes the
        # batches, so no batch is left behind.
        self._submitted.append((generation, batch))
        if not self._woken:
            self._woken = True
            self._loop.call_soon_threadsafe(self._take_submitted)

    def cover(self, subject: str) -> None:
        """Make sure the stream holds `subject`, adding it to the stream's subjects when
        none matches it (--format wal-listener's subjects outside `PREFIX.>`); SinkError
        naming why not, SinkUnavailableError while the server is away."""
        if covers(self.stream_subjects, subject):
            return
        what = f"add subject {subject} to stream {self.cfg.stream}"
        try:
            self._call(self._add_subject(subject), CONNECT_WAIT, what)
        except SinkError as e:
            if self.away_since is None:
                raise
            raise SinkUnavailableError(str(e)) from None

    def drop_connection(self) -> None:
        """Replace the connection, as if it had been lost (the sink waited too long for
        acknowledgements, which a half-dead connection never brings)."""
        self._loop.call_soon_threadsafe(self._drop)

    def stop(self) -> None:
        """Close the connection (what was not acknowledged is replayed after a restart)
        and end the loop's thread."""
        if self._thread.is_alive():
            try:
                self._call(self._close(), CLOSE_WAIT, "close the connection")
            except SinkError as e:
                log.warning("%s", e)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CLOSE_WAIT)
        if not self._thread.is_alive():
            self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float, what: str) -> T:
        """Run `coro` on the loop and wait for it; SinkError after `timeout` seconds."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except SinkError:
            raise
        except Exception as e:  # nats-py's, the network's: one line for the user
            if not future.done():  # our wait ended, not the coroutine
                future.cancel()
                raise SinkError(
                    f"cannot {what} to NATS at {self.url} within {timeout:.0f}s"
                ) from None
            raise SinkError(f"cannot {what} to NATS at {self.url}: {_reason(e)}") from None

    # -- the loop's thread: connection and stream ------------------------------------

    async def _connect(self) -> None:
        """A new connection, its acknowledgements' subscription, and the stream."""
        connection = object()

        async def disconnected() -> None:
            await self._on_disconnected(connection)

        nc = await self._new_client(disconnected)
        inbox = f"{nc.new_inbox()}.".encode()

        def on_ack(subject: bytes, data: bytes, headers: bytes | None) -> None:
            if inbox is self._inbox:  # else a late answer on a connection replaced since
                self._on_ack(subject, data, headers)

        try:
            nc.take_acks(await nc.subscribe(inbox.decode() + "*.*"), on_ack)
            await self._ensure_stream(nc)
        except BaseException:
            await nc.close()  # not ours yet: its closing is no news
            raise
        self._nc, self._connection, self._inbox = nc, connection, inbox
        self._set_reply()
        log.debug("connected to NATS at %s", self.url)

    def _set_reply(self) -> None:
        """The reply subjects' start of this connection and generation; their successful
        PubAcks are read a run at once (a late one of another connection or generation
        does not match it, and takes the exact path, which ignores it)."""
        self._reply = b"%s%d." % (self._inbox, self._generation)
        if self._nc is not None:
            self._nc.expect_acks(self._reply, self._on_acks)

    async def _new_client(self, disconnected: Callable[[], Awaitable[None]]) -> AckClient:
        cfg = self.cfg
        options: dict[str, Any] = {}
        if cfg.nats_creds:
            options["user_credentials"] = cfg.nats_creds
        if cfg.nats_user is not None:
            options.update(user=cfg.nats_user, password=cfg.nats_password or "")
        if cfg.nats_token is not None:
            options["token"] = cfg.nats_token
        if cfg.nats_tls_ca or cfg.nats_tls_cert:
            tls = ssl.create_default_context(cafile=cfg.nats_tls_ca)
            if cfg.nats_tls_cert:
                tls.load_cert_chain(cfg.nats_tls_cert, cfg.nats_tls_key)
            options["tls"] = tls
        # Two quick attempts per server (nats-py's defaults retry for a minute), and no
        # reconnecting by nats-py: see the module docstring.
        # (in the options: nats-py annotates these two int, and takes floats)
        options.update(reconnect_time_wait=0.2, connect_timeout=CONNECT_WAIT / 2)
        nc = AckClient()
        try:
            await nc.connect(
                servers=[u.strip() for u in cfg.nats_url.split(",")],
                name="pg2sink",
                allow_reconnect=False,
                max_reconnect_attempts=1,
                error_cb=self._on_error,
                disconnected_cb=disconnected,
                **options,
            )
        except nats.errors.NoServersError:
            # the reason is that of the last attempt (nats-py reported it to error_cb)
            raise SinkUnavailableError(
                f"cannot connect to NATS at {self.url}: {self._last_error}"
            ) from None
        return nc

    async def _ensure_stream(self, nc: Client) -> None:
        """Create the stream unless a stream of its name exists (subjects.py)."""
        js = nc.jetstream(timeout=CONNECT_WAIT / 2)
        self.stream_subjects = await ensure_stream(js, self.cfg, self._subjects)

    async def _add_subject(self, subject: str) -> None:
        """`cover` on the loop."""
        if self._nc is None or not self._nc.is_connected:
            raise SinkError(f"NATS at {self.url} is away: cannot add subject {subject}")
        js = self._nc.jetstream(timeout=CONNECT_WAIT / 2)
        self.stream_subjects = await add_subject(js, self.cfg.stream, subject)
        self._subjects.append(subject)

    async def _close(self) -> None:
        """Close the connection, then end every task left (nats-py's subscription
        readers), so that the loop stops with nothing pending."""
        self._closing = True
        if self._nc is not None:
            await self._nc.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _drop(self) -> None:
        """drop_connection(): the connection is lost, as far as publishing goes."""
        nc = self._nc
        if nc is not None and not nc.is_closed:
            self._lost(f"no acknowledgement for {self.cfg.nats_ack_timeout:g}s")
            self._connection = None  # its closing is no news
            self._loop.create_task(nc.close())

    # -- the loop's thread: publishing and acknowledgements --------------------------

    def _take_submitted(self) -> None:
        self._woken = False  # before taking: see submit()
        submitted = self._submitted
        while submitted:
            self._enqueue(*submitted.popleft())

    def _enqueue(self, generation: int, batch: Sequence[Outgoing]) -> None:
        if generation != self._generation:
            if generation < self._generation:
                return  # submitted before the restart of its generation
            self._restart(generation)
        if self.failure is not None and self.failure[0] == generation:
            return  # nothing is published after a failure
        if not self._sent.waiting() and not self._queue:
            self.progress_at = time.monotonic()  # waiting starts now
        self._queue += batch
        self._publish_soon()

    def _publish_soon(self) -> None:
        """Publish the queue, unless that is under way or the connection is away."""
        if self.away_since is None and (self._pump is None or self._pump.done()):
            self._pump = self._loop.create_task(self._publish_queue())

    def _restart(self, generation: int) -> None:
        """A new generation: forget the last one's messages (the replay sends them)."""
        self._generation = generation
        self._queue.clear()
        self._sent.clear()
        self._set_reply()
        self.acked = (generation, 0, 0)
        self.progress_at = time.monotonic()

    async def _publish_queue(self) -> None:
        queue = self._queue
        while queue and self.away_since is None:
            # the connection of the moment: one that replaced a lost one while this task
            # waited in nats-py goes on with the queue _reconnect rebuilt
            nc = self._nc
            assert nc is not None
            if nc.is_closed:
                return  # lost: _reconnect publishes the queue on the next connection
            # the serials are taken before the await: a restart while nats-py waits (a
            # full pending buffer) starts the next generation's serials at 0 all the same
            generation, serial, reply = self._generation, self._sent.sent, self._reply
            limit = nc.max_payload
            chunk = queue[:CHUNK]
            subjects, payloads, headers = zip(*chunk, strict=True)
            payload_sizes = list(map(len, payloads))
            header_sizes = list(map(len, headers))
            sizes = list(map(add, header_sizes, payload_sizes))
            too_large: Outgoing | None = None
            if max(sizes) > limit:  # the messages before the first too large go
                n = next(i for i, size in enumerate(sizes) if size > limit)
                too_large, chunk = chunk[n], chunk[:n]
                subjects, payloads, headers = subjects[:n], payloads[:n], headers[:n]
                payload_sizes, header_sizes, sizes = payload_sizes[:n], header_sizes[:n], sizes[:n]
            if chunk:
                del queue[: len(chunk)]
                self._sent.keep(chunk, payload_sizes)
                # one piece in nats-py's pending buffer, written in order with its own
                # commands; a lost connection leaves the messages in flight, which
                # _reconnect sends again in order
                piece = frames(subjects, payloads, headers, header_sizes, sizes, reply, serial)
                await nc._send_command(piece)
                await nc._flush_pending()
            if too_large is not None:
                if generation == self._generation:
                    self._fail(self._too_large(too_large, limit))
                return

    def _too_large(self, message: Outgoing, limit: int) -> SinkError:
        """The error of a message over the server's max_payload (which would end the
        connection)."""
        subject, payload, header = message
        return SinkError(
            f"a message for {subject.decode()} ({len(header) + len(payload):,} bytes with its "
            f"headers) is larger than the NATS server's max_payload ({limit:,}): raise "
            "max_payload in the server's configuration"
        )

    def _on_ack(self, subject: bytes, data: bytes, headers: bytes | None) -> None:
        """JetStream's answer to one message: its PubAck, an error, or "no responders"."""
        reply = self._reply
        if not subject.startswith(reply):
            return  # an answer to a message of a stream that restarted since
        error = ack_error(data, headers)
        if error is None:
            self._acknowledge(int(subject[len(reply) :]))
        elif error == "no responders":
            self._fail(
                SinkError(
                    f"no JetStream stream holds the subjects {self.cfg.nats_subject_prefix}.> "
                    f"(was stream {self.cfg.stream} deleted? pg2sink creates it when it starts)"
                )
            )
        else:
            self._fail(SinkError(f"JetStream refused a message: {error}"))

    def _on_acks(self, reply: bytes, serials: list[bytes]) -> None:
        """A read's run of successful PubAcks (wire.AckParser): the serials after `reply`."""
        if reply == self._reply and self._sent.acknowledge_run(serials):
            self._acknowledged()
        # (else of a connection or generation replaced since)

    def _acknowledge(self, serial: int) -> None:
        """One message's PubAck."""
        if self._sent.acknowledge(serial):
            self._acknowledged()

    def _acknowledged(self) -> None:
        """The acknowledged count moved: for the sink's thread."""
        self.acked = (self._generation, self._sent.count, self._sent.size)
        self.progress_at = time.monotonic()

    def _fail(self, error: SinkError) -> None:
        """End this generation: nothing after the failure is published or acknowledged."""
        self._queue.clear()
        if self.failure is None or self.failure[0] != self._generation:
            self.failure = (self._generation, error)

    # -- the loop's thread: outages --------------------------------------------------

    async def _on_error(self, e: Exception) -> None:
        self._last_error = _reason(e)
        log.debug("NATS: %s", self._last_error)

    async def _on_disconnected(self, connection: object) -> None:
        """nats-py lost the connection (and does not reconnect): see _lost."""
        if not self._closing and connection is self._connection:
            self._lost(self._last_error)

    def _lost(self, reason: str) -> None:
        """Stop publishing, and connect again until the server answers (_reconnect)."""
        if not self.outages.trouble(reason):
            return  # lost already
        log.warning(
            "lost the connection to NATS at %s (%s); reconnecting, what it has not "
            "acknowledged stays unconfirmed and is sent again",
            self.url,
            reason,
        )
        self._reconnecting = self._loop.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        """Connect until it works (with backoff), then send again, in order, what was
        not acknowledged, and the rest."""
        backoff = Backoff(FIRST_RECONNECT_WAIT, RECONNECT_WAIT, jitter=RECONNECT_JITTER)
        while True:
            try:
                await self._connect()
                break
            except Exception as e:  # nats-py's, the network's: wait and try again
                log.debug("NATS at %s: %s", self.url, _reason(e))
                self.outages.trouble(_reason(e))
                await asyncio.sleep(backoff.failed())
        unacknowledged = self._sent.resend()
        resent = len(unacknowledged)
        # same serials, same order: the acknowledged count goes on where it stopped
        self._queue[:0] = unacknowledged
        away, _ = self.outages.recovered() or (0.0, 0)
        self.progress_at = time.monotonic()
        log.info(
            "NATS at %s reachable again after %.1fs; publishing the %d messages waiting "
            "(%d of them sent before and not acknowledged)",
            self.url,
            away,
            len(self._queue),
            resent,
        )
        self._publish_soon()


def _reason(e: BaseException) -> str:
    """One line for an exception of nats-py or of the network."""
    if isinstance(e, TimeoutError):
        return "no answer in time"
    text = " ".join(str(e).split()) or type(e).__name__
    return text.removeprefix("nats: ")
