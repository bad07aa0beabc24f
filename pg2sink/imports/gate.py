"""The import gate: holds the stream at a change that must come after an import's rows.

While table T is imported at snapshot S (docs/imports.md), a streamed change of T from a
transaction that S does not see is newer than every import row, so it may only reach
the sink once the import's rows are durable: `admit()` raises GateHeld at the first
such change, before anything of it is emitted; the replication loop answers the server
with status updates while it waits (subscription/stream.py) and feeds the same message
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

Cost on the hot path when no import runs: none. The builder's fast path
(ChangelogBuilder.feed) reads INSERT/UPDATE rows with a per-relation reader (or hands
them to the sink's raw writer); a gated table's reader is swapped for one that declines,
and its raw writer removed, so only its changes take the slow path, where admit() is
called. Other tables keep their fast paths.

Threads: the import engine changes the gate; the replication loop reads it. The table
map is replaced, never mutated, so the loop's lookups need no lock.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pg2sink.imports.snapshot import Visibility
from pg2sink.logical.messages import Delete, Insert, PgOutputMessage, Truncate, Update

if TYPE_CHECKING:
    from pg2sink.changelog.builder import ChangelogBuilder, RelationState

log = logging.getLogger(__name__)

_ROW_CHANGES = (Insert, Update, Delete)


class GateHeld(Exception):  # noqa: N818 (a signal to the loop, not an error)
    """The message must wait for an import to finish; nothing of it was emitted."""

    def __init__(self, gate: ImportGate, table: str) -> None:
        super().__init__(f"stream paused at a change of {table} until its import is done")
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


def _decline(data: bytes) -> None:
    """The fast reader of a gated table: sends every change to the slow path."""
    return None


class ImportGate:
    """Per-table gates set by the import engine and checked by the changelog builder."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, str], _Entry] = {}
        self._cond = threading.Condition()
        self._builder: ChangelogBuilder | None = None
        #: relation id -> the (fast reader, raw writer) a gated relation had
        self._saved: dict[int, tuple[object, object]] = {}

    # -- engine side ------------------------------------------------------------

    def attach(self, builder: ChangelogBuilder) -> None:
        """The builder of the current replication session (it calls admit())."""
        with self._cond:
            self._builder = builder
            self._saved.clear()
            builder.gate = self
            for rel in list(builder.relations.values()):
                self.relation_announced(rel)

    def pending(self, schema: str, table: str) -> None:
        """A keyless table has a job that has not run yet: skip its changes (every one
        is committed before the job's future snapshot, so the import will carry it)."""
        self._set((schema, table), _Entry(True, None, False))

    def hold(self, schema: str, table: str, *, keyless: bool) -> None:
        """The import of this table starts: hold its changes until its snapshot is known."""
        self._set((schema, table), _Entry(keyless, None, True))

    def open_snapshot(self, schema: str, table: str, visibility: Visibility, lsn: int) -> None:
        """The import reads at `visibility`: changes it sees pass, the others wait."""
        entry = self._tables.get((schema, table))
        keyless = entry.keyless if entry is not None else False
        self._set((schema, table), _Entry(keyless, visibility, True, lsn))

    def finish(self, schema: str, table: str, *, retry: bool = False) -> None:
        """The import ended (done, or failed and to be retried): held changes go on.

        Changes its snapshot saw may still be on their way (a lagging stream): the
        table stays gated in the "after" state, or, keyless with a retry to come, back
        in the pending state. Without a snapshot, nothing was written: it leaves."""
        key = (schema, table)
        entry = self._tables.get(key)
        if entry is not None and entry.keyless and retry:
            self._set(key, _Entry(True, None, False))
        elif entry is not None and entry.visibility is not None:
            self._set(key, dataclasses.replace(entry, after=True))
        else:
            self.release(schema, table)

    def release(self, schema: str, table: str) -> None:
        """The table leaves the gate: its fast reader comes back."""
        key = (schema, table)
        with self._cond:
            tables = dict(self._tables)
            tables.pop(key, None)
            self._tables = tables
            builder = self._builder
            if builder is not None:
                for rel in list(builder.relations.values()):
                    if (rel.namespace, rel.name) == key and rel.read_new is _decline:
                        saved = self._saved.pop(rel.relation_id, None)
                        if saved is not None:
                            rel.read_new, rel.write_raw = saved  # type: ignore[assignment]
            self._cond.notify_all()

    def tables(self) -> list[tuple[str, str]]:
        return list(self._tables)

    def _set(self, key: tuple[str, str], entry: _Entry) -> None:
        with self._cond:
            # table map first, then readers: relation_announced() (stream thread) stores a
            # new relation before it looks here, so one of the two swaps its reader
            self._tables = {**self._tables, key: entry}
            builder = self._builder
            if builder is not None:
                for rel in list(builder.relations.values()):
                    if (rel.namespace, rel.name) == key:
                        self._swap(rel)
            self._cond.notify_all()

    def _swap(self, rel: RelationState) -> None:
        if rel.read_new is not _decline:
            self._saved[rel.relation_id] = (rel.read_new, rel.write_raw)
            # the raw writer first: the builder tries it before the reader
            rel.write_raw = None
            rel.read_new = _decline

    # -- stream side --------------------------------------------------------------

    def relation_announced(self, rel: RelationState) -> None:
        """The builder stored a (new) relation: a gated table gets the declining reader."""
        if (rel.namespace, rel.name) in self._tables:
            self._swap(rel)

    def admit(
        self, builder: ChangelogBuilder, msg: PgOutputMessage, lsn: int
    ) -> PgOutputMessage | None:
        """`msg` (at `lsn`) as it may be handled now, None to leave it out; GateHeld to wait."""
        tables = self._tables
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
