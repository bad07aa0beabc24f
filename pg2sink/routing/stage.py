"""RoutingStage: the routing rules applied to pgoutput messages, before the builder.

Rewriting the messages rather than the records keeps every path of the builder and the
sinks as it is (the file sink's new-row shortcut, the Kafka sink's encoder of raw
rows): what reaches them is what PostgreSQL would have sent for a table without the
filtered actions and columns. Per message:

- Relation of a routed table: excluded columns are taken out, masked ones become
  `text` (type oid 25, no modifier), so the builder's Schema record has them as strings;
  a key column excluded (or masked by other than hash) stops the stream (ConfigError).
- Insert, Update, Delete of a routed table: left out when --only does not pass the
  action, else their tuples lose the excluded columns and carry the masked text of the
  masked ones (masking.Mask.apply on the value's PostgreSQL text; NULL and unchanged
  TOAST stay what they are).
- Truncate: the tables whose truncate does not pass are taken out of it; a Truncate of
  none of them is left out.
- an outbox table (--outbox, outbox.py): its Relation is left out, each Insert is
  published as one message and left out, its other messages are left out.
- a table no action of which passes (pg2sink's internal schema under a FOR ALL TABLES
  publication, Rules.without_schema): left out as an outbox's messages are.
- everything else, and every message of a table no rule touches, passes as it is.

A left-out change never reaches the builder, but its transaction's Begin and Commit do:
the commit's end LSN is returned as ever, so the sink's checkpoints and the slot's
confirmed position move past filtered changes.

Wire layouts (https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html),
outside a streamed block (in_progress.py replays without the xid):
Relation 'R' oid namespace\\0 name\\0 replident Int16-count {flags name\\0 type-oid typmod};
Insert 'I' oid 'N' tuple; Update 'U' oid ['K'|'O' tuple] 'N' tuple; Delete 'D' oid
'K'|'O' tuple; Truncate 'T' Int32-count options {oid}; a tuple is Int16-count then per
column 'n' | 'u' | 't' Int32-length bytes | 'b' Int32-length bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pg2sink.catalog.catalog import CatalogLookup
from pg2sink.errors import DecodeError
from pg2sink.logical.decoder import MessageTag, decode
from pg2sink.logical.messages import Insert, Relation
from pg2sink.routing.masking import Mask
from pg2sink.routing.outbox import OutboxColumns, Publisher
from pg2sink.routing.rules import Rules

__all__ = ["RoutingStage", "check_relation", "relation_key"]

#: (payload, lsn) -> end LSN of a Commit else 0: ChangelogBuilder.feed's signature
Feed = Callable[[bytes | memoryview, int], int]

_TEXT_OID: Final = 25
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_COLUMN_TYPE: Final = struct.Struct(">Ii")
_RELATION: Final = int(MessageTag.RELATION)
_TRUNCATE: Final = int(MessageTag.TRUNCATE)
_INSERT: Final = int(MessageTag.INSERT)
#: the row messages, by the action --only names them with
_ROW_TAGS: Final = {
    int(MessageTag.INSERT): "insert",
    int(MessageTag.UPDATE): "update",
    int(MessageTag.DELETE): "delete",
}
_NULL, _UNCHANGED, _TEXT = ord("n"), ord("u"), ord("t")
#: a column's fate in a tuple: kept (None), left out (_DROP), or a Mask
_DROP: Final = "drop"
Fate = Mask | str | None


@dataclass(frozen=True, slots=True)
class _Table:
    """A routed table as its last Relation message announced it."""

    passes: frozenset[int]
    """Tags of the row messages that pass."""
    truncate: bool
    columns: tuple[Fate, ...] | None
    """Per column of its tuples; None: tuples pass as they are."""


def relation_key(catalog: CatalogLookup, rel: Relation) -> tuple[str, ...]:
    """The columns consumers key the table's rows on, as ChangelogBuilder decides them:
    the primary key unless REPLICA IDENTITY USING INDEX, else the flagged columns
    (none under FULL, where every column is flagged)."""
    primary_key = catalog.primary_key(rel.relation_id)
    if primary_key and rel.replica_identity != "i":
        return primary_key
    if rel.replica_identity != "f":
        return tuple(c.name for c in rel.columns if c.is_key)
    return ()


def check_relation(rules: Rules, catalog: CatalogLookup, rel: Relation) -> None:
    """ConfigError for what the rules cannot do to `rel`: exclude or mask (but by hash) a
    key column, take an outbox's messages from columns it lacks."""
    outbox = rules.outbox_for(rel.namespace, rel.name)
    if outbox is not None:
        OutboxColumns.of(outbox, rel)
        return
    route = rules.route(rel.namespace, rel.name, [c.name for c in rel.columns])
    if route.changes_columns:
        route.check_key(f"{rel.namespace}.{rel.name}", relation_key(catalog, rel))


