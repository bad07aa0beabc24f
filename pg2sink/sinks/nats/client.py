"""The NATS connection, on an asyncio event loop of its own thread.

nats-py is asyncio; the stream is not. `Publisher` runs an event loop in a background
thread ("pg2sink-nats") holding one connection, and the sink hands it batches of
(subject, payload, message id) with `submit`, which never waits. The loop publishes each
message with a reply subject of its own, `<inbox>.<generation>.<serial>`, on which
JetStream answers with its PubAck once the message is stored (or with an error); one
subscription to `<inbox>.*.*` receives them all (no future, no timer per message). The
acknowledged count is the number of messages acknowledged with no gap before them
(acks come back in order; one that overtakes another waits in a set).

Generations: after a failure the sink starts over (PostgreSQL replays from the last
confirmed position) under a new generation; acks of the messages of an older one are
ignored when they come late, so they can never acknowledge a message of the replay.

Outages: a lost connection ends the generation at once, and is not reconnected by
nats-py (allow_reconnect off): its reconnect buffer would send, after reconnecting,
messages published after one the dead connection swallowed, and the replay would then
store that one after them, out of order. The next generation connects afresh (and
creates the stream again if the server lost it) before its first message, so a replay
always starts on a connection nothing older is queued on. The service's reconnect loop
paces the attempts and logs them once per change (subscription/reconnect.py).

What the sink reads from the loop's thread (`acked`, `failure`, `progress_at`) is
written whole by that thread (one tuple or float at a time), so a read sees either the
old or the new value.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig

from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.sinks.nats.config import NatsConfig, shown_url

log = logging.getLogger(__name__)

__all__ = ["Outgoing", "Publisher"]

#: One message: its subject, its payload and its Nats-Msg-Id (None: none).
Outgoing = tuple[str, bytes, str | None]

#: Longest wait for the first connection and the stream's creation, in seconds.
CONNECT_WAIT = 10.0
#: Longest wait for the connection to close at the end, in seconds.
CLOSE_WAIT = 5.0
#: The header JetStream de-duplicates by.
MSG_ID = "Nats-Msg-Id"
#: The status header of "no responders": no stream holds the subject.
_NO_RESPONDERS = "503"

T = TypeVar("T")


class Publisher:
    """One NATS connection on a loop thread; see the module docstring."""

    def __init__(self, cfg: NatsConfig) -> None:
        self.cfg = cfg
        self.url = shown_url(cfg.nats_url)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pg2sink-nats")
        self._thread.daemon = True  # a stuck server must not keep the process alive
        self._nc: Client | None = None
        self._inbox = ""
        # written by the loop thread, read by the sink's
        self.acked: tuple[int, int] = (0, 0)
        """(generation, messages acknowledged with no gap before them)."""
        self.failure: tuple[int, SinkError] | None = None
        """(generation, the error that ended it)."""
        self.progress_at = time.monotonic()
        """When the acknowledged count last grew, or messages started waiting for it."""
        # the loop thread's own
        self._generation = 0
        self._queue: deque[Outgoing] = deque()
        self._sent = 0
        self._early: set[int] = set()
        self._pump: asyncio.Task[None] | None = None
        self._closing = False
        #: the current connection's token: the disconnection of any other (one
        #: drop_connection() closed, one replaced since) is no news
        self._connection: object = None
        self._last_error = "no answer"

    # -- the sink's thread ----------------------------------------------------------

    def start(self) -> None:
        """Connect, and create the stream when it is missing; SinkError naming why not."""
        self._thread.start()
        self._call(self._connect(), CONNECT_WAIT, "connect")

    def submit(self, generation: int, batch: Sequence[Outgoing]) -> None:
        """Publish `batch` after everything submitted before (never waits)."""
        self._loop.call_soon_threadsafe(self._enqueue, generation, batch)

    def drop_connection(self) -> None:
        """Close the connection without ending the generation (it has ended: the sink
        gave up waiting for acknowledgements, which a half-dead connection never
        brings); the next generation connects again."""
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
        self._nc, self._connection = nc, connection
        self._inbox = f"{nc.new_inbox()}."
        await nc.subscribe(self._inbox + "*.*", cb=self._on_ack)
        log.info("connected to NATS at %s", self.url)
        await self._ensure_stream(nc)

    async def _new_client(self, disconnected: Callable[[], Awaitable[None]]) -> Client:
        cfg = self.cfg
        options: dict[str, Any] = {}
        if cfg.nats_creds:
            options["user_credentials"] = cfg.nats_creds
        if cfg.nats_user is not None:
            options.update(user=cfg.nats_user, password=cfg.nats_password or "")
        if cfg.nats_token is not None:
            options["token"] = cfg.nats_token
        if cfg.nats_tls_ca:
            options["tls"] = ssl.create_default_context(cafile=cfg.nats_tls_ca)
        # Two quick attempts per server (nats-py's defaults retry for a minute), and no
        # reconnecting by nats-py: see the module docstring.
        try:
            return await nats.connect(
                servers=[u.strip() for u in cfg.nats_url.split(",")],
                name="pg2sink",
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.2,
                connect_timeout=CONNECT_WAIT / 2,
                error_cb=self._on_error,
                disconnected_cb=disconnected,
                **options,
            )
        except nats.errors.NoServersError:
            # the reason is that of the last attempt (nats-py reported it to error_cb)
            raise SinkUnavailableError(
                f"cannot connect to NATS at {self.url}: {self._last_error}"
            ) from None

    async def _ensure_stream(self, nc: Client) -> None:
        """Create the stream covering `<prefix>.>` unless a stream of its name exists."""
        cfg = self.cfg
        js = nc.jetstream(timeout=CONNECT_WAIT / 2)
        try:
            info = await js.stream_info(cfg.stream)
        except nats.js.errors.NotFoundError:
            pass
        else:
            subjects = ", ".join(info.config.subjects or ())
            log.debug("JetStream stream %s holds %s", cfg.stream, subjects)
            return
        await js.add_stream(
            StreamConfig(
                name=cfg.stream,
                subjects=[f"{cfg.nats_subject_prefix}.>"],
                storage=StorageType.FILE,
                duplicate_window=cfg.nats_duplicate_window,
            )
        )
        log.info(
            "created JetStream stream %s for %s.> (duplicate window %gs)",
            cfg.stream,
            cfg.nats_subject_prefix,
            cfg.nats_duplicate_window,
        )

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
        nc = self._nc
        if nc is not None and not nc.is_closed:
            self._connection = None
            # close() marks the client closed at once, before this callback returns its
            # task's first step: the next generation's first batch then sees it closed
            self._loop.create_task(nc.close())

    # -- the loop's thread: publishing and acknowledgements --------------------------

    def _enqueue(self, generation: int, batch: Sequence[Outgoing]) -> None:
        if generation != self._generation:
            if generation < self._generation:
                return  # submitted before the restart of its generation
            self._restart(generation)
        if self.failure is not None and self.failure[0] == generation:
            return  # nothing is published after a failure
        if self._sent == self.acked[1] and not self._queue:
            self.progress_at = time.monotonic()  # waiting starts now
        self._queue.extend(batch)
        if self._pump is None or self._pump.done():
            self._pump = self._loop.create_task(self._publish_queue())

    def _restart(self, generation: int) -> None:
        """A new generation: forget the last one's messages (the replay sends them)."""
        self._generation = generation
        self._queue.clear()
        self._sent = 0
        self._early.clear()
        self.acked = (generation, 0)
        self.progress_at = time.monotonic()

    async def _publish_queue(self) -> None:
        generation = self._generation
        if self._nc is None or self._nc.is_closed:
            try:
                await self._connect()
            except Exception as e:
                if generation == self._generation:
                    self._fail(e if isinstance(e, SinkError) else self._unreachable(e))
                return
        nc = self._nc
        assert nc is not None
        queue = self._queue
        while queue:
            subject, payload, msg_id = queue.popleft()
            # the serial is taken before the await: a restart while nats-py waits (a full
            # flush queue) starts the next generation's serials at 0 all the same
            generation, serial = self._generation, self._sent
            self._sent += 1
            reply = f"{self._inbox}{generation}.{serial}"
            try:
                await nc.publish(subject, payload, reply, {MSG_ID: msg_id} if msg_id else None)
            except nats.errors.Error as e:
                if generation == self._generation:
                    self._fail(self._refused(e, subject, len(payload)))
                return

    def _unreachable(self, e: Exception) -> SinkUnavailableError:
        return SinkUnavailableError(f"cannot connect to NATS at {self.url}: {_reason(e)}")

    def _refused(self, e: nats.errors.Error, subject: str, size: int) -> SinkError:
        """The error of a message nats-py would not publish."""
        if isinstance(e, nats.errors.MaxPayloadError):
            assert self._nc is not None
            return SinkError(
                f"a message for {subject} ({size:,} bytes) is larger than the NATS server's "
                f"max_payload ({self._nc.max_payload:,}): raise max_payload in the server's "
                "configuration"
            )
        return SinkUnavailableError(f"cannot publish to NATS at {self.url}: {_reason(e)}")

    async def _on_ack(self, msg: Msg) -> None:
        """JetStream's answer to one message: its PubAck, an error, or "no responders"."""
        generation, _, serial = msg.subject[len(self._inbox) :].partition(".")
        if int(generation) != self._generation:
            return  # an answer to a message of a stream that restarted since
        data = msg.data
        if not data and msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            self._fail(
                SinkError(
                    f"no JetStream stream holds the subjects {self.cfg.nats_subject_prefix}.> "
                    f"(was stream {self.cfg.stream} deleted? pg2sink creates it when it starts)"
                )
            )
            return
        if b'"error"' in data:
            error = nats.js.errors.APIError.from_error(json.loads(data)["error"])
            self._fail(
                SinkError(f"JetStream refused a message: {error.description} ({error.err_code})")
            )
            return
        self._acknowledge(int(serial))

    def _acknowledge(self, serial: int) -> None:
        count = self.acked[1]
        if serial != count:
            self._early.add(serial)
            return
        count += 1
        early = self._early
        while count in early:
            early.remove(count)
            count += 1
        self.acked = (self._generation, count)
        self.progress_at = time.monotonic()

    def _fail(self, error: SinkError) -> None:
        """End this generation: nothing after the failure is published or acknowledged."""
        self._queue.clear()
        if self.failure is None or self.failure[0] != self._generation:
            self.failure = (self._generation, error)

    # -- the loop's thread: connection events ----------------------------------------

    async def _on_error(self, e: Exception) -> None:
        self._last_error = _reason(e)
        log.debug("NATS: %s", self._last_error)

    async def _on_disconnected(self, connection: object) -> None:
        """The connection is gone for good (nats-py does not reconnect): the generation
        ends, and the next one connects again."""
        if self._closing or connection is not self._connection:
            return
        log.warning(
            "lost the connection to NATS at %s (%s); what it has not acknowledged stays "
            "unconfirmed",
            self.url,
            self._last_error,
        )
        self._fail(
            SinkUnavailableError(
                f"lost the connection to NATS at {self.url}; resending from the last "
                "confirmed position (at-least-once)"
            )
        )


def _reason(e: BaseException) -> str:
    """One line for an exception of nats-py or of the network."""
    if isinstance(e, TimeoutError):
        return "no answer in time"
    text = " ".join(str(e).split()) or type(e).__name__
    return text.removeprefix("nats: ")
