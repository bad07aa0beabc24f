"""Prometheus metrics built from a StreamStats at scrape time.

`StatsCollector.collect()` turns the plain counters of StreamStats into
metric families when Prometheus scrapes, so the replication loop never calls
prometheus_client (whose metric objects take a lock per update). Every name
starts with `pg2sink_`; docs/observability.md lists each one with its type,
labels and meaning, and a test keeps that list and this module in step.

`make_registry()` builds a dedicated CollectorRegistry (never the global one)
holding this collector plus the standard process_* and python_* collectors. For a
process running several pipelines it takes their StreamStats by name: every pg2sink_*
sample then carries a `pipeline` label (one family per name, the pipelines' samples in
it); a process streaming one pipeline alone exposes the series unlabelled, as always.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from pg2sink import __version__
from pg2sink.observability.stats import IMPORT_STATES, Buckets, StreamStats

__all__ = ["PipelinesCollector", "StatsCollector", "make_registry"]

#: A labelled counter's key: one label value, or the values of its three labels.
_Key = TypeVar("_Key", str, tuple[str, str, str])

#: Labels of pg2sink_info, in this order (missing ones are empty strings).
INFO_LABELS = ("version", "slot", "publication", "sink")


class StatsCollector(Collector):
    """Exposes one StreamStats as pg2sink_* metric families."""

    def __init__(self, stats: StreamStats, clock: Callable[[], float] = time.time) -> None:
        self.stats = stats
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        """Every pg2sink_* family, in the order docs/observability.md lists them."""
        s = self.stats
        yield from _health(s)
        yield from _stream(s, self.clock())
        yield from _server(s)
        yield from _sink(s)
        yield from _problems(s)
        yield from _imports(s)


def _health(s: StreamStats) -> Iterator[Metric]:
    """What runs and whether it is healthy: pg2sink_info, _up and the two parts' health."""
    info = GaugeMetricFamily(
        "pg2sink_info",
        "pg2sink version and what it streams (constant 1)",
        labels=INFO_LABELS,
    )
    labels = {"version": __version__, **s.info}
    info.add_metric([labels.get(k, "") for k in INFO_LABELS], 1)
    yield info
    yield _gauge(
        "pg2sink_up",
        "1 when the replication connection and the sink are healthy and the slot valid "
        "(GET /status 200)",
        s.healthy,
    )
    yield _gauge(
        "pg2sink_replication_connected",
        "1 while the replication connection streams",
        s.replication_connected,
    )
    yield _gauge("pg2sink_sink_healthy", "1 while the sink accepts records", s.sink_healthy)


def _stream(s: StreamStats, now: float) -> Iterator[Metric]:
    """The stream: messages and changes counted, LSNs received and confirmed, lag in time."""
    yield _labelled_counter(
        "pg2sink_messages", "pgoutput messages received, by type", ["type"], dict(s.messages)
    )
    yield _labelled_counter(
        "pg2sink_changes",
        "changes emitted to the sink, by table and operation",
        ["schema", "table", "operation"],
        s.changes,
    )
    yield _gauge(
        "pg2sink_received_lsn_bytes",
        "highest WAL position received from the server (LSN as a byte offset)",
        s.received_lsn,
    )
    yield _gauge(
        "pg2sink_confirmed_lsn_bytes",
        "highest WAL position the sink holds durably and pg2sink confirmed to the server",
        s.confirmed_lsn,
    )
    if s.last_ack_commit_time is not None:
        yield _gauge(
            "pg2sink_last_ack_commit_timestamp_seconds",
            "commit time (Unix seconds) of the last transaction the sink acknowledged",
            s.last_ack_commit_time.timestamp(),
        )
    yield _gauge(
        "pg2sink_replication_lag_seconds",
        "seconds since the commit of the oldest transaction received but not yet "
        "acknowledged by the sink; 0 when caught up",
        s.lag_seconds(now),
    )
    yield CounterMetricFamily(
        "pg2sink_heartbeats",
        "primary keepalive messages received from the server",
        value=s.heartbeats,
    )
    yield _gauge(
        "pg2sink_publication_tables",
        "tables in the publication after the last reconciliation",
        s.publication_tables,
    )
    if s.publication_actions:
        publishes = GaugeMetricFamily(
            "pg2sink_publication_publishes",
            "1 when the publication publishes the action (its publish option); 0: those "
            "changes never reach pg2sink",
            labels=["action"],
        )
        for action, on in s.publication_actions.items():
            publishes.add_metric([action], int(on))
        yield publishes