class RoutingStage:
    """The rules in front of the next feed (the import gate's stage, or the builder's)."""

    def __init__(
        self,
        rules: Rules,
        catalog: CatalogLookup,
        next_feed: Callable[[], Feed],
        publish: Publisher | None = None,
        tag_counts: list[int] | None = None,
    ) -> None:
        self.rules = rules
        self.catalog = catalog
        #: the builder's messages by tag (ChangelogBuilder.tag_counts): a left-out message
        #: is counted there too, since it was received all the same (as the gate does)
        self.tag_counts = tag_counts if tag_counts is not None else [0] * 256
        #: where outbox messages go (outbox.publisher_for); None without --outbox
        self.publish = publish
        #: the outbox tables' columns by relation oid
        self._outboxes: dict[int, OutboxColumns] = {}
        #: asked at each bind(): the gate's stage says which feed follows it (GateStage.bind)
        self._next_feed = next_feed
        self._next: Feed = next_feed()
        #: routed tables by relation oid (a table no rule touches is not in it)
        self._tables: dict[int, _Table] = {}

    def bind(self) -> Feed:
        """Stage.bind: this stage's feed, in front of the next feed as it is now."""
        self._next = self._next_feed()
        return self.feed

    def feed(self, payload: bytes | memoryview, lsn: int) -> int:
        """As ChangelogBuilder.feed; a left-out message returns 0 (it is no Commit)."""
        tag = payload[0] if payload else 0
        if tag in _ROW_TAGS:
            table = self._tables.get(_U32.unpack_from(payload, 1)[0]) if self._tables else None
            if table is not None:
                if tag not in table.passes:
                    if tag == _INSERT and self._outboxes:
                        self._publish(bytes(payload), lsn)
                    self.tag_counts[tag] += 1
                    return 0
                if table.columns is not None:
                    payload = _rewrite_row(bytes(payload), table.columns)
        elif tag == _RELATION:
            announced = self._relation(bytes(payload))
            if announced is None:
                self.tag_counts[tag] += 1
                return 0
            payload = announced
        elif tag == _TRUNCATE and self._tables:
            kept = self._truncate(bytes(payload))
            if kept is None:
                self.tag_counts[tag] += 1
                return 0
            payload = kept
        return self._next(payload, lsn)

    def _publish(self, data: bytes, lsn: int) -> None:
        """An outbox table's INSERT: its message, published (outbox.py)."""
        insert = decode(data)
        assert isinstance(insert, Insert) and self.publish is not None
        columns = self._outboxes.get(insert.relation_id)
        if columns is None:
            return
        message = columns.message([v if isinstance(v, bytes) else None for v in insert.new])
        if message is not None:
            self.publish(*message, lsn)

    def _relation(self, data: bytes) -> bytes | None:
        """Note the table's route; the message as the builder should see it (None: an
        outbox table, which the builder never hears of)."""
        rel = decode(data)
        assert isinstance(rel, Relation)
        self._tables.pop(rel.relation_id, None)
        self._outboxes.pop(rel.relation_id, None)
        check_relation(self.rules, self.catalog, rel)
        outbox = self.rules.outbox_for(rel.namespace, rel.name)
        if outbox is not None:
            self._outboxes[rel.relation_id] = OutboxColumns.of(outbox, rel)
            self._tables[rel.relation_id] = _Table(frozenset(), False, None)
            return None
        route = self.rules.route(rel.namespace, rel.name, [c.name for c in rel.columns])
        if route.passes_everything:
            return data
        if not route.actions:  # nothing of it passes (Rules.without_schema): no Schema either
            self._tables[rel.relation_id] = _Table(frozenset(), False, None)
            return None
        masks = dict(route.masks)
        fates: tuple[Fate, ...] | None = None
        if route.changes_columns:
            fates = tuple(
                _DROP if c.name in route.excluded else masks.get(c.name) for c in rel.columns
            )
            data = _relation_bytes(rel, fates)
        self._tables[rel.relation_id] = _Table(
            frozenset(t for t, action in _ROW_TAGS.items() if action in route.actions),
            "truncate" in route.actions,
            fates,
        )
        return data

    def _truncate(self, data: bytes) -> bytes | None:
        """The Truncate without the tables whose truncate does not pass; None: none left."""
        (count,) = _U32.unpack_from(data, 1)
        options = data[5]
        oids = [_U32.unpack_from(data, 6 + 4 * i)[0] for i in range(count)]
        tables = self._tables
        kept = [o for o in oids if (t := tables.get(o)) is None or t.truncate]
        if not kept:
            return None
        if len(kept) == count:
            return data
        return b"".join(
            [bytes([_TRUNCATE]), _U32.pack(len(kept)), bytes([options])]
            + [_U32.pack(o) for o in kept]
        )


