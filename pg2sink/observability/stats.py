"""StreamStats: the plain counters the replication loop updates, read at scrape time.

The loop handles ~150k changes/s in pure Python, so nothing here takes a lock
or calls into prometheus_client. The hot path touches plain ints and dicts:

    per change       ops = stats.table_changes(schema, table)   (once per relation)
                     ops[operation] += 1                          (per change)
    per message      stats.messages[type] += n  (or add up locally, bulk-add)
    per commit       stats.commit_received(end_lsn, commit_time)
    per flush        stats.observe_flush(seconds, records); stats.acknowledge(lsn)
    per ack          stats.write_seconds.observe(seconds)
    per keepalive    stats.heartbeats += 1
    per poll         stats.set_server_position(position); stats.publication_tables = n

Readers (the metrics collector and the HTTP API, in another thread) only
read; a scrape may see one counter a few increments ahead of another, never a
torn value. Every field is a count, an LSN, a time or a short reason string:
no DSN, no setting, no secret (keep it that way: /stats serves all of it).
"""

from __future__ import annotations

import bisect
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from pg2sink.changelog.records import Operation
from pg2sink.errors import Pg2SinkError
from pg2sink.logs import PIPELINE

__all__ = [
    "ERROR_KINDS",
    "FLUSH_RECORDS_BUCKETS",
    "IMPORT_STATES",
    "LATENCY_BUCKETS",
    "MESSAGE_TYPES",
    "OPERATIONS",
    "Buckets",
    "ImportProgress",
    "LogCounter",
    "ServerPosition",
    "StreamStats",
    "error_kind",
]

#: Operations of Modification records (README "Records"; IMPORT for snapshot rows).
#: The per-table dicts are keyed by these enum members: the records carry the
#: same objects, so `ops[record.operation] += 1` matches by identity (faster than a
#: lookup by an equal plain string). Plain strings work too.
OPERATIONS: tuple[Operation, ...] = tuple(Operation)

#: pgoutput message types counted in StreamStats.messages (lower-case tag names).
MESSAGE_TYPES = (
    "begin",
    "commit",
    "relation",
    "insert",
    "update",
    "delete",
    "truncate",
    "type",
    "origin",
    "message",
)

#: Kinds of StreamStats.errors, one per class of the error tree (error_kind()).
ERROR_KINDS = (
    "config",
    "source",
    "connect",
    "server_config",
    "slot_busy",
    "decode",
    "sink",
    "sink_unavailable",
    "import_failed",
    "internal",
)

#: States an import goes through; pg2sink_import_state has one series per state.
IMPORT_STATES = ("pending", "running", "done", "failed")

#: Upper bounds (seconds) of the sink latency histograms: fsync of a local file
#: sits in the low milliseconds, a Kafka flush in tens to hundreds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

#: Upper bounds of the records-per-flush histogram.
FLUSH_RECORDS_BUCKETS: tuple[float, ...] = (
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
)

#: Most transactions remembered between two acknowledgements (see commit_received).
_PENDING_MAX = 100_000


class Buckets:
    """A histogram of plain ints: `observe()` is a bisect and two additions.

    `counts[i]` holds the observations in (bounds[i-1], bounds[i]]; the last
    slot holds those above every bound (+Inf). The collector makes them
    cumulative at scrape time.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"bucket bounds must increase strictly: {bounds}")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs ending with +Inf, as Prometheus wants them."""
        counts = list(self.counts)  # one consistent copy
        out: list[tuple[str, int]] = []
        total = 0
        for bound, n in zip(self.bounds, counts, strict=False):
            total += n
            out.append((_le(bound), total))
        out.append(("+Inf", total + counts[-1]))
        return out


def _le(bound: float) -> str:
    return repr(float(bound))


@dataclass
class ImportProgress:
    """Progress of one table's snapshot import."""

    rows_read: int = 0
    """Rows read from the table so far."""
    rows_estimated: int | None = None
    """The planner's estimate of the table's rows (pg_class.reltuples), if known."""
    state: str = "pending"
    """One of IMPORT_STATES."""
    error: str | None = None
    """Why the last attempt failed (the job's error), None after a success."""


