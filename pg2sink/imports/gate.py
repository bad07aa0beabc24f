"""The import gate: holds the stream at a change that must come after an import's rows.

While table T is imported at snapshot S (docs/imports.md), a streamed change of T from a
transaction that S does not see is newer than every import row, so it may only reach
the sink once the import's rows are durable: `admit()` raises GateHeld at the first
such change, before anything of it is emitted; the replication loop answers the server
with status updates while it waits (subscription/loop.py) and feeds the same message
again when the gate moves. A change from a transaction S sees is already in the import
rows: it passes (its key's last visible change equals the import row), except where
replaying it would undo import rows: TRUNCATE of T, and any change of a table without a
key, whose consumers cannot match a change to its import row. Those are already
reflected in the import rows and are not written (see the doc).

The stream may lag behind the import: changes the snapshot sees can still arrive after
the job ended. So a finished (or failed) import leaves its table in the "after" state,
where the same rules apply to the changes the snapshot sees, and everything else passes,
until the first change at or past the snapshot's WAL position: the stream sends whole
transactions in commit order, and every transaction the snapshot sees committed before
that position, so from there on none can come and the table leaves the gate.

The gate is a stage in front of the changelog builder (GateStage): the builder and the
replication loop know nothing of imports. The loop sees only pg2sink.pipeline.Held.

Free while no table is gated. The loop binds its handler's feed to a local once and
takes it anew only at each housekeeping step (every 512 messages, and whenever it ran
out of frames or waited on a held message), never per change; the handler asks the
stage which feed that is (GateStage.bind, in the stream thread): the builder's own while
the map of gated tables is empty, so a change costs exactly what it costs with
--no-imports (no stage), and the stage's feed while a table is gated. While a table is
gated only its row changes and TRUNCATEs are decoded and decided here; the other
tables keep the builder's fast paths.

Why no change of a gated table reaches the builder unfiltered. Let t be the moment the
stream thread binds the stage's feed (bind() under the gate's lock, with the table in
the map). From t on every message the stream thread feeds goes through the stage, which
reads the current map at each message: the loop feeds only through what it bound last,
the --streaming handler replays with what it took at that same binding, and nothing is
bound anew but by bind(). Before t the builder's feed may have been bound:

- hold() (the import thread) publishes the table and returns only once a bind() found it
  in the map (or no stream session is running: the next one binds from the map it finds
  before it feeds anything), so t is before hold() returns. A message fed unfiltered came
  before t, so the walsender had decoded its transaction's commit record before t.
- The engine (docs/imports.md, step 3) then waits for every transaction running after
  hold() returned and only then exports the snapshot S: a transaction whose commit record
  was written before t but which was still listed as running is over by then, so S sees
  every transaction fed unfiltered. Such a change is in the import rows and came before
  them in the changelog: for a keyed table the import row (the key's state at S) comes
  last, as it must. A keyless table is gated "pending" from the moment its job exists
  (below), long before hold().
- pending() from the import thread waits for the binding as hold() does. pending() from
  the stream thread itself (the publication manager's reconcile, in the loop's
  housekeeping or before the loop starts) cannot wait for itself and need not: the loop
  takes its feed anew when that housekeeping step returns, before its next message. A
  replay of a streamed transaction (--streaming) calls housekeeping without taking the
  feed anew, but a transaction that committed before the table joined the publication
  holds no change of it (pgoutput decodes with the catalog of each change's position).
- The table leaves the map (finish, release) at any time: the stage, still bound until
  the next housekeeping step, passes everything on; then the builder's feed is bound
  again. Only a map that is empty at bind() time binds the builder's feed.

If no bind() comes within `hold_timeout` (a replay of a huge streamed transaction), hold()
raises GateTimeoutError: the attempt fails and is retried (nothing was read yet).

Threads: the import engine changes the gate; the replication loop reads it. The table
map is an immutable snapshot, replaced as a whole (under the gate's lock), never
mutated, so the loop's reads need no lock; nothing of the builder is touched from the
engine's thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pg2sink.changelog.builder import ChangelogBuilder, RelationState
from pg2sink.imports.snapshot import Visibility
from pg2sink.logical.decoder import MessageTag, decode
from pg2sink.logical.fastpath import RELATION_ID
from pg2sink.logical.messages import Delete, Insert, PgOutputMessage, Truncate, Update
from pg2sink.pipeline import Held

log = logging.getLogger(__name__)

_ROW_CHANGES = (Insert, Update, Delete)


#: Row changes: the relation id follows the tag byte (outside a stream block).
_ROW_TAGS = frozenset({int(MessageTag.INSERT), int(MessageTag.UPDATE), int(MessageTag.DELETE)})
_TRUNCATE_TAG = int(MessageTag.TRUNCATE)
_relation_id = RELATION_ID.unpack_from

#: (schema, table) -> its gate entry: the snapshot the stage decides from
GatedTables = dict[tuple[str, str], "_Entry"]
#: A feed of pgoutput messages: ChangelogBuilder.feed, or GateStage.feed in front of it.
Feed = Callable[[bytes | memoryview, int], int]

#: How long hold() waits for the stream to take the stage's feed (module docstring):
#: normally one housekeeping step (at most the flush interval while the stream is idle).
HOLD_TIMEOUT = 60.0
#: How often a stream held at a gate says, in a warning, why it still waits.
HELD_WARNING_INTERVAL = 60.0


class GateTimeoutError(RuntimeError):
    """The stream did not take the stage's feed in time: the import may not start."""