def _server(s: StreamStats) -> Iterator[Metric]:
    """The server and the slot, sampled every poll interval (absent until sampled)."""
    if s.server_sampled_at is not None:
        yield _gauge(
            "pg2sink_server_wal_lsn_bytes",
            "the server's current WAL position at the last poll",
            s.server_wal_lsn,
        )
        yield _gauge(
            "pg2sink_server_sampled_timestamp_seconds",
            "when the server's WAL position and the slot were last sampled (Unix seconds)",
            s.server_sampled_at,
        )
    lag = s.lag_bytes()
    if lag is not None:
        yield _gauge(
            "pg2sink_replication_lag_bytes",
            "the server's WAL position minus the confirmed LSN",
            lag,
        )
    if s.slot_active is not None:
        yield _gauge(
            "pg2sink_slot_active",
            "1 when a walsender streams from the slot (at the last poll)",
            s.slot_active,
        )
    if s.slot_restart_lsn:
        yield _gauge(
            "pg2sink_slot_restart_lsn_bytes",
            "the slot's restart_lsn at the last poll",
            s.slot_restart_lsn,
        )
    retained = s.wal_retained_bytes()
    if retained is not None:
        yield _gauge(
            "pg2sink_wal_retained_bytes",
            "WAL the server retains for the slot (WAL position minus restart_lsn)",
            retained,
        )
    yield from _slot_health(s)


#: pg_replication_slots.wal_status values: each is a label of pg2sink_slot_wal_status
WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


def _slot_health(s: StreamStats) -> Iterator[Metric]:
    """The slot's health at the last poll: WAL status, safe size, inactivity, validity."""
    if s.slot_wal_status is not None:
        status = GaugeMetricFamily(
            "pg2sink_slot_wal_status",
            "1 for the slot's wal_status at the last poll (reserved, extended, unreserved, "
            "lost: WAL it needs was removed), 0 for the others",
            labels=["status"],
        )
        for name in WAL_STATUSES:
            status.add_metric([name], int(s.slot_wal_status == name))
        yield status
        safe = s.slot_safe_wal_size
        yield _gauge(
            "pg2sink_slot_safe_wal_size_bytes",
            "WAL that can still be written before the slot risks wal_status 'lost' "
            "(max_slot_wal_keep_size); -1 when unlimited, as that setting writes it",
            safe if safe is not None else -1,
        )
    if s.slot_inactive_since is not None:
        yield _gauge(
            "pg2sink_slot_inactive_since_timestamp_seconds",
            "since when no walsender streams from the slot (Unix seconds; PostgreSQL 17+)",
            s.slot_inactive_since,
        )
    if s.server_sampled_at is not None and s.slot_active is not None:
        invalid = GaugeMetricFamily(
            "pg2sink_slot_invalidated",
            "1 when the server invalidated the slot, with its reason (wal_removed, "
            "rows_removed, wal_level_insufficient, idle_timeout); pg2sink then stops",
            labels=["reason"],
        )
        reason = s.slot_invalidation_reason
        invalid.add_metric([reason or ""], int(reason is not None))
        yield invalid


def _sink(s: StreamStats) -> Iterator[Metric]:
    """The sink: flush durations and sizes, write latency, bytes not yet durable."""
    yield _histogram(
        "pg2sink_sink_flush_seconds", "duration of each durable sink flush", s.flush_seconds
    )
    yield _histogram(
        "pg2sink_sink_flush_records",
        "records written between two flushes (batch size)",
        s.flush_records,
    )
    yield _histogram(
        "pg2sink_sink_write_seconds",
        "time from a transaction's records reaching the sink (its commit) until the sink "
        "acknowledged them durable; the oldest waiting transaction, once per acknowledgement",
        s.write_seconds,
    )
    yield _gauge(
        "pg2sink_raw_buffer_bytes",
        "bytes the sink holds written but not yet durable",
        s.raw_buffer_bytes,
    )


