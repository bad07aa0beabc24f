"""Turns decoded pgoutput messages into Schema, Modification and Message records.

State kept between messages: the relations announced by Relation messages
(with a compiled row decoder and Avro schema each) and the open
transaction's xid, commit time and sequence counter. Nothing of a
transaction's rows is held: each change becomes a record at once, so memory
stays flat however large a transaction is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from pg2sink.catalog.catalog import CatalogLookup, MissingValueLookup
from pg2sink.changelog.records import Message as MessageRecord
from pg2sink.changelog.records import Modification, Operation, Record, Schema, Truncation
from pg2sink.changelog.rows import RowDecoder
from pg2sink.changelog.typemap import RowColumn, ValueCodec, avro_row_schema, codec_for
from pg2sink.errors import DecodeError
from pg2sink.logical.decoder import decode
from pg2sink.logical.fastpath import (
    INSERT_TAG,
    RELATION_ID,
    UPDATE_TAG,
    RowReader,
    begin_fields,
    commit_end_lsn,
    compile_row_reader,
)
from pg2sink.logical.lsn import pg_timestamp_to_datetime
from pg2sink.logical.messages import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Relation,
    Truncate,
    TupleValue,
    Type,
    Update,
)

log = logging.getLogger(__name__)

relation_id = RELATION_ID.unpack_from
_NEW_ROW_OPERATIONS = {INSERT_TAG: Operation.INSERT, UPDATE_TAG: Operation.UPDATE}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: (Insert or Update message, commit time, sequence, lsn, xid, operation) -> whether it
#: was written: the sink's writer of one table's new rows straight from pgoutput's bytes
#: (Sink.row_writer: the file, NATS and null sinks read the row with their own
#: converters, the Kafka sink encodes it in C), no record built. False = declined: the
#: builder then makes the Modification record itself (and reports whatever is wrong).
RowWriter = Callable[[bytes, datetime, int, int, int, Operation], bool]


@dataclass(frozen=True, slots=True)
class TableShape:
    """A table as its last Relation message announced it, for a sink's RowWriter (after
    the table's Schema record, so the sink knows this shape too)."""

    namespace: str
    name: str
    columns: tuple[str, ...]
    codecs: tuple[ValueCodec, ...]

    def reader(self, *, to_json: bool = False) -> RowReader:
        """The new-row reader of this shape (logical.fastpath): values decoded as the
        records hold them, or `to_json`, straight to what jsonenc writes for them."""
        return compile_row_reader(
            self.columns, [c.to_json if to_json else c.decode for c in self.codecs]
        )


class ChangeStats(Protocol):
    """What the builder counts into (observability.stats.StreamStats), named here so
    that changelog does not depend on observability, which depends on changelog."""

    def table_changes(self, schema: str, table: str) -> dict[str, int]:
        """The per-operation change counters of one table (kept per relation)."""
        ...

    def commit_received(self, end_lsn: int, commit_time: datetime) -> None:
        """A transaction was received in full."""
        ...


@dataclass(slots=True)
class RelationState:
    """A relation as last announced, ready to decode its tuples."""

    relation_id: int
    namespace: str
    name: str
    columns: tuple[str, ...]
    key_indexes: tuple[int, ...]
    """Positions of the replica-identity key columns (for 'K' old tuples)."""
    decoder: RowDecoder
    read_new: RowReader
    """Fused bytes → dict reader for new rows (logical.fastpath), same converters."""
    schema: dict[str, Any]
    primary_key: tuple[str, ...]
    ops: dict[str, int]
    """Changes emitted per operation: this table's counters in StreamStats."""
    write_row: RowWriter | None = None
    """The sink's writer of this table's new rows (RowWriter), if it has one."""

    def decode_key(self, values: Sequence[TupleValue]) -> dict[str, object]:
        """Only the identity columns of a 'K' tuple (the others are sent as NULL)."""
        row = self.decoder.decode(values)
        cols = self.columns
        return {cols[i]: row[cols[i]] for i in self.key_indexes}