@dataclass(frozen=True)
class ServerPosition:
    """One sample of the server's WAL position and our slot (observability.position)."""

    wal_lsn: int
    """pg_current_wal_lsn() (pg_last_wal_replay_lsn() on a standby)."""
    restart_lsn: int | None
    """The slot's restart_lsn: WAL from here on is retained for it (None: no slot)."""
    active: bool | None
    """Whether a walsender streams from the slot (None: no slot)."""
    wal_status: str | None = None
    """pg_replication_slots.wal_status: reserved, extended, unreserved, lost."""
    safe_wal_size: int | None = None
    """Bytes of WAL before the slot risks 'lost' (None: unlimited, or no slot)."""
    inactive_since: float | None = None
    """Unix seconds since the slot is inactive (PostgreSQL 17+; None: active or unknown)."""
    invalidation_reason: str | None = None
    """Why the server invalidated the slot (observability.position); None: valid."""


def error_kind(error: BaseException) -> str:
    """The `kind` label of an error: its pg2sink class in snake case, minus 'Error'.

    ConnectError → connect, SlotBusyError → slot_busy, SinkUnavailableError →
    sink_unavailable; anything not classified further (not a Pg2SinkError, or
    the root class itself) is 'internal'.
    """
    if not isinstance(error, Pg2SinkError) or type(error) is Pg2SinkError:
        return "internal"
    name = type(error).__name__.removesuffix("Error")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class StreamStats:
    """Everything pg2sink reports about its stream, as plain attributes.

    Writers: the replication loop, the sink, the import engine (one thread
    each). Readers: the collector and the HTTP handlers.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.started_at = clock()
        #: Constant labels of pg2sink_info: slot, publication, sink (never a DSN).
        self.info: dict[str, str] = {}

        # -- the stream --------------------------------------------------------
        #: pgoutput messages received, by type (MESSAGE_TYPES). Known label values
        #: start at 0 so that rate() and increase() see the first occurrence.
        self.messages: dict[str, int] = dict.fromkeys(MESSAGE_TYPES, 0)
        #: Changes emitted, by (schema, table) then operation (OPERATIONS).
        self.tables: dict[tuple[str, str], dict[str, int]] = {}
        #: Highest LSN received from the server (commit ends, keepalive positions).
        self.received_lsn = 0
        #: Highest LSN the sink acknowledged and pg2sink confirmed to the server.
        self.confirmed_lsn = 0
        #: Commit time of the last transaction the sink acknowledged.
        self.last_ack_commit_time: datetime | None = None
        #: Primary keepalive messages received from the server.
        self.heartbeats = 0
        #: Tables in the publication after the last reconciliation.
        self.publication_tables = 0
        #: Whether the publication publishes each action (insert, update, delete,
        #: truncate), after the last reconciliation (empty: not read yet).
        self.publication_actions: dict[str, bool] = {}
        #: (end LSN, commit time) of transactions received but not acknowledged yet.
        self._pending: deque[tuple[int, datetime]] = deque()

        # -- the server, sampled every poll interval ----------------------------
        #: pg_current_wal_lsn() at the last poll (0: never sampled).
        self.server_wal_lsn = 0
        #: The slot's restart_lsn at the last poll (0: unknown).
        self.slot_restart_lsn = 0
        #: Whether the slot was active at the last poll (None: unknown).
        self.slot_active: bool | None = None
        #: The slot's health at the last poll (ServerPosition's fields; None: unknown).
        self.slot_wal_status: str | None = None
        self.slot_safe_wal_size: int | None = None
        self.slot_inactive_since: float | None = None
        self.slot_invalidation_reason: str | None = None
        #: When the server was last sampled (clock seconds; None: never).
        self.server_sampled_at: float | None = None

        # -- the sink ----------------------------------------------------------
        #: Duration of each durable flush (sink.flush()).
        self.flush_seconds = Buckets(LATENCY_BUCKETS)
        #: Records written since the previous flush, observed at each flush.
        self.flush_records = Buckets(FLUSH_RECORDS_BUCKETS)
        #: From a transaction's commit written to the sink until the sink acknowledged it:
        #: the oldest waiting transaction, once per acknowledgement (the Streamer).
        self.write_seconds = Buckets(LATENCY_BUCKETS)
        #: Bytes the sink holds written but not yet durable (its buffer or queue).
        self.raw_buffer_bytes = 0

        # -- problems ----------------------------------------------------------
        #: Errors by kind (error_kind()); every kind starts at 0, as messages do.
        self.errors: dict[str, int] = dict.fromkeys(ERROR_KINDS, 0)
        #: Log lines by level (warning, error, critical), counted by LogCounter.
        self.log_messages: dict[str, int] = {"warning": 0, "error": 0, "critical": 0}

        # -- imports -----------------------------------------------------------
        #: Snapshot imports by (schema, table).
        self.imports: dict[tuple[str, str], ImportProgress] = {}
        #: Spark sessions the import engine found dead (JVM, gateway, master) and replaced.
        self.spark_sessions_lost = 0

        # -- health (GET /status) ----------------------------------------------
        self.replication_connected = False
        #: Why the replication connection is not healthy ("" when it is).
        self.replication_reason = "not connected yet"
        #: Why the session's sink failed ("" when open and fine): sink_up, sink_down.
        self._sink_failure = "not open yet"
        #: The sink's own report of an outage ("" when none): sink_outage.
        self._sink_outage = ""

    # -- hot-path helpers ------------------------------------------------------

    def table_changes(self, schema: str, table: str) -> dict[str, int]:
        """The per-operation counters of one table, created at zero on first use.

        Call once per relation and keep the dict: per change, `ops[operation] += 1`
        costs one dict update (the operation strings hash once, then from cache).
        """
        key = (schema, table)
        ops = self.tables.get(key)
        if ops is None:
            ops = dict.fromkeys(OPERATIONS, 0)
            self.tables[key] = ops
        return ops

    def commit_received(self, end_lsn: int, commit_time: datetime) -> None:
        """A transaction was received in full; it waits for the sink's acknowledgement.

        Feeds pg2sink_replication_lag_seconds. While the sink acknowledges
        nothing the list stops growing at _PENDING_MAX transactions: the last
        entry then stretches over the newer ones and keeps its older commit time,
        so the lag errs on the high side, never the low.
        """
        pending = self._pending
        if len(pending) < _PENDING_MAX:
            pending.append((end_lsn, commit_time))
        else:
            pending[-1] = (end_lsn, pending[-1][1])
        if end_lsn > self.received_lsn:
            self.received_lsn = end_lsn

    # -- per flush / per poll ----------------------------------------------------

    def acknowledge(self, lsn: int) -> None:
        """The sink durably holds everything below `lsn`, which is confirmed to the server."""
        if lsn > self.confirmed_lsn:
            self.confirmed_lsn = lsn
        pending = self._pending
        while pending and pending[0][0] <= lsn:
            self.last_ack_commit_time = pending.popleft()[1]

    def observe_flush(self, seconds: float, records: int) -> None:
        """One durable flush took `seconds` and covered `records` records."""
        self.flush_seconds.observe(seconds)
        self.flush_records.observe(records)

    def set_server_position(self, position: ServerPosition) -> None:
        self.server_wal_lsn = position.wal_lsn
        self.slot_restart_lsn = position.restart_lsn or 0
        self.slot_active = position.active
        self.slot_wal_status = position.wal_status
        self.slot_safe_wal_size = position.safe_wal_size
        self.slot_inactive_since = position.inactive_since
        self.slot_invalidation_reason = position.invalidation_reason
        self.server_sampled_at = self.clock()

    def count_error(self, error: BaseException | str) -> None:
        """Count one error, by its kind (error_kind()) or an explicit kind string."""
        kind = error if isinstance(error, str) else error_kind(error)
        self.errors[kind] = self.errors.get(kind, 0) + 1

    # -- sessions and health ------------------------------------------------------

    def replication_up(self) -> None:
        """A replication session started streaming.

        The server resends everything after the confirmed position, so what
        was pending from the previous session is received again.
        """
        self._pending.clear()
        self.replication_connected = True
        self.replication_reason = ""

    def replication_down(self, reason: str) -> None:
        self.replication_connected = False
        self.replication_reason = reason or "disconnected"

    def sink_up(self) -> None:
        """The sink is open for a new session (an outage it reports still counts)."""
        self._sink_failure = ""

    def sink_down(self, reason: str) -> None:
        """The session ended with a sink error."""
        self._sink_failure = reason or "unhealthy"

    def sink_outage(self, reason: str) -> None:
        """The sink's own evidence that it cannot deliver now ("" once it can again),
        which outlasts sessions: the Kafka sink while no broker answers."""
        self._sink_outage = reason

    @property
    def sink_healthy(self) -> bool:
        return not (self._sink_failure or self._sink_outage)

    @property
    def sink_reason(self) -> str:
        """Why the sink is not healthy ("" when it is)."""
        return self._sink_failure or self._sink_outage

    @property
    def healthy(self) -> bool:
        return (
            self.replication_connected
            and self.sink_healthy
            and self.slot_invalidation_reason is None
        )

    # -- derived values (read side) ---------------------------------------------------

    @property
    def changes(self) -> dict[tuple[str, str, str], int]:
        """Changes emitted, keyed (schema, table, operation)."""
        return {
            (schema, table, str(op)): n
            for (schema, table), ops in _snapshot(self.tables).items()
            for op, n in dict(ops).items()
        }

    def lag_bytes(self) -> int | None:
        """Server WAL position minus the confirmed LSN (None before the first poll)."""
        if not self.server_wal_lsn:
            return None
        return max(0, self.server_wal_lsn - self.confirmed_lsn)

    def lag_seconds(self, now: float | None = None) -> float:
        """How long the oldest received but unacknowledged transaction has been committed.

        0 when the sink has acknowledged every transaction received. This is "now
        minus the commit time of the last change acknowledged" made robust to idle
        periods: after an idle hour the last acknowledged commit is an hour old,
        yet nothing is late; what is late is what waits, and it waits since its
        own commit.
        """
        try:
            oldest = self._pending[0][1]
        except IndexError:
            return 0.0
        now = self.clock() if now is None else now
        return max(0.0, now - oldest.timestamp())

    def wal_retained_bytes(self) -> int | None:
        """WAL the server keeps for our slot: its position minus the slot's restart_lsn."""
        if not self.server_wal_lsn or not self.slot_restart_lsn:
            return None
        return max(0, self.server_wal_lsn - self.slot_restart_lsn)


def _snapshot(d: dict[tuple[str, str], dict[str, int]]) -> dict[tuple[str, str], dict[str, int]]:
    # dict(d) copies in C without running Python code, so the GIL makes it atomic
    # with respect to the loop thread adding a table.
    return dict(d)


class LogCounter(logging.Handler):
    """Counts WARNING and worse log records into StreamStats.log_messages.

    Attach to the root logger (`logging.getLogger().addHandler(LogCounter(stats))`);
    it formats nothing and writes nothing. With `pipeline` (a process running several),
    it counts only the lines logged in that pipeline's thread (logs.PIPELINE).
    """

    def __init__(self, stats: StreamStats, pipeline: str | None = None) -> None:
        super().__init__(logging.WARNING)
        self.stats = stats
        self.pipeline = pipeline

    def emit(self, record: logging.LogRecord) -> None:
        if self.pipeline is not None and PIPELINE.get() != self.pipeline:
            return
        level = record.levelname.lower()
        counts = self.stats.log_messages
        counts[level] = counts.get(level, 0) + 1