def _relation_bytes(rel: Relation, fates: tuple[Fate, ...]) -> bytes:
    """The Relation message without the left-out columns, masked ones as text."""
    parts = [
        bytes([_RELATION]),
        _U32.pack(rel.relation_id),
        rel.namespace.encode() + b"\0",
        rel.name.encode() + b"\0",
        rel.replica_identity.encode(),
        _U16.pack(sum(1 for f in fates if f is not _DROP)),
    ]
    for column, fate in zip(rel.columns, fates, strict=True):
        if fate is _DROP:
            continue
        masked = isinstance(fate, Mask)
        parts.append(bytes([column.flags]) + column.name.encode() + b"\0")
        parts.append(
            _COLUMN_TYPE.pack(
                _TEXT_OID if masked else column.type_oid, -1 if masked else column.type_modifier
            )
        )
    return b"".join(parts)


def _rewrite_row(data: bytes, fates: tuple[Fate, ...]) -> bytes:
    """An Insert, Update or Delete with each of its tuples rewritten by `fates`: after the
    tag and the relation oid, pairs of a marker byte ('N', 'K', 'O') and a tuple."""
    out = bytearray(data[:5])
    off = 5
    while off < len(data):
        out.append(data[off])
        off = _rewrite_tuple(data, off + 1, fates, out)
    if off != len(data):
        raise DecodeError(f"pgoutput row message ends inside a tuple ({len(data)} bytes)")
    return bytes(out)


def _rewrite_tuple(data: bytes, off: int, fates: tuple[Fate, ...], out: bytearray) -> int:
    """Append the TupleData at `off`, rewritten, to `out`; the offset after it."""
    (count,) = _U16.unpack_from(data, off)
    if count != len(fates):
        raise DecodeError(
            f"pgoutput tuple of {count} columns for a relation announced with {len(fates)}"
        )
    out += _U16.pack(sum(1 for f in fates if f is not _DROP))
    off += 2
    for fate in fates:
        start = off
        kind = data[off]
        if kind in (_NULL, _UNCHANGED):
            off += 1
        else:  # 't' or 'b': Int32 length, then the bytes
            off += 5 + _U32.unpack_from(data, off + 1)[0]
        if fate is _DROP:
            continue
        if isinstance(fate, Mask) and kind == _TEXT:
            masked = fate.apply(data[start + 5 : off])
            out += b"t" + _U32.pack(len(masked)) + masked
        elif isinstance(fate, Mask) and kind not in (_NULL, _UNCHANGED):
            raise DecodeError(f"pgoutput sent a binary value ({chr(kind)!r}) of a masked column")
        else:
            out += data[start:off]
    return off
