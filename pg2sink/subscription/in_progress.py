"""Streamed in-progress transactions (--streaming): spill to disk, replay at commit.

With `proto_version '2', streaming 'on'` (PostgreSQL 14+) the server sends a transaction
whose decoded changes outgrow `logical_decoding_work_mem` while it still runs, in blocks
that interleave with other transactions
(https://www.postgresql.org/docs/current/protocol-logical-replication.html):

    Stream Start (xid, first segment?)   data messages, each with its (sub)xact xid   Stream Stop
    ... more blocks of this and other transactions, ordinary transactions in between ...
    Stream Commit (xid, commit LSN, end LSN, commit time)   or   Stream Abort (xid, subxid)

`StreamingHandler` sits in front of a `ChangelogHandler`:

- outside a stream block a message goes to the changelog builder unchanged;
- inside one, each data message is appended, raw, to the spill file of its top-level
  transaction (`<spill dir>/<xid>.spill`): an open transaction costs one write buffer
  of memory, whatever its size;
- Stream Abort of a subtransaction (ROLLBACK TO SAVEPOINT) remembers the subxact's xid,
  and its changes are skipped at replay. Relation and Type messages are never skipped:
  pgoutput tracks what it sent per top-level transaction and will not send them again
  for the rest of it;
- Stream Abort of the top-level transaction deletes its spill file: nothing of it
  reaches the builder, let alone the sink;
- Stream Commit replays the spill file through the builder as one ordinary transaction:
  Begin (xid, commit time; the LSN of its first streamed change), the changes in order
  with their own LSNs, Commit (end LSN). Records and the checkpoint are those of the
  same transaction sent whole at commit (without --streaming).

Confirmation. The stream still checkpoints only at a Commit's end LSN, or at a keepalive's
position while no ordinary transaction is open. So a position past the start (and past
spilled changes) of an in-progress streamed transaction may be confirmed. That loses
nothing, because a restart resends such a transaction in full:

- the slot's restart_lsn never moves past the first change of the oldest transaction
  that was still running, so after a restart the server decodes it from its first change;
- the server skips only transactions that committed before the confirmed position, and
  an in-progress transaction commits after anything we received (and could confirm);
- after a restart the server does not stream anything until it has read past the
  confirmed position (ReorderBufferCanStartStreaming); then it sends what it holds of the
  transaction from the start, as a first segment, or whole at commit.

What a previous run spilled is therefore useless: spill files found at start are deleted.
"""

from __future__ import annotations

import logging
import os
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Final

from pg2sink.errors import ConfigError, DecodeError, Pg2SinkError, ServerConfigError
from pg2sink.logical import encode
from pg2sink.logical.decoder import MessageTag, decode
from pg2sink.logical.messages import StreamAbort, StreamCommit, StreamStart
from pg2sink.subscription.handlers import ChangelogHandler

__all__ = ["SpillError", "StreamingHandler", "check_streaming_server", "default_spill_dir"]

log = logging.getLogger(__name__)

#: Messages that only ever come outside a stream block and drive it.
_CONTROL: Final = frozenset(
    {int(MessageTag.STREAM_START), int(MessageTag.STREAM_COMMIT), int(MessageTag.STREAM_ABORT)}
)
_STREAM_STOP: Final = int(MessageTag.STREAM_STOP)
_ORIGIN: Final = int(MessageTag.ORIGIN)
#: Data messages that carry the (sub)transaction's xid inside a stream block.
_CHANGES: Final = frozenset(
    int(t)
    for t in (
        MessageTag.INSERT,
        MessageTag.UPDATE,
        MessageTag.DELETE,
        MessageTag.TRUNCATE,
        MessageTag.MESSAGE,
    )
)
#: Schema messages: kept even when their subtransaction aborts (module docstring).
_SCHEMA: Final = frozenset({int(MessageTag.RELATION), int(MessageTag.TYPE)})

#: One spilled message: subxact xid (0: never skipped), LSN, length; then the message
#: as it would come outside a stream (tag byte, then the rest without the xid).
_SPILL_HEADER: Final = struct.Struct(">IQI")
_XID: Final = struct.Struct(">I")

#: Write buffer per open streamed transaction (the memory it costs).
SPILL_BUFFER_BYTES: Final = 256 * 1024
#: Read buffer of a replay.
_REPLAY_BUFFER_BYTES: Final = 1 << 20
#: During a replay, give the stream its housekeeping (flushes, status updates that keep
#: the server's wal_sender_timeout away) once per this many messages.
_PROGRESS_EVERY: Final = 4096
_SUFFIX: Final = ".spill"


#: pgoutput streams in-progress transactions from PostgreSQL 14 on.
MIN_SERVER_VERSION: Final = 140000