class GateHeld(Held):
    """The message must wait for an import to finish; nothing of it was emitted."""

    def __init__(self, gate: ImportGate, table: str, key: tuple[str, str]) -> None:
        super().__init__(
            f"stream paused at a change of {table} until its import is done",
            f"stream resumed after waiting for the import of {table}",
            self._wait,
        )
        self.gate = gate
        self.table = table
        self.key = key
        self.since = self._warned = time.monotonic()

    def _wait(self, timeout: float) -> None:
        """gate.wait, and every HELD_WARNING_INTERVAL a warning saying why the stream
        still waits (never a silent stall)."""
        self.gate.wait(timeout)
        now = time.monotonic()
        if now - self._warned >= HELD_WARNING_INTERVAL:
            self._warned = now
            log.warning(
                "stream still paused at a change of %s after %.0fs: %s",
                self.table,
                now - self.since,
                self.gate.notes.get(self.key, "its import is running"),
            )


@dataclass(frozen=True)
class _Entry:
    keyless: bool
    """No primary key or replica-identity index: visible changes are skipped."""
    visibility: Visibility | None
    """The import's snapshot; None while it is being taken."""
    holding: bool
    """The import is running (True) or only pending (a keyless table waiting its turn)."""
    lsn: int = 0
    """WAL insert position when the snapshot was taken."""
    after: bool = False
    """The import ended: changes the snapshot does not see pass instead of waiting."""


