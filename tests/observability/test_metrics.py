"""The collector's output, parsed back with prometheus_client's own parser."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from pg2sink import __version__
from pg2sink.observability.metrics import make_registry
from pg2sink.observability.stats import ImportProgress, ServerPosition, StreamStats

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC).timestamp()


def full_stats() -> StreamStats:
    """A StreamStats with every field set, so every metric is exposed."""
    stats = StreamStats(lambda: NOW)
    stats.info.update(slot="pg2sink", publication="pg2sink", sink="file")
    stats.replication_up()
    stats.sink_up()
    stats.messages.update(begin=3, commit=3, insert=4, update=1, relation=2)
    ops = stats.table_changes("public", "customers")
    ops["INSERT"] += 4
    ops["UPDATE"] += 1
    stats.commit_received(0x1000, datetime.fromtimestamp(NOW - 30, UTC))
    stats.commit_received(0x2000, datetime.fromtimestamp(NOW - 12, UTC))
    stats.acknowledge(0x1000)
    stats.heartbeats = 7
    stats.publication_tables = 2
    stats.publication_actions = {"insert": True, "update": False, "delete": True, "truncate": True}
    stats.set_server_position(
        ServerPosition(
            wal_lsn=0x3000,
            restart_lsn=0x800,
            active=True,
            wal_status="extended",
            safe_wal_size=1 << 20,
            inactive_since=NOW - 60,
        )
    )
    stats.observe_flush(0.004, 120)
    stats.observe_flush(0.2, 5000)
    stats.write_seconds.observe(0.03)
    stats.raw_buffer_bytes = 4096
    stats.count_error("sink_unavailable")
    stats.log_messages["warning"] += 1
    stats.imports[("public", "orders")] = ImportProgress(250, 1000, "running")
    return stats


def scrape(stats: StreamStats) -> dict[str, list[Sample]]:
    text = generate_latest(make_registry(stats, clock=lambda: NOW)).decode()
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    matches = [
        s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, (name, labels, samples.get(name))
    return matches[0]


def test_stream_metrics() -> None:
    m = scrape(full_stats())
    assert value(m, "pg2sink_info", version=__version__, slot="pg2sink", sink="file") == 1
    assert value(m, "pg2sink_up") == 1
    assert value(m, "pg2sink_replication_connected") == 1
    assert value(m, "pg2sink_sink_healthy") == 1
    assert value(m, "pg2sink_messages_total", type="insert") == 4
    assert value(m, "pg2sink_messages_total", type="begin") == 3
    assert (
        value(m, "pg2sink_changes_total", schema="public", table="customers", operation="INSERT")
        == 4
    )
    assert (
        value(m, "pg2sink_changes_total", schema="public", table="customers", operation="UPDATE")
        == 1
    )
    assert (
        value(m, "pg2sink_changes_total", schema="public", table="customers", operation="DELETE")
        == 0
    )
    assert value(m, "pg2sink_received_lsn_bytes") == 0x2000
    assert value(m, "pg2sink_confirmed_lsn_bytes") == 0x1000
    assert value(m, "pg2sink_last_ack_commit_timestamp_seconds") == NOW - 30
    assert value(m, "pg2sink_replication_lag_seconds") == pytest.approx(12)
    assert value(m, "pg2sink_heartbeats_total") == 7
    assert value(m, "pg2sink_publication_tables") == 2


def test_server_metrics() -> None:
    m = scrape(full_stats())
    assert value(m, "pg2sink_server_wal_lsn_bytes") == 0x3000
    assert value(m, "pg2sink_server_sampled_timestamp_seconds") == NOW
    assert value(m, "pg2sink_replication_lag_bytes") == 0x2000
    assert value(m, "pg2sink_slot_active") == 1
    assert value(m, "pg2sink_slot_restart_lsn_bytes") == 0x800
    assert value(m, "pg2sink_wal_retained_bytes") == 0x2800


def test_server_metrics_are_absent_before_the_first_sample() -> None:
    m = scrape(StreamStats())
    for name in (
        "pg2sink_server_wal_lsn_bytes",
        "pg2sink_replication_lag_bytes",
        "pg2sink_slot_active",
        "pg2sink_wal_retained_bytes",
        "pg2sink_last_ack_commit_timestamp_seconds",
    ):
        assert name not in m
    assert value(m, "pg2sink_up") == 0
    assert value(m, "pg2sink_replication_lag_seconds") == 0


def test_sink_histograms() -> None:
    m = scrape(full_stats())
    assert value(m, "pg2sink_sink_flush_seconds_count") == 2
    assert value(m, "pg2sink_sink_flush_seconds_sum") == pytest.approx(0.204)
    assert value(m, "pg2sink_sink_flush_seconds_bucket", le="0.005") == 1
    assert value(m, "pg2sink_sink_flush_seconds_bucket", le="0.25") == 2
    assert value(m, "pg2sink_sink_flush_seconds_bucket", le="+Inf") == 2
    assert value(m, "pg2sink_sink_flush_records_bucket", le="1000.0") == 1
    assert value(m, "pg2sink_sink_flush_records_bucket", le="10000.0") == 2
    assert value(m, "pg2sink_sink_flush_records_sum") == 5120
    assert value(m, "pg2sink_sink_write_seconds_count") == 1
    assert value(m, "pg2sink_raw_buffer_bytes") == 4096
    # buckets are cumulative: never decreasing, +Inf equal to the count
    counts = [s.value for s in m["pg2sink_sink_flush_seconds_bucket"]]
    assert counts == sorted(counts)


def test_problem_and_import_metrics() -> None:
    m = scrape(full_stats())
    assert value(m, "pg2sink_errors_total", kind="sink_unavailable") == 1
    assert value(m, "pg2sink_log_messages_total", level="warning") == 1
    assert value(m, "pg2sink_log_messages_total", level="error") == 0
    assert value(m, "pg2sink_import_rows_read_total", schema="public", table="orders") == 250
    assert value(m, "pg2sink_import_rows_estimated", schema="public", table="orders") == 1000
    states = {s.labels["state"]: s.value for s in m["pg2sink_import_state"]}
    assert states == {"pending": 0, "running": 1, "done": 0, "failed": 0}


def test_process_metrics_come_along() -> None:
    m = scrape(StreamStats())
    assert "process_resident_memory_bytes" in m
    assert "python_info" in m


def test_a_registry_per_stats_object() -> None:
    # dedicated registries: two StreamStats never share or collide in a global one
    a, b = StreamStats(), StreamStats()
    a.heartbeats, b.heartbeats = 1, 2
    assert value(scrape(a), "pg2sink_heartbeats_total") == 1
    assert value(scrape(b), "pg2sink_heartbeats_total") == 2


def documented_metrics() -> dict[str, str]:
    """Metric name → type, from the table in docs/observability.md."""
    text = (REPO / "docs" / "observability.md").read_text()
    rows = re.findall(r"^\| `(pg2sink_[a-z_]+)` \| (counter|gauge|histogram) \|", text, re.M)
    return dict(rows)


def test_every_metric_is_documented_and_every_documented_metric_exists() -> None:
    text = generate_latest(make_registry(full_stats(), clock=lambda: NOW)).decode()
    exposed: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("pg2sink_"):
            continue
        name = family.name + "_total" if family.type == "counter" else family.name
        exposed[name] = family.type
    assert exposed == documented_metrics()
