"""What the replication loop does with each decoded message.

ChangelogHandler builds records and writes them to a sink (the normal mode);
DecodeOnlyHandler prints each pgoutput message readably and acknowledges
nothing, so `--decode-only` never moves the slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TextIO

from pg2sink.catalog.catalog import CatalogLookup
from pg2sink.changelog.builder import ChangelogBuilder
from pg2sink.changelog.records import Record
from pg2sink.logical.decoder import decode
from pg2sink.logical.lsn import format_lsn
from pg2sink.logical.messages import (
    Begin,
    Commit,
    PgOutputMessage,
    Relation,
    StreamStart,
    StreamStop,
)
from pg2sink.logical.render import render
from pg2sink.observability.stats import StreamStats
from pg2sink.sinks.base import ReportsHealth, Sink, WritesRows

#: Where one pgoutput message goes: ChangelogBuilder.feed, or a stage's feed before it.
Feed = Callable[[bytes | memoryview, int], int]


class Stage(Protocol):
    """Something in front of the builder (the import gate's GateStage): its feed passes
    a message on to the builder's, leaves it out, or raises pipeline.Held."""

    def feed(self, payload: bytes | memoryview, lsn: int) -> int:
        """As ChangelogBuilder.feed."""
        ...

    def bind(self) -> Feed:
        """The feed the stream uses until it asks again (at its next housekeeping step,
        in the stream thread): the stage's own while it has something to decide, else
        the builder's, so that an idle stage costs nothing per message."""
        ...


class ChangelogHandler:
    """pgoutput messages → [stage →] Schema/Modification/Message records → sink."""

    def __init__(
        self,
        catalog: CatalogLookup,
        sink: Sink,
        stats: StreamStats | None = None,
        messages: bool = False,
        message_prefixes: tuple[str, ...] = (),
        via_partition_root: bool = False,
        annotate: Callable[[Record], Record] | None = None,
    ) -> None:
        self.sink = sink
        emit = sink.write
        if annotate is not None:  # routing's masks: Schema records say which columns
            write = sink.write

            def emit(record: Record) -> None:
                write(annotate(record))

        self.builder = ChangelogBuilder(
            catalog,
            emit,
            stats=stats,
            messages=messages,
            message_prefixes=message_prefixes,
            via_partition_root=via_partition_root,
            row_writer=sink.row_writer if isinstance(sink, WritesRows) else None,
        )
        if isinstance(sink, ReportsHealth) and stats is not None:
            sink.report_health(stats)
        # bound once: these run per change and per commit
        self._builder_feed: Feed = self.builder.feed
        self._stage: Stage | None = None
        self.checkpoint = sink.checkpoint
        self.start_flush = sink.start_flush
        self.acknowledged = sink.acknowledged
        self.pending_bytes = sink.pending_bytes
        self.tag_counts = self.builder.tag_counts

    @property
    def feed(self) -> Feed:
        """The feed for the loop, which takes it anew at each housekeeping step (never
        per change): the builder's, or what the stage in front of it says (Stage.bind)."""
        stage = self._stage
        return self._builder_feed if stage is None else stage.bind()

    def put_in_front(self, stage: Stage) -> None:
        """Messages go through `stage` before the builder, whenever it says so."""
        self._stage = stage

    @property
    def in_transaction(self) -> bool:
        return self.builder.in_transaction

    def flush(self) -> int | None:
        return self.sink.flush()

    def close(self) -> None:
        self.sink.close()


class DecodeOnlyHandler:
    """Prints one readable line per message; confirms nothing."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.relations: dict[int, Relation] = {}
        self._in_transaction = False
        #: between Stream Start and Stream Stop (--streaming): data messages carry an xid
        self._in_stream = False
        self.tag_counts = [0] * 256

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    def feed(self, payload: bytes | memoryview, lsn: int) -> int:
        if payload:
            self.tag_counts[payload[0]] += 1
        msg = decode(payload, self._in_stream)
        if isinstance(msg, StreamStart | StreamStop):
            self._in_stream = isinstance(msg, StreamStart)
        self.handle(msg, lsn)
        return msg.end_lsn if isinstance(msg, Commit) else 0

    def handle(self, msg: PgOutputMessage, lsn: int) -> None:
        if isinstance(msg, Relation):
            self.relations[msg.relation_id] = msg
        elif isinstance(msg, Begin):
            self._in_transaction = True
        elif isinstance(msg, Commit):
            self._in_transaction = False
        self.out.write(f"{format_lsn(lsn)} {render(msg, self.relations)}\n")

    def checkpoint(self, lsn: int) -> None:
        pass

    def start_flush(self) -> None:
        self.out.flush()

    def acknowledged(self) -> int | None:
        return None

    def pending_bytes(self) -> int:
        return 0

    def flush(self) -> int | None:
        self.out.flush()
        return None

    def close(self) -> None:
        self.out.flush()