class ImportGate:
    """Per-table gates set by the import engine and checked by its GateStage."""

    def __init__(self, hold_timeout: float = HOLD_TIMEOUT) -> None:
        #: the gated tables: replaced as a whole under _cond, never mutated
        self.gated: GatedTables = {}
        self.hold_timeout = hold_timeout
        self._cond = threading.Condition()
        self._stage: GateStage | None = None
        #: the stream thread feeds the builder directly: its last bind() found the map
        #: empty (False: it feeds through the stage, or no stream session runs)
        self._bypassed = False
        #: the thread that called bind() last (the stream thread), None between sessions
        self._stream_thread: int | None = None
        #: what a running import of a table waits for (the engine's note), if anything
        self.notes: dict[tuple[str, str], str] = {}

    def stage(self, builder: ChangelogBuilder) -> GateStage:
        """The stage in front of `builder`: one per replication session, the latest one
        is kept up to date."""
        with self._cond:
            self._stage = GateStage(self, builder)
            return self._stage

    # -- engine side ------------------------------------------------------------

    def pending(self, schema: str, table: str) -> None:
        """A keyless table has a job that has not run yet: skip its changes (every one
        is committed before the job's future snapshot, so the import will carry it).

        Returns once the stream feeds through the stage, as hold() does; after
        `hold_timeout` it returns anyway (the stream takes the stage at its next
        housekeeping step; a change in between may be counted twice, as one made before
        the job was seen)."""
        key = (schema, table)
        self._set(key, _Entry(True, None, False))
        if not self._await_stage(key):
            log.warning(
                "the stream did not take the import gate for %s.%s within %.0fs",
                schema,
                table,
                self.hold_timeout,
            )

    def hold(self, schema: str, table: str, *, keyless: bool) -> None:
        """The import of this table starts: hold its changes until its snapshot is known.

        Returns only once the stream feeds through the stage (module docstring): the
        snapshot may be taken after that. GateTimeoutError if it did not within
        `hold_timeout`."""
        key = (schema, table)
        self._set(key, _Entry(keyless, None, True))
        if not self._await_stage(key):
            raise GateTimeoutError(
                f"the stream did not take the import gate for {schema}.{table} "
                f"within {self.hold_timeout:.0f}s"
            )

    def open_snapshot(self, schema: str, table: str, visibility: Visibility, lsn: int) -> None:
        """The import reads at `visibility`: changes it sees pass, the others wait."""
        entry = self.gated.get((schema, table))
        keyless = entry.keyless if entry is not None else False
        self._set((schema, table), _Entry(keyless, visibility, True, lsn))

    def note(self, schema: str, table: str, text: str) -> None:
        """Why the import of this table takes longer (said while the stream waits)."""
        self.notes = {**self.notes, (schema, table): text}

    def finish(self, schema: str, table: str, *, retry: bool = False) -> None:
        """The import ended (done, or failed and to be retried): held changes go on.

        Changes its snapshot saw may still be on their way (a lagging stream): the
        table stays gated in the "after" state, or, keyless with a retry to come, back
        in the pending state. Without a snapshot, nothing was written: it leaves."""
        key = (schema, table)
        self.notes = {k: v for k, v in self.notes.items() if k != key}
        entry = self.gated.get(key)
        if entry is not None and entry.keyless and retry:
            self._set(key, _Entry(True, None, False))
        elif entry is not None and entry.visibility is not None:
            self._set(key, dataclasses.replace(entry, after=True))
        else:
            self.release(schema, table)

    def release(self, schema: str, table: str) -> None:
        """The table leaves the gate: its changes take the builder's fast paths again."""
        key = (schema, table)
        self._publish({k: v for k, v in self.gated.items() if k != key})

    def tables(self) -> list[tuple[str, str]]:
        return list(self.gated)

    def _set(self, key: tuple[str, str], entry: _Entry) -> None:
        self._publish({**self.gated, key: entry})

    def _publish(self, gated: GatedTables) -> None:
        """Swap in a new map, whole: the stream thread reads the old one or the new."""
        with self._cond:
            self.gated = gated
            if self._stage is not None:
                self._stage.gated = gated
            self._cond.notify_all()

    def _await_stage(self, key: tuple[str, str]) -> bool:
        """Block until the stream feeds through the stage (or `key` left the map, or no
        session runs); False after `hold_timeout`. The stream thread itself returns at
        once: it binds anew before its next message (module docstring)."""
        deadline = time.monotonic() + self.hold_timeout
        with self._cond:
            while self._bypassed and key in self.gated:
                if self._stream_thread == threading.get_ident():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    # -- stream side --------------------------------------------------------------

    def _bind(self) -> bool:
        """The stream thread takes its feed: the stage's (True) while a table is gated,
        else the builder's. Under the lock, so that a hold() published before it is seen
        here, and one published after it waits for the next bind()."""
        with self._cond:
            self._stream_thread = threading.get_ident()
            bypassed = not self.gated
            if self._bypassed and not bypassed:
                self._cond.notify_all()  # hold() may return
            self._bypassed = bypassed
            return not bypassed

    def _detach(self, stage: GateStage) -> None:
        """`stage`'s session ended: nothing feeds until the next session's loop binds."""
        with self._cond:
            if self._stage is stage:
                self._stage = None
            self._bypassed = False
            self._stream_thread = None
            self._cond.notify_all()

    def admit(
        self, builder: ChangelogBuilder, msg: PgOutputMessage, lsn: int
    ) -> PgOutputMessage | None:
        """`msg` (at `lsn`) as it may be handled now, None to leave it out; GateHeld to wait."""
        tables = self.gated
        if not tables:
            return msg
        cls = msg.__class__
        if cls in _ROW_CHANGES:
            assert isinstance(msg, Insert | Update | Delete)
            rel = builder.relations.get(msg.relation_id)
            if rel is None:
                return msg  # handle() reports the missing relation
            entry = tables.get((rel.namespace, rel.name))
            if entry is None:
                return msg
            return msg if self._decide(entry, rel, builder.xid, lsn, False) else None
        if cls is Truncate:
            assert isinstance(msg, Truncate)
            kept = []
            for relation_id in msg.relation_ids:
                rel = builder.relations.get(relation_id)
                entry = tables.get((rel.namespace, rel.name)) if rel is not None else None
                if rel is None or entry is None or self._decide(entry, rel, builder.xid, lsn, True):
                    kept.append(relation_id)
            if len(kept) == len(msg.relation_ids):
                return msg
            return dataclasses.replace(msg, relation_ids=tuple(kept)) if kept else None
        return msg

    def _decide(
        self, entry: _Entry, rel: RelationState, xid: int, lsn: int, truncate: bool
    ) -> bool:
        """True: emit; False: leave out (the import carries it); GateHeld: wait."""
        table = f"{rel.namespace}.{rel.name}"
        if not entry.holding:
            return False  # keyless, job pending: its future snapshot sees this change
        if entry.visibility is None:
            raise GateHeld(self, table, (rel.namespace, rel.name))
        if lsn >= entry.lsn or not entry.visibility.visible(xid):
            # newer than the import rows: after them
            if not entry.after:
                raise GateHeld(self, table, (rel.namespace, rel.name))
            if lsn >= entry.lsn:
                # past the snapshot in commit order: nothing it saw can follow
                self.release(rel.namespace, rel.name)
            return True
        # seen by the snapshot: in the import rows already
        return not (entry.keyless or truncate)

    def wait(self, timeout: float) -> None:
        """Block until the gate changes or `timeout` seconds pass."""
        with self._cond:
            self._cond.wait(timeout)


