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

Cost on the hot path when no table is gated: one call and one test per message.
GateStage.feed hands every message to the builder's own feed (its fast paths included)
while the map of gated tables is empty: measured with bench/callgrind_stream.py's
workload, ~650 instructions per change of ~45,000 (1.5%), and none with --no-imports (no
stage). That is the price of keeping the builder's state in the stream thread's hands:
the earlier design, free on this path, swapped the builder's per-relation readers from
the import thread. While a table is gated only its row changes and TRUNCATEs are decoded
and decided here; the other tables keep the builder's fast paths.

Threads: the import engine changes the gate; the replication loop reads it. The table
map is an immutable snapshot, replaced as a whole (under the gate's lock), never
mutated, so the loop's reads need no lock; nothing of the builder is touched from the
engine's thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
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


class GateHeld(Held):
    """The message must wait for an import to finish; nothing of it was emitted."""

    def __init__(self, gate: ImportGate, table: str) -> None:
        super().__init__(
            f"stream paused at a change of {table} until its import is done",
            f"stream resumed after waiting for the import of {table}",
            gate.wait,
        )
        self.gate = gate
        self.table = table


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

    def __init__(self) -> None:
        #: the gated tables: replaced as a whole under _cond, never mutated
        self.gated: GatedTables = {}
        self._cond = threading.Condition()
        self._stage: GateStage | None = None

    def stage(self, builder: ChangelogBuilder) -> GateStage:
        """The stage in front of `builder`: one per replication session, the latest one
        is kept up to date."""
        with self._cond:
            self._stage = GateStage(self, builder)
            return self._stage

    # -- engine side ------------------------------------------------------------

    def pending(self, schema: str, table: str) -> None:
        """A keyless table has a job that has not run yet: skip its changes (every one
        is committed before the job's future snapshot, so the import will carry it)."""
        self._set((schema, table), _Entry(True, None, False))

    def hold(self, schema: str, table: str, *, keyless: bool) -> None:
        """The import of this table starts: hold its changes until its snapshot is known."""
        self._set((schema, table), _Entry(keyless, None, True))

    def open_snapshot(self, schema: str, table: str, visibility: Visibility, lsn: int) -> None:
        """The import reads at `visibility`: changes it sees pass, the others wait."""
        entry = self.gated.get((schema, table))
        keyless = entry.keyless if entry is not None else False
        self._set((schema, table), _Entry(keyless, visibility, True, lsn))

    def finish(self, schema: str, table: str, *, retry: bool = False) -> None:
        """The import ended (done, or failed and to be retried): held changes go on.

        Changes its snapshot saw may still be on their way (a lagging stream): the
        table stays gated in the "after" state, or, keyless with a retry to come, back
        in the pending state. Without a snapshot, nothing was written: it leaves."""
        key = (schema, table)
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

    # -- stream side --------------------------------------------------------------

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
            raise GateHeld(self, table)
        if lsn >= entry.lsn or not entry.visibility.visible(xid):
            # newer than the import rows: after them
            if not entry.after:
                raise GateHeld(self, table)
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
    message counts the builder would have made itself.
    """

    def __init__(self, gate: ImportGate, builder: ChangelogBuilder) -> None:
        self.gate = gate
        self.builder = builder
        self._builder_feed = builder.feed
        #: the gate's map, as ImportGate._publish last swapped it in
        self.gated = gate.gated

    def feed(self, payload: bytes | memoryview, lsn: int) -> int:
        """As ChangelogBuilder.feed; GateHeld (nothing of the message handled) to wait."""
        # the one test per message while no table is gated (see the module docstring)
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