def _problems(s: StreamStats) -> Iterator[Metric]:
    """Errors by kind and log lines at warning level or above."""
    yield _labelled_counter("pg2sink_errors", "errors by kind", ["kind"], dict(s.errors))
    yield _labelled_counter(
        "pg2sink_log_messages",
        "log lines at warning level or above",
        ["level"],
        dict(s.log_messages),
    )


def _imports(s: StreamStats) -> Iterator[Metric]:
    """Each table's snapshot import: rows read, rows estimated, its state."""
    rows_read = CounterMetricFamily(
        "pg2sink_import_rows_read",
        "rows read by a table's snapshot import",
        labels=["schema", "table"],
    )
    estimated = GaugeMetricFamily(
        "pg2sink_import_rows_estimated",
        "estimated rows of a table being imported (pg_class.reltuples)",
        labels=["schema", "table"],
    )
    state = GaugeMetricFamily(
        "pg2sink_import_state",
        "1 for the current state of a table's import (pending, running, done, failed)",
        labels=["schema", "table", "state"],
    )
    lost = CounterMetricFamily(
        "pg2sink_import_spark_sessions_lost",
        "Spark sessions of imports found dead (driver JVM, py4j gateway, cluster master) "
        "and replaced",
    )
    lost.add_metric([], s.spark_sessions_lost)
    for (schema, table), progress in sorted(dict(s.imports).items()):
        rows_read.add_metric([schema, table], progress.rows_read)
        if progress.rows_estimated is not None:
            estimated.add_metric([schema, table], progress.rows_estimated)
        for name in IMPORT_STATES:
            state.add_metric([schema, table, name], progress.state == name)
    yield rows_read
    yield estimated
    yield state
    yield lost


def _labelled_counter(
    name: str, documentation: str, labels: list[str], counts: Mapping[_Key, int]
) -> CounterMetricFamily:
    """A counter family with one sample per key of `counts`, in sorted key order.

    A key is one label value, or a tuple of them in the order of `labels`.
    """
    family = CounterMetricFamily(name, documentation, labels=labels)
    for key, n in sorted(counts.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], n)
    return family


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=float(value))


def _histogram(name: str, documentation: str, buckets: Buckets) -> HistogramMetricFamily:
    cumulative = buckets.cumulative()
    return HistogramMetricFamily(
        name,
        documentation,
        buckets=[(le, float(n)) for le, n in cumulative],
        sum_value=buckets.sum,
    )


class PipelinesCollector(Collector):
    """The pg2sink_* families of several pipelines' StreamStats, each sample labelled
    with its pipeline's name."""

    def __init__(
        self, pipelines: Mapping[str, StreamStats], clock: Callable[[], float] = time.time
    ) -> None:
        self.collectors = {name: StatsCollector(s, clock) for name, s in pipelines.items()}

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for name, collector in self.collectors.items():
            for family in collector.collect():
                samples = [
                    s._replace(labels={"pipeline": name, **s.labels}) for s in family.samples
                ]
                if family.name in families:
                    families[family.name].samples.extend(samples)
                else:
                    family.samples = samples
                    families[family.name] = family
        yield from families.values()


def make_registry(
    stats: StreamStats | Mapping[str, StreamStats], clock: Callable[[], float] = time.time
) -> CollectorRegistry:
    """A dedicated registry: pg2sink_* from `stats` (one pipeline's, or several by name,
    labelled `pipeline`), plus process_* and python_* metrics."""
    registry = CollectorRegistry(auto_describe=False)
    if isinstance(stats, StreamStats):
        registry.register(StatsCollector(stats, clock))
    else:
        registry.register(PipelinesCollector(stats, clock))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry
