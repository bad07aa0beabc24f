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
    from datetime import datetime

    from pg2sink.changelog.builder import RawRowWriter
    from pg2sink.changelog.records import Operation
    from pg2sink.observability.stats import StreamStats


class Sink(Protocol):
    #: True when the sink writes JSON (jsonenc): row values may then be decoded
    #: straight to their JSON form (ValueCodec.to_json) instead of Python values.
    json_values: bool

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
class WritesNewRows(Protocol):
    """A sink that takes an Insert's or Update's new row as plain arguments, without a
    Modification record (the file sink): the changelog's fast path calls it per change
    (ChangelogBuilder's `emit_new_row`)."""

    def write_new_row(
        self,
        timestamp: datetime,
        sequence: int,
        lsn: int,
        xid: int,
        operation: Operation,
        namespace: str,
        name: str,
        after: dict[str, object] | None,
        before: dict[str, object] | None = None,
    ) -> None: ...


@runtime_checkable
class WritesRawRows(Protocol):
    """A sink that writes a table's new rows straight from pgoutput's bytes (the Kafka
    sink's C encoder): ChangelogBuilder's `raw_writers`."""

    def raw_row_writer(self, namespace: str, name: str) -> RawRowWriter | None: ...
