"""The replication loop: bytes in, records out, confirmed LSNs back.

Per CopyData message: XLogData is decoded and handed to a `ChangeHandler`
(the changelog builder feeding a sink, or the --decode-only printer);
keepalives are noted and answered. Between messages the loop does its
housekeeping on deadlines: flush the sink and confirm what it acknowledged,
send a standby status at least every heartbeat interval, reconcile the
publication every poll interval.

The confirmed (flush) LSN only ever comes from the sink's acknowledgement
of a checkpoint, and a checkpoint is only taken at a transaction boundary:
the end LSN of a Commit, or a keepalive's position while no transaction is
open (so commits that publish nothing still advance the slot and an idle
slot does not hold WAL).

With --wal-retain (`Retention`), the LSN confirmed to the server stays that long behind
what the sink acknowledged, measured by the server's clock: a checkpoint is confirmed
only once a checkpoint acknowledged after it is that much younger (commit times, and
keepalives' send times while idle). PostgreSQL keeps the WAL after the confirmed LSN, so
`pg2sink replay` can send the changes of that window again (docs/replay.md).

The loop does no I/O of its own: it reads frames from a `FrameSource` (the
replication connection, ReplicationStream) and tells the time by a `Clock`,
so tests drive it with a scripted source on a fake clock
(tests/subscription/test_loop.py).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import NoReturn, Protocol

from pg2sink.logical.copydata import (
    XLOG_DATA_HEADER,
    CopyDataTag,
    PrimaryKeepalive,
    parse_copy_data,
    standby_status_update,
)
from pg2sink.logical.decoder import MessageTag
from pg2sink.logical.lsn import format_lsn, now_pg_timestamp
from pg2sink.observability.stats import StreamStats
from pg2sink.pipeline import Held
from pg2sink.subscription.retention import Retention, commit_time

log = logging.getLogger(__name__)

#: Check the clock once per this many messages while data keeps arriving.
_HOUSEKEEPING_EVERY = 512
_XLOG_DATA_TAG = int(CopyDataTag.XLOG_DATA)
#: How often an idle loop looks for the acknowledgement of a flush in progress.
_ACK_POLL_SECONDS = 0.005
#: (tag byte, name in StreamStats.messages) of the pgoutput messages counted
_TAG_NAMES = tuple((int(tag), tag.name.lower()) for tag in MessageTag)


class FrameSource(Protocol):
    """The replication connection as the loop sees it: CopyData frames in, status out.

    ReplicationStream is the real one; a test plays a script of captured frames. Reading
    never waits (`wait` does), so the loop can do its housekeeping between the two.
    """

    def get_copy_data(self, async_: int, /) -> tuple[int, memoryview]:
        """The next frame received, as psycopg's `PGconn.get_copy_data(1)`: (its size,
        it), size 0 when nothing is buffered, negative when the server ended the copy.

        Called once per change with 1, so the real stream hands out libpq's bound
        method itself: a Python method or a functools.partial around it costs
        instructions on every change (bench/callgrind_stream.py)."""
        ...

    def ended(self) -> NoReturn:
        """Raise the reason the copy ended (after a negative size)."""
        ...

    def wait(self, timeout: float, extra_fds: Sequence[int] = ()) -> None:
        """Block until a frame may be readable, an extra fd is, or `timeout` passes."""
        ...

    def send(self, payload: bytes) -> None:
        """Send a CopyData payload (a Standby status update) to the server."""
        ...


class Clock(Protocol):
    """Seconds on a monotonic scale (time.monotonic); the loop's deadlines use it.

    The loop never sleeps on the clock: it waits in `FrameSource.wait`, so a test's
    source moves its fake clock on while it "waits"."""

    def __call__(self) -> float: ...


class ChangeHandler(Protocol):
    """Where decoded messages go; see ChangelogHandler and DecodeOnlyHandler."""

    def feed(self, payload: bytes | memoryview, lsn: int) -> int:
        """Process one pgoutput message that started at `lsn`; return the transaction's
        end LSN if it was a Commit, else 0. The loop takes `feed` anew at each
        housekeeping step and uses that until the next (a handler may hand out another
        callable then: the builder's, or a stage's in front of it)."""
        ...

    #: pgoutput messages fed so far, by tag byte; the stream moves them into its
    #: stats (and zeroes them) at housekeeping, off the per-message path
    tag_counts: list[int]

    @property
    def in_transaction(self) -> bool: ...

    def checkpoint(self, lsn: int) -> None: ...

    def start_flush(self) -> None:
        """Begin making everything so far durable, without waiting (see sinks.base)."""
        ...

    def acknowledged(self) -> int | None:
        """The highest checkpoint durably accepted so far."""
        ...

    def pending_bytes(self) -> int:
        """Bytes the sink holds written but not yet durable."""
        ...

    def flush(self) -> int | None:
        """Make everything durable, waiting; return the highest acknowledged checkpoint."""
        ...

    def close(self) -> None: ...


class StopRequested:
    """SIGINT/SIGTERM flag plus a wake-up fd so a blocked select returns at once."""

    def __init__(self) -> None:
        self.requested = False
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._previous: dict[int, object] = {}

    @property
    def fileno(self) -> int:
        return self._r.fileno()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self.requested:
            log.info("received %s, stopping after a final flush", signal.Signals(signum).name)
        self.requested = True

    def request(self) -> None:
        """Stop as a signal would, from another thread (the process running several
        pipelines passes its signal on: pg2sink/pipelines.py)."""
        self.requested = True
        # wakes a loop waiting on `fileno`; OSError: the buffer is full (a wake-up is
        # pending already), or the flag was closed (its loop ended)
        with contextlib.suppress(OSError):
            self._w.send(b"\0")

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)

    def uninstall(self) -> None:
        signal.set_wakeup_fd(-1)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self.close()

    def close(self) -> None:
        """Close the wake-up socket pair (uninstall does; a flag never installed needs
        only this)."""
        self._r.close()
        self._w.close()

    def drain(self) -> None:
        try:
            while self._r.recv(512):
                pass
        except BlockingIOError:
            pass


class Streamer:
    """Runs one replication stream until stopped or the connection fails."""

    def __init__(
        self,
        source: FrameSource,
        handler: ChangeHandler,
        *,
        heartbeat_interval: float,
        flush_interval: float,
        poll_interval: float | None = None,
        poll: Callable[[], object] | None = None,
        confirm: bool = True,
        advance: bool = True,
        stop: StopRequested | None = None,
        clock: Clock = time.monotonic,
        stats: StreamStats | None = None,
        wal_retain: float = 0.0,
    ) -> None:
        self.source = source
        self.handler = handler
        self.heartbeat_interval = heartbeat_interval
        self.flush_interval = min(flush_interval, heartbeat_interval)
        self.poll_interval = poll_interval
        self.poll = poll
        #: False in --decode-only: never report a flush position.
        self.confirm = confirm
        #: False in `pg2sink replay` (without --advance-slot): acknowledgements count, but
        #: the slot is never moved
        self.advance = advance
        self.stop = stop or StopRequested()
        self.clock = clock
        self.received_lsn = 0
        self.checkpointed_lsn = 0
        #: the checkpoint the last flush covered
        self.flushed_lsn = 0
        #: the sink's highest acknowledgement, and what is confirmed to the server: the
        #: same but with --wal-retain (`retention`)
        self.acknowledged_lsn = 0
        self.confirmed_lsn = 0
        self.retention = Retention(wal_retain) if wal_retain > 0 else None
        self._reported_lsn = -1
        self._next_flush = 0.0
        self._last_flush = 0.0
        self._next_status = 0.0
        self._next_poll = 0.0
        self.messages = 0
        #: counters for metrics and the HTTP API (a private one when none is given)
        self.stats = stats if stats is not None else StreamStats()
        #: changes counted in stats when the last timed flush started (records per flush)
        self._changes_at_flush = 0
        #: (mark, start time, changes so far) of the flush being timed, if any
        self._timed_flush: tuple[int, float, int] | None = None
        #: (end LSN, when its records were all written) of the oldest commit the sink
        #: has not acknowledged yet, timed until it is (pg2sink_sink_write_seconds)
        self._timed_write: tuple[int, float] | None = None
        #: time spent waiting for the server (the rest is pg2sink's own work)
        self.idle_seconds = 0.0

    def run(self) -> None:
        now = self.clock()
        self._next_flush = now + self.flush_interval
        self._next_status = now + self.heartbeat_interval
        self._next_poll = now + (self.poll_interval or 0.0)
        source = self.source
        feed = self.handler.feed
        unpack_header = XLOG_DATA_HEADER.unpack_from
        header_size = XLOG_DATA_HEADER.size
        countdown = _HOUSEKEEPING_EVERY
        get_copy_data = source.get_copy_data
        stop = self.stop
        while True:
            # (0, _) when nothing is buffered, a negative size when the stream ended
            nbytes, buf = get_copy_data(1)
            if nbytes <= 0:
                if nbytes < 0:
                    source.ended()
                if stop.requested:
                    break
                if (
                    self.checkpointed_lsn > self.flushed_lsn
                    and self.clock() >= self._last_flush + self.flush_interval / 10
                ):
                    # Caught up with the server: make what we have durable and
                    # confirm it now rather than at the flush deadline, so a trickle
                    # of changes is confirmed as it comes. At most ten such early
                    # flushes per interval bound the fsync rate.
                    self._flush()
                self._housekeeping(self.clock())
                idle_from = self.clock()
                source.wait(self._time_to_deadline(), (stop.fileno,))
                self.idle_seconds += self.clock() - idle_from
                stop.drain()
                # taken anew at each housekeeping step, never per change: a stage in
                # front of the builder (the import gate) is fed only while it has work
                feed = self.handler.feed
                continue
            countdown -= 1
            if buf[0] == _XLOG_DATA_TAG:
                # Fast path, once per change: copy the frame out of libpq's buffer once
                # and slice the payload off as bytes (cheaper than a memoryview slice
                # copied again by the handler; bench/callgrind_stream.py).
                # The XLogData header's WAL end equals its data start in logical
                # decoding, so the position the server has sent is tracked from commits
                # and keepalives instead.
                frame = buf.tobytes()
                try:
                    end_lsn = feed(frame[header_size:], unpack_header(frame)[1])
                except Held as held:  # a stage in front of the builder (pg2sink.pipeline)
                    held_end = self._wait_held(held, buf)
                    if held_end is None:
                        break  # stopped while waiting: nothing of the message was written
                    end_lsn = held_end
                    feed = self.handler.feed  # as _wait_held's last attempt took it
                if end_lsn:
                    self._checkpoint(end_lsn, at=self._commit_time(frame, header_size))
            else:
                msg = parse_copy_data(buf)
                assert isinstance(msg, PrimaryKeepalive)
                self._keepalive(msg)
            if countdown == 0:
                # Every so many messages while data keeps coming: counters, deadlines
                # and the stop flag (checked here rather than per message).
                self.messages += _HOUSEKEEPING_EVERY
                countdown = _HOUSEKEEPING_EVERY
                if stop.requested:
                    break
                self._housekeeping(self.clock())
                feed = self.handler.feed
        self.messages += _HOUSEKEEPING_EVERY - countdown
        self.shutdown()

    def _wait_held(self, held: Held, buf: bytes | memoryview) -> int | None:
        """Feed the held message again until it goes through; None if stopped.

        Meanwhile the housekeeping goes on: flushes confirm what came before the held
        message (never past it) and status updates keep wal_sender_timeout at bay."""
        log.info("%s", held)
        payload = buf[XLOG_DATA_HEADER.size :]
        lsn = XLOG_DATA_HEADER.unpack_from(buf)[1]
        while True:
            if self.stop.requested:
                return None
            self._housekeeping(self.clock())
            held.wait(max(0.0, min(0.5, self._time_to_deadline())))
            try:
                end_lsn = self.handler.feed(payload, lsn)
            except Held:
                continue
            log.info("%s", held.resumed)
            return end_lsn

    def tick(self) -> None:
        """Housekeeping from inside a long handler call (the replay of a streamed
        transaction): flushes, acknowledgements, and the status updates that keep the
        server's wal_sender_timeout from ending the connection."""
        self._housekeeping(self.clock())

    def _commit_time(self, frame: bytes, offset: int) -> int | None:
        """With --wal-retain, the commit time of the Commit in `frame` (from `offset`)."""
        if self.retention is None:
            return None
        return commit_time(memoryview(frame)[offset:])

    def _checkpoint(self, lsn: int, commit: bool = True, at: int | None = None) -> None:
        """A commit's end (or, commit=False, a keepalive's position) is confirmable; `at`
        is its server time (--wal-retain: the commit's time, the keepalive's)."""
        if lsn > self.received_lsn:
            self.received_lsn = lsn
        if lsn > self.checkpointed_lsn:
            self.checkpointed_lsn = lsn
            self.handler.checkpoint(lsn)
            if self.retention is not None:
                self.retention.note(lsn, now_pg_timestamp() if at is None else at)
            if commit and self._timed_write is None:
                # one commit at a time, the oldest waiting: a clock read per acknowledgement
                self._timed_write = (lsn, self.clock())

    def _keepalive(self, ka: PrimaryKeepalive) -> None:
        self.stats.heartbeats += 1
        if ka.wal_end > self.received_lsn:
            self.received_lsn = ka.wal_end
        if not self.handler.in_transaction:
            # Everything before the server's send position has reached us and
            # no transaction is open: commits that published nothing (or were
            # skipped as empty) are behind us, so this position is confirmable
            # once the sink has flushed what came before it.
            self._checkpoint(ka.wal_end, commit=False, at=ka.send_time)
        if ka.reply_requested:
            self._flush()
            self._send_status(self.clock(), force=True)

    def _time_to_deadline(self) -> float:
        deadlines = [self._next_flush, self._next_status]
        if self.poll is not None:
            deadlines.append(self._next_poll)
        if self.checkpointed_lsn > self.flushed_lsn:
            # something waits for an early flush that its spacing has held back
            deadlines.append(self._last_flush + self.flush_interval / 10)
        if self.confirm and self.flushed_lsn > self.acknowledged_lsn:
            # a flush is in progress (an fsync, Kafka acks): look again soon
            deadlines.append(self.clock() + _ACK_POLL_SECONDS)
        return min(deadlines) - self.clock()

    def _fold_counters(self) -> None:
        """Move the per-tag message counts and positions into stats (off the hot path)."""
        messages = self.stats.messages
        counts = self.handler.tag_counts
        for tag, name in _TAG_NAMES:
            if counts[tag]:
                messages[name] = messages.get(name, 0) + counts[tag]
                counts[tag] = 0
        if self.received_lsn > self.stats.received_lsn:
            self.stats.received_lsn = self.received_lsn
        self.stats.raw_buffer_bytes = self.handler.pending_bytes()

    def _housekeeping(self, now: float) -> None:
        self._fold_counters()
        if self.confirm and self.flushed_lsn > self.acknowledged_lsn:  # a flush in progress?
            self._take_acknowledged(self.handler.acknowledged())
        if now >= self._next_flush:
            self._flush()
            self._next_flush = now + self.flush_interval
        if now >= self._next_status or self.confirmed_lsn != self._reported_lsn:
            self._send_status(now)
        if self.poll is not None and self.poll_interval and now >= self._next_poll:
            self.poll()
            self._next_poll = self.clock() + self.poll_interval

    def _flush(self) -> None:
        """Start a flush of everything so far; its acknowledgement arrives later."""
        self.flushed_lsn = self.checkpointed_lsn
        self._last_flush = self.clock()
        self.handler.start_flush()
        if self._timed_flush is None and self.flushed_lsn > self.acknowledged_lsn:
            # time this flush until the sink acknowledges it (pg2sink_sink_flush_seconds)
            changes = sum(sum(ops.values()) for ops in self.stats.tables.values())
            self._timed_flush = (self.flushed_lsn, self._last_flush, changes)
        self._take_acknowledged(self.handler.acknowledged())

    def _take_acknowledged(self, acked: int | None) -> None:
        if acked is None or acked <= self.acknowledged_lsn:
            return
        self.acknowledged_lsn = acked
        retention = self.retention
        self.confirmed_lsn = acked if retention is None else retention.hold(acked)
        if not self.confirm:
            return
        self.stats.acknowledge(acked)
        written = self._timed_write
        if written is not None and acked >= written[0]:
            self._timed_write = None
            self.stats.write_seconds.observe(self.clock() - written[1])
        timed = self._timed_flush
        if timed is not None and acked >= timed[0]:
            self._timed_flush = None
            self.stats.observe_flush(self.clock() - timed[1], timed[2] - self._changes_at_flush)
            self._changes_at_flush = timed[2]

    def _send_status(self, now: float, force: bool = False) -> None:
        if not force and now < self._next_status and self.confirmed_lsn == self._reported_lsn:
            return
        flush = self.confirmed_lsn if self.confirm and self.advance else 0
        # write >= flush always; in --decode-only and a replay, flush 0
        # (InvalidXLogRecPtr) makes the server keep the slot where it is.
        write = max(self.received_lsn, flush)
        self.source.send(standby_status_update(write, flush, flush, now_pg_timestamp()))
        if flush and self.confirmed_lsn != self._reported_lsn:
            log.debug("confirmed %s", format_lsn(self.confirmed_lsn))
        self._reported_lsn = self.confirmed_lsn
        self._next_status = now + self.heartbeat_interval

    def shutdown(self) -> None:
        """Final flush (waiting for it) and status, so a clean stop repeats nothing."""
        self._fold_counters()
        self.flushed_lsn = self.checkpointed_lsn
        self._take_acknowledged(self.handler.flush())
        self._send_status(self.clock(), force=True)
        flushes = self.stats.flush_seconds
        log.info(
            "stopped: %d messages, %.1fs waiting for the server, %d flushes taking %.2fs; "
            "received up to %s, confirmed %s",
            self.messages,
            self.idle_seconds,
            flushes.count,
            flushes.sum,
            format_lsn(self.received_lsn),
            format_lsn(self.confirmed_lsn) if self.confirm else "nothing (--decode-only)",
        )