class ChangelogBuilder:
    """Feed it every pgoutput message in order; it calls `emit` with records."""

    def __init__(
        self,
        catalog: CatalogLookup,
        emit: Callable[[Record], None],
        stats: ChangeStats | None = None,
        messages: bool = False,
        message_prefixes: tuple[str, ...] = (),
        via_partition_root: bool = False,
        row_writer: Callable[[TableShape], RowWriter | None] | None = None,
    ) -> None:
        self.catalog = catalog
        #: where records go (the sink's write)
        self.emit = emit
        #: the sink's RowWriter of a table shape (Sink.row_writer), asked at each Relation
        self.row_writer = row_writer
        self.stats = stats
        #: pgoutput messages fed, by tag byte (the stream folds them into its stats)
        self.tag_counts = [0] * 256
        self.relations: dict[int, RelationState] = {}
        #: forward logical decoding messages (--messages), only these prefixes if any
        self.messages = messages
        self.message_prefixes = frozenset(message_prefixes)
        #: the publication publishes via the partition root (--publish-via-partition-root)
        self.via_partition_root = via_partition_root
        self._emitted_schemas: dict[int, dict[str, Any]] = {}
        self.xid = 0
        self.commit_time = _EPOCH
        self.sequence = 0
        self.in_transaction = False
        self.begin_lsn = 0

    def feed(self, payload: bytes | memoryview, lsn: int) -> int:
        """Process one raw pgoutput message whose XLogData started at `lsn`.

        Returns the transaction's end LSN when the message was a Commit (a point the
        stream may checkpoint), else 0. A change takes one of two routes: an Insert's or
        Update's new row goes to the sink's RowWriter of its table, which encodes it from
        the bytes; anything else, and what the writer declines, becomes a record for
        `emit` (new rows by logical.fastpath's reader, the rest through decode() and
        handle()). Begin and Commit are read by logical.fastpath as well.
        """
        # memoryview.tobytes() rather than bytes(): the constructor first looks for a
        # __bytes__ method (bench/callgrind_stream.py)
        cls = payload.__class__
        # (mypy does not narrow on `cls is ...`)
        data: bytes = (
            payload  # type: ignore[assignment]
            if cls is bytes
            else payload.tobytes()  # type: ignore[union-attr]
            if cls is memoryview
            else bytes(payload)
        )
        tag = data[0] if data else 0  # an empty message fails in decode() below
        self.tag_counts[tag] += 1
        if tag in _NEW_ROW_OPERATIONS and len(data) > 6:
            rel = self.relations.get(relation_id(data, 1)[0])
            if rel is not None:
                op = _NEW_ROW_OPERATIONS[tag]
                write_row = rel.write_row
                if write_row is not None and write_row(
                    data, self.commit_time, self.sequence, lsn, self.xid, op
                ):
                    rel.ops[op] += 1
                    self.sequence += 1
                    return 0
                after = rel.read_new(data)
                if after is not None:
                    self._modification(rel, op, lsn, None, after)
                    return 0
        else:
            begin = begin_fields(data)
            if begin is not None:
                self._begin(lsn, begin[1], begin[2])
                return 0
            end_lsn = commit_end_lsn(data)
            if end_lsn is not None:
                self._commit(end_lsn)
                return end_lsn
        msg = decode(data)
        self.handle(msg, lsn)
        if msg.__class__ is Commit:
            return msg.end_lsn
        return 0

    def handle(self, msg: PgOutputMessage, lsn: int) -> None:
        """Process one decoded message whose XLogData started at `lsn`."""
        # Ordered by frequency: row changes dominate every real workload.
        cls = msg.__class__
        if cls is Insert:
            self._insert(msg, lsn)  # type: ignore[arg-type]
        elif cls is Update:
            self._update(msg, lsn)  # type: ignore[arg-type]
        elif cls is Delete:
            self._delete(msg, lsn)  # type: ignore[arg-type]
        elif cls is Begin:
            assert isinstance(msg, Begin)
            self._begin(lsn, msg.commit_time, msg.xid)
        elif cls is Commit:
            assert isinstance(msg, Commit)
            self._commit(msg.end_lsn)
        elif cls is Relation:
            assert isinstance(msg, Relation)
            self._relation(msg, lsn)
        elif cls is Truncate:
            assert isinstance(msg, Truncate)
            self._truncate(msg, lsn)
        elif cls is Type:
            assert isinstance(msg, Type)
            self.catalog.invalidate_type(msg.type_oid)
        elif cls is Message:
            assert isinstance(msg, Message)
            self._message(msg, lsn)
        elif cls is Origin:
            pass  # the origin of replicated-in transactions is not part of the records
        else:
            raise DecodeError(f"unexpected message {cls.__name__} in the change stream")

    def _commit(self, end_lsn: int) -> None:
        self.in_transaction = False
        if self.stats is not None:  # starts the transaction's lag clock
            self.stats.commit_received(end_lsn, self.commit_time)

    def _begin(self, lsn: int, commit_time: int, xid: int) -> None:
        self.xid = xid
        self.commit_time = pg_timestamp_to_datetime(commit_time)
        self.sequence = 0
        self.in_transaction = True
        self.begin_lsn = lsn

    # -- relations -----------------------------------------------------------

    def _relation(self, msg: Relation, lsn: int) -> None:
        primary_key = self.catalog.primary_key(msg.relation_id)
        codecs = [self.catalog_codec(c.type_oid, c.type_modifier) for c in msg.columns]
        names = tuple(c.name for c in msg.columns)
        # The catalog's primary key marks the key; without one, the replica
        # identity index (pgoutput's key flag) does, except under FULL where
        # every column is flagged and nothing is a key. REPLICA IDENTITY USING
        # INDEX makes the index the key even beside a primary key: a DELETE (and
        # an UPDATE that changes it) identifies the row by the index columns only,
        # so they are what a consumer can key on (docs/changes.md).
        if primary_key and msg.replica_identity != "i":
            key_names = set(primary_key)
        elif msg.replica_identity != "f":
            key_names = {c.name for c in msg.columns if c.is_key}
            primary_key = tuple(c.name for c in msg.columns if c.is_key)
        else:
            key_names = set()
        schema = avro_row_schema(
            msg.namespace,
            msg.name,
            [
                RowColumn(name=n, codec=codec, is_key=n in key_names)
                for n, codec in zip(names, codecs, strict=True)
            ],
            primary_key=primary_key,
        )
        converters = [c.decode for c in codecs]
        rel = RelationState(
            relation_id=msg.relation_id,
            namespace=msg.namespace,
            name=msg.name,
            columns=names,
            key_indexes=tuple(i for i, c in enumerate(msg.columns) if c.is_key),
            decoder=RowDecoder(names, converters),
            read_new=compile_row_reader(names, converters),
            ops=(
                self.stats.table_changes(msg.namespace, msg.name)
                if self.stats is not None
                else dict.fromkeys(Operation, 0)
            ),
            schema=schema,
            primary_key=primary_key,
        )
        # pgoutput re-sends Relation after any invalidation (even without a
        # change of shape): only a different schema is news for consumers.
        # Publishing via the partition root, PostgreSQL 15 announces the leaf a
        # change came from right after the root, but the change itself comes
        # under the root: the leaf never has a change, so no Schema either.
        if self._emitted_schemas.get(msg.relation_id) != schema and not (
            self.via_partition_root and self.catalog.is_partition(msg.relation_id)
        ):
            self._emitted_schemas[msg.relation_id] = schema
            self.emit(
                Schema(
                    timestamp=self.commit_time,
                    # pgoutput sends Relation messages with no WAL position of
                    # their own (0/0): the transaction's start stands in.
                    lsn=lsn or self.begin_lsn,
                    namespace=msg.namespace,
                    name=msg.name,
                    schema=schema,
                    relation_id=msg.relation_id,
                    primary_key=primary_key,
                    missing=self._missing(msg.relation_id, names, converters),
                )
            )
            log.debug("schema of %s.%s emitted", msg.namespace, msg.name)
        if self.row_writer is not None:
            # after the Schema record: the sink encodes this shape of the table
            rel.write_row = self.row_writer(
                TableShape(msg.namespace, msg.name, names, tuple(codecs))
            )
        self.relations[msg.relation_id] = rel

    def _missing(
        self,
        relation_id: int,
        names: Sequence[str],
        converters: Sequence[Callable[[bytes], object]],
    ) -> dict[str, object]:
        """The table's columns' missing values (Schema.missing), decoded as its rows are."""
        catalog = self.catalog
        if not isinstance(catalog, MissingValueLookup):
            return {}
        decoders = dict(zip(names, converters, strict=True))
        texts = catalog.missing_values(relation_id)
        return {n: decoders[n](t.encode()) for n, t in texts.items() if n in decoders}

    def catalog_codec(self, type_oid: int, typmod: int) -> ValueCodec:
        return codec_for(self.catalog.pg_type(type_oid), typmod)

    def _rel(self, relation_id: int) -> RelationState:
        try:
            return self.relations[relation_id]
        except KeyError:
            raise DecodeError(
                f"change for relation {relation_id} before its Relation message"
            ) from None

    # -- changes -------------------------------------------------------------

    def _modification(
        self,
        rel: RelationState,
        op: Operation,
        lsn: int,
        before: dict[str, object] | None,
        after: dict[str, object] | None,
    ) -> None:
        rel.ops[op] += 1
        self.emit(
            Modification(
                self.commit_time,
                self.sequence,
                lsn,
                self.xid,
                op,
                rel.namespace,
                rel.name,
                before,
                after,
            )
        )
        self.sequence += 1

    def _insert(self, msg: Insert, lsn: int) -> None:
        # Most inserts take feed()'s fast path; this is the general one.
        rel = self._rel(msg.relation_id)
        self._modification(rel, Operation.INSERT, lsn, None, rel.decoder.decode(msg.new))

    def _update(self, msg: Update, lsn: int) -> None:
        rel = self.relations.get(msg.relation_id) or self._rel(msg.relation_id)
        decode = rel.decoder.decode
        after = decode(msg.new)
        before: dict[str, object] | None = None
        if msg.old is not None:
            before = rel.decode_key(msg.old) if msg.old_is_key else decode(msg.old)
        if UNCHANGED_TOAST in msg.new and before is not None and not msg.old_is_key:
            # REPLICA IDENTITY FULL logs the old row detoasted: the unchanged
            # value is right there. Otherwise the marker stays (README, TOAST).
            for column, value in after.items():
                if value is UNCHANGED_TOAST:
                    old = before.get(column, UNCHANGED_TOAST)
                    if old is not UNCHANGED_TOAST:
                        after[column] = old
        self._modification(rel, Operation.UPDATE, lsn, before, after)

    def _delete(self, msg: Delete, lsn: int) -> None:
        rel = self.relations.get(msg.relation_id) or self._rel(msg.relation_id)
        before = rel.decode_key(msg.old) if msg.old_is_key else rel.decoder.decode(msg.old)
        self._modification(rel, Operation.DELETE, lsn, before, None)

    def _truncate(self, msg: Truncate, lsn: int) -> None:
        # One record per table, all at the statement's LSN; the options of the
        # statement are repeated on each (docs/changes.md, TRUNCATE).
        for relation_id in msg.relation_ids:
            rel = self._rel(relation_id)
            rel.ops[Operation.TRUNCATE] += 1
            self.emit(
                Truncation(
                    self.commit_time,
                    self.sequence,
                    lsn,
                    self.xid,
                    Operation.TRUNCATE,
                    rel.namespace,
                    rel.name,
                    None,
                    None,
                    msg.cascade,
                    msg.restart_identity,
                )
            )
            self.sequence += 1

    def _message(self, msg: Message, lsn: int) -> None:
        """A pg_logical_emit_message() message; only sent when --messages asked for them.

        A transactional message arrives inside its transaction (after Begin, so the
        commit time and xid are known); a non-transactional one arrives on its own,
        outside any transaction, as soon as it is decoded: it has neither. It does not
        take a `sequence` number, so the Modifications of a transaction are numbered
        the same with and without --messages.
        """
        if not self.messages:
            return
        if self.message_prefixes and msg.prefix not in self.message_prefixes:
            return
        if msg.transactional:
            # the transaction's id, as on its Modifications (inside a streamed
            # transaction msg.xid may be a subtransaction's)
            timestamp: datetime | None = self.commit_time
            xid: int | None = self.xid
        else:
            timestamp, xid = None, None
        self.emit(
            MessageRecord(
                timestamp, msg.lsn or lsn, xid, msg.transactional, msg.prefix, msg.content
            )
        )
