"""The Sink protocol: how records leave pg2sink, and how durability comes back.

Lifecycle: `open()`, then any number of `write(record)` and
`checkpoint(lsn)` calls, `start_flush()` whenever the stream wants
durability, `flush()` once before `close()` at the end.

`checkpoint(lsn)` says "every record written so far belongs to WAL below
`lsn`" (the end of a committed transaction, or a keepalive position while
no transaction is open). `start_flush()` begins making everything written
so far durable without waiting (an fsync in a background thread, a poll of
the Kafka producer), so the stream keeps decoding while the I/O happens;
`acknowledged()` returns the highest checkpoint durably accepted so far.
`flush()` does the same but waits until everything written is durable (or
the sink's bound on waiting passes) and returns `acknowledged()`. The
subscription confirms to PostgreSQL only LSNs a sink has returned from
`acknowledged()` or `flush()`, never more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pg2sink.changelog.records import Record

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import pyarrow as pa  # type: ignore[import-untyped]

    from pg2sink.changelog.batches import ImportTable
    from pg2sink.changelog.builder import RowWriter, TableShape
    from pg2sink.changelog.records import Schema
    from pg2sink.observability.stats import StreamStats


class Sink(Protocol):
    def open(self) -> None: ...

    def write(self, record: Record) -> None: ...

    def checkpoint(self, lsn: int) -> None: ...

    def start_flush(self) -> None: ...

    def pending_bytes(self) -> int:
        """Bytes written and not yet durably accepted (pg2sink_raw_buffer_bytes)."""
        ...

    def flush(self) -> int | None: ...

    def acknowledged(self) -> int | None: ...

    def close(self) -> None: ...


@runtime_checkable
class ReportsHealth(Protocol):
    """A sink that tells outages and recoveries of its server itself (Kafka): it reports
    them to the stream's stats, which `/status` reads."""

    def report_health(self, stats: StreamStats) -> None: ...


@runtime_checkable
class UsesSlot(Protocol):
    """A sink that needs the replication slot's name (Kafka --exactly-once: its default
    transactional id): told once, before `open()`."""

    def use_slot(self, slot: str) -> None: ...


@runtime_checkable
class WritesRows(Protocol):
    """A sink that writes a table's new rows (an Insert's, an Update's) straight from
    pgoutput's bytes, without a Modification record: the file, NATS and null sinks read
    the row with their converters, the Kafka sink encodes it in C. The changelog builder
    asks at each Relation message (after the table's Schema record) and calls the writer
    per change; None, or a writer returning False, sends the change to `write` as a
    record instead."""

    def row_writer(self, table: TableShape) -> RowWriter | None: ...


@runtime_checkable
class PublishesMessages(Protocol):
    """A message sink that publishes a message to a destination the data names (the
    outbox, routing/outbox.py): Kafka to that topic, NATS to that subject under its
    prefix. Through the sink's own producer, so that its acknowledgements cover them."""

    def publish(
        self,
        destination: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[tuple[str, bytes | None]],
        lsn: int,
    ) -> None: ...


class ImportTarget(Protocol):
    """Where an import's rows go (docs/imports.md): made from the sink's config by its
    entry (sinks/entries.py), then pickled to Spark's driver code and
    executors, so it holds settings only (no connection, no open file).

    On the driver, `begin(schema)` makes the table's Schema record durable before any
    row and returns the target the executors get (Kafka Avro: with the subjects' ids the
    driver registered). On each executor, `write_rows` writes one partition's rows as
    IMPORT Modifications with the sink's own encoders and returns only once they are
    durable: the partition is then marked done."""

    def problem(self) -> str | None:
        """Why imports cannot write here (standard output, a sink without settings), or
        None."""
        ...

    def begin(self, schema: Schema) -> ImportTarget: ...

    def write_rows(self, table: ImportTable, batches: Iterator[pa.RecordBatch]) -> int:
        """Write every row of the batches, durably; the number of rows."""
        ...