def check_streaming_server(server_version: int) -> None:
    """ServerConfigError for a server that cannot stream in-progress transactions."""
    if server_version < MIN_SERVER_VERSION:
        raise ServerConfigError(
            f"--streaming needs PostgreSQL 14 or newer (the server is {server_version // 10000}); "
            "drop --streaming"
        )


class SpillError(Pg2SinkError):
    """A spill file cannot be written or read back (disk full, removed under us)."""


def default_spill_dir(slot: str) -> str:
    """`<system temp dir>/pg2sink-spill-<slot>`: one per slot, so instances on other
    slots never delete each other's files."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in slot)
    return os.path.join(tempfile.gettempdir(), f"pg2sink-spill-{safe}")


def _nothing() -> None:
    pass


@dataclass(slots=True)
class _Spill:
    """One in-progress streamed transaction."""

    xid: int
    path: Path
    file: BinaryIO
    first_lsn: int
    """LSN of its first streamed message (the Begin of the replay)."""
    aborted: set[int] = field(default_factory=set)
    """Subtransactions rolled back: their changes are skipped at replay."""
    messages: int = 0
    reader: BinaryIO | None = None
    """The spill file open for the replay, once Stream Commit arrived."""
    held: tuple[bytes, int] | None = None
    """The change a stage held back (resumed with it, see _replay)."""


class StreamingHandler:
    """A ChangeHandler for `streaming 'on'`: see the module docstring."""

    def __init__(self, inner: ChangelogHandler, spill_dir: str) -> None:
        self.inner = inner
        self.builder = inner.builder
        self.spill_dir = Path(spill_dir)
        #: the changelog's feed: the builder's, or a stage's in front of it (the import gate)
        self._builder_feed = inner.feed
        #: the transaction of the open stream block, if any
        self._block: _Spill | None = None
        self._open: dict[int, _Spill] = {}
        #: called every so many messages of a replay; the stream sets it (Streamer.tick)
        self.progress: Callable[[], None] = _nothing
        # the rest of the ChangeHandler protocol is the inner handler's
        self.tag_counts = inner.tag_counts
        self.checkpoint = inner.checkpoint
        self.start_flush = inner.start_flush
        self.acknowledged = inner.acknowledged
        self.pending_bytes = inner.pending_bytes
        self._prepare_dir()

    def _prepare_dir(self) -> None:
        try:
            self.spill_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            stale = [p for p in self.spill_dir.iterdir() if p.name.endswith(_SUFFIX)]
            for path in stale:
                path.unlink()
        except OSError as e:
            raise ConfigError(
                f"cannot use --spill-dir {str(self.spill_dir)!r}: {e.strerror}"
            ) from None
        if stale:
            # a restart resends those transactions in full (module docstring)
            log.info("deleted %d spill files of a previous run", len(stale))

    @property
    def in_transaction(self) -> bool:
        return self.inner.in_transaction

    @property
    def feed(self) -> Callable[[bytes | memoryview, int], int]:
        """As ChangeHandler.feed, taken anew by the loop at each housekeeping step; the
        changelog's feed is taken anew with it (a stage's while the stage has work)."""
        self._builder_feed = self.inner.feed
        return self._feed

    def _feed(self, payload: bytes | memoryview, lsn: int) -> int:
        """An ordinary message costs one test more than without --streaming."""
        if self._block is None and payload and payload[0] not in _CONTROL:
            return self._builder_feed(payload, lsn)
        return self._stream_feed(payload, lsn)

    def _stream_feed(self, payload: bytes | memoryview, lsn: int) -> int:
        if not payload:
            return self._builder_feed(payload, lsn)  # raises the DecodeError
        tag = payload[0]
        self.tag_counts[tag] += 1
        spill = self._block
        if spill is None:
            return self._control(payload, lsn)
        if tag in _CHANGES or tag in _SCHEMA:
            if len(payload) < 5:
                raise DecodeError(f"streamed pgoutput message of {len(payload)} bytes")
            subxid = 0 if tag in _SCHEMA else _XID.unpack_from(payload, 1)[0]
            try:
                write = spill.file.write
                write(_SPILL_HEADER.pack(subxid, lsn, len(payload) - 4))
                write(payload[:1])
                write(payload[5:])
            except OSError as e:
                raise SpillError(f"cannot write spill file {str(spill.path)!r}: {e}") from None
            spill.messages += 1
        elif tag == _STREAM_STOP:
            self._block = None
        elif tag != _ORIGIN:  # an Origin after Stream Start: not part of the records
            raise DecodeError(
                f"unexpected pgoutput message {chr(tag)!r} (0x{tag:02x}) inside a stream block"
            )
        return 0

    def _control(self, payload: bytes | memoryview, lsn: int) -> int:
        msg = decode(payload)
        if isinstance(msg, StreamStart):
            self._start(msg, lsn)
            return 0
        if isinstance(msg, StreamCommit):
            return self._commit(msg, lsn)
        if isinstance(msg, StreamAbort):
            self._abort(msg)
            return 0
        raise DecodeError(f"unexpected {type(msg).__name__} outside a stream block")

    def _start(self, msg: StreamStart, lsn: int) -> None:
        spill = self._open.get(msg.xid)
        if msg.first_segment:
            if spill is not None:  # cannot happen; start over rather than mix two runs
                log.warning("transaction %d streamed again from its start", msg.xid)
                self._discard(spill)
            spill = self._new_spill(msg.xid, lsn)
        elif spill is None:
            raise DecodeError(f"stream block of transaction {msg.xid} without its first segment")
        self._block = spill

    def _new_spill(self, xid: int, lsn: int) -> _Spill:
        path = self.spill_dir / f"{xid}{_SUFFIX}"
        try:
            file = open(path, "wb", buffering=SPILL_BUFFER_BYTES)  # noqa: SIM115 (closed at commit/abort)
        except OSError as e:
            raise SpillError(f"cannot create spill file {str(path)!r}: {e.strerror}") from None
        spill = _Spill(xid, path, file, lsn)
        self._open[xid] = spill
        log.debug("transaction %d is streamed; spilling to %s", xid, path)
        return spill

    def _abort(self, msg: StreamAbort) -> None:
        spill = self._open.get(msg.xid)
        if spill is None:
            # the server sends Stream Abort only for what it streamed; nothing to drop
            log.debug("stream abort of unknown transaction %d", msg.xid)
            return
        if msg.subxid == msg.xid:
            log.debug("streamed transaction %d aborted", msg.xid)
            self._discard(spill)
        else:
            spill.aborted.add(msg.subxid)

    def _discard(self, spill: _Spill) -> None:
        del self._open[spill.xid]
        if self._block is spill:
            self._block = None
        spill.file.close()
        if spill.reader is not None:
            spill.reader.close()
        spill.path.unlink(missing_ok=True)

    def _commit(self, msg: StreamCommit, lsn: int) -> int:
        spill = self._open.get(msg.xid)
        if spill is None:
            raise DecodeError(f"stream commit of transaction {msg.xid} that was never streamed")
        builder = self.builder
        # The messages were counted as they arrived: the replay counts into a scratch list.
        counts = builder.tag_counts
        builder.tag_counts = [0] * 256
        try:
            if spill.reader is None:
                spill.file.close()
                try:
                    spill.reader = open(spill.path, "rb", buffering=_REPLAY_BUFFER_BYTES)  # noqa: SIM115
                except OSError as e:
                    raise SpillError(f"cannot read spill file {str(spill.path)!r}: {e}") from None
                self._builder_feed(
                    # an ordinary Begin and Commit around the replay
                    encode.begin(msg.commit_lsn, msg.commit_time, msg.xid),
                    spill.first_lsn,
                )
            self._replay(spill)
            end_lsn = self._builder_feed(
                encode.commit(msg.flags, msg.commit_lsn, msg.end_lsn, msg.commit_time),
                lsn,
            )
        finally:
            builder.tag_counts = counts
        log.debug(
            "streamed transaction %d committed: %d messages replayed (%d subtransactions "
            "rolled back)",
            msg.xid,
            spill.messages,
            len(spill.aborted),
        )
        self._discard(spill)
        return end_lsn

    def _replay(self, spill: _Spill) -> None:
        """Feed the spilled changes to the builder, from where the last call stopped.

        A stage in front of the builder (the import gate) may hold a change: it raises
        pipeline.Held with nothing of it emitted, and the stream feeds the Stream Commit
        again later. So the held change is kept and the replay resumes with it.
        """
        feed = self._builder_feed
        if spill.held is not None:
            feed(*spill.held)
            spill.held = None
        reader = spill.reader
        assert reader is not None
        progress = self.progress
        aborted = spill.aborted
        read = reader.read
        header_size = _SPILL_HEADER.size
        unpack_header = _SPILL_HEADER.unpack
        countdown = _PROGRESS_EVERY
        while True:
            head = read(header_size)
            if not head:
                return
            if len(head) != header_size:
                raise SpillError(f"spill file {str(spill.path)!r} is truncated")
            subxid, change_lsn, length = unpack_header(head)
            data = read(length)
            if len(data) != length:
                raise SpillError(f"spill file {str(spill.path)!r} is truncated")
            if subxid in aborted:
                continue
            try:
                feed(data, change_lsn)
            except BaseException:
                spill.held = (data, change_lsn)
                raise
            countdown -= 1
            if countdown == 0:
                countdown = _PROGRESS_EVERY
                progress()

    def discard_spills(self) -> None:
        """Close and delete the spill files of the transactions still open (end of a
        session: the server resends them in full)."""
        for spill in list(self._open.values()):
            self._discard(spill)

    def flush(self) -> int | None:
        return self.inner.flush()

    def close(self) -> None:
        self.discard_spills()
        self.inner.close()