class GateStage:
    """The gate in front of one session's builder: feed() passes, leaves out or holds.

    Runs in the stream thread only. It reads the builder (its relations, the open
    transaction's xid) and hands it what passes; it changes nothing of it but the
    message counts the builder would have made itself. bind() says which feed the
    stream uses until it asks again: the builder's while no table is gated.
    """

    def __init__(self, gate: ImportGate, builder: ChangelogBuilder) -> None:
        self.gate = gate
        self.builder = builder
        self._builder_feed = builder.feed
        #: the gate's map, as ImportGate._publish last swapped it in
        self.gated = gate.gated

    def bind(self) -> Feed:
        """The feed the stream thread uses from now until its next housekeeping step:
        this stage's while a table is gated, else the builder's own (module docstring)."""
        gate = self.gate
        if gate.gated and not gate._bypassed:
            return self.feed  # bound already: stays (the stage is always safe to feed)
        return self.feed if gate._bind() else self._builder_feed

    def detach(self) -> None:
        """The replication session ended (the service calls this): a hold() need not wait
        for this stage's loop any more."""
        self.gate._detach(self)

    def feed(self, payload: bytes | memoryview, lsn: int) -> int:
        """As ChangelogBuilder.feed; GateHeld (nothing of the message handled) to wait."""
        # the map emptied since the stream bound this feed: pass until it binds anew
        if not self.gated:
            return self._builder_feed(payload, lsn)
        return self._gated_feed(payload, lsn)

    def _gated_feed(self, payload: bytes | memoryview, lsn: int) -> int:
        """A message while some table is gated: its row changes and TRUNCATEs are decided
        here; everything else, and other tables' changes, go to the builder's feed."""
        data = payload if isinstance(payload, bytes) else bytes(payload)
        tag = data[0] if data else 0
        if tag in _ROW_TAGS and len(data) > 4:
            builder = self.builder
            rel = builder.relations.get(_relation_id(data, 1)[0])
            if rel is None or (rel.namespace, rel.name) not in self.gated:
                return self._builder_feed(data, lsn)
        elif tag != _TRUNCATE_TAG:
            return self._builder_feed(data, lsn)
        builder = self.builder
        msg = decode(data)
        admitted = self.gate.admit(builder, msg, lsn)  # GateHeld: the loop feeds it again
        builder.tag_counts[tag] += 1
        if admitted is not None:
            builder.handle(admitted, lsn)
        return 0
