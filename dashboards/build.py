"""Builds the pg2sink Grafana dashboard (dashboards/pg2sink.json) with grafana-foundation-sdk.

    make dashboards        # = .venv/bin/python dashboards/build.py

The JSON is committed so that users (and docker-compose.yml's Grafana) need
no Python to load it; tests/observability/test_dashboards.py checks that it
equals a fresh build, and test_prometheus.py runs every panel's PromQL
against a real Prometheus scraping pg2sink. Metric names and labels are in
docs/observability.md.

Every query filters on the dashboard's `job` and `instance` variables and uses
Grafana's `$__rate_interval`, which the tests replace with a fixed window.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders.bargauge import Panel as BarGauge
from grafana_foundation_sdk.builders.common import ReduceDataOptions, VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery as PromQuery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.table import Panel as Table
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BarGaugeDisplayMode,
    BigValueColorMode,
    BigValueGraphMode,
    GraphDrawStyle,
    LegendDisplayMode,
    LegendPlacement,
    LineInterpolation,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUTPUT = Path(__file__).resolve().parent / "pg2sink.json"

UID = "pg2sink"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
#: Every query's selector: the dashboard's job and instance variables.
SEL = 'job=~"$job", instance=~"$instance"'
RATE = "$__rate_interval"

# Panel sizes on Grafana's 24-column grid.
STAT_W, STAT_H = 4, 4
HALF, THIRD, FULL = 12, 8, 24
GRAPH_H = 8


def query(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> PromQuery:
    q = PromQuery().expr(expr).legend_format(legend or "__auto").ref_id(ref).datasource(DATASOURCE)
    return q.instant().format(PromQueryFormat.TABLE) if instant else q.range()


def stat(
    panel_id: int,
    title: str,
    description: str,
    expr: str,
    unit: str,
    steps: list[Threshold] | None = None,
) -> Stat:
    return (
        Stat()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(query(expr))
        .unit(unit)
        .span(STAT_W)
        .height(STAT_H)
        .graph_mode(BigValueGraphMode.AREA)
        .color_mode(BigValueColorMode.VALUE)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
        .thresholds(
            ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps(steps or [Threshold(value=None, color="green")])
        )
    )


def graph(
    panel_id: int,
    title: str,
    description: str,
    targets: list[PromQuery],
    unit: str,
    width: int = HALF,
    bars: bool = False,
    stepped: bool = False,
) -> Timeseries:
    panel = (
        Timeseries()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(list(targets))
        .unit(unit)
        .min(0)
        .span(width)
        .height(GRAPH_H)
        .fill_opacity(10)
        .legend(
            VizLegendOptions()
            .display_mode(LegendDisplayMode.TABLE)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
    )
    if bars:
        panel = panel.draw_style(GraphDrawStyle.BARS).fill_opacity(80)
    if stepped:
        panel = panel.line_interpolation(LineInterpolation.STEP_AFTER)
    return panel


def quantiles(metric: str, title: str) -> list[PromQuery]:
    """p50, p90 and p99 of histogram `metric` per instance."""
    return [
        query(
            f"histogram_quantile({q}, sum by (instance, le) "
            f"(rate({metric}_bucket{{{SEL}}}[{RATE}])))",
            f"{title} p{round(q * 100)} {{{{instance}}}}",
            ref,
        )
        for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
    ]


def build() -> Dashboard:
    red_below_1 = [Threshold(value=None, color="red"), Threshold(value=1, color="green")]
    lag_steps = [
        Threshold(value=None, color="green"),
        Threshold(value=60, color="orange"),
        Threshold(value=300, color="red"),
    ]
    return (
        Dashboard("pg2sink")
        .uid(UID)
        .description(
            "PostgreSQL change data capture: throughput, replication lag, sink latency, "
            "errors and snapshot imports of pg2sink (docs/observability.md)."
        )
        .tags(["pg2sink", "postgresql", "cdc"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(
            DatasourceVariable("datasource")
            .label("Data source")
            .type("prometheus")
            .current(VariableOption(selected=True, text="Prometheus", value="prometheus"))
        )
        .with_variable(
            QueryVariable("job")
            .label("Job")
            .datasource(DATASOURCE)
            .query("label_values(pg2sink_info, job)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        .with_variable(
            QueryVariable("instance")
            .label("Instance")
            .datasource(DATASOURCE)
            .query('label_values(pg2sink_info{job=~"$job"}, instance)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        # -- overview ------------------------------------------------------------------
        .with_row(Row("Overview").id(100))
        .with_panel(
            stat(
                1,
                "Healthy",
                "1 when every selected instance streams and its sink accepts records "
                "(pg2sink_up; GET /status answers 200).",
                f"min(pg2sink_up{{{SEL}}})",
                "none",
                red_below_1,
            )
        )
        .with_panel(
            stat(
                2,
                "Changes/s",
                "Changes emitted to the sink per second, all tables.",
                f"sum(rate(pg2sink_changes_total{{{SEL}}}[{RATE}]))",
                "ops",
            )
        )
        .with_panel(
            stat(
                3,
                "Lag",
                "Server WAL position minus the confirmed LSN (worst instance).",
                f"max(pg2sink_replication_lag_bytes{{{SEL}}})",
                "bytes",
            )
        )
        .with_panel(
            stat(
                4,
                "Lag (time)",
                "Age of the oldest transaction received but not yet acknowledged by the sink "
                "(worst instance); 0 when caught up.",
                f"max(pg2sink_replication_lag_seconds{{{SEL}}})",
                "s",
                lag_steps,
            )
        )
        .with_panel(
            stat(
                5,
                "WAL retained",
                "WAL the server keeps for the slot: its WAL position minus the slot's "
                "restart_lsn. It grows while pg2sink is stopped or behind.",
                f"max(pg2sink_wal_retained_bytes{{{SEL}}})",
                "bytes",
            )
        )
        .with_panel(
            stat(
                6,
                "Published tables",
                "Tables in the publication after the last reconciliation.",
                f"max(pg2sink_publication_tables{{{SEL}}})",
                "none",
            )
        )
        # -- throughput ----------------------------------------------------------------
        .with_row(Row("Throughput").id(101))
        .with_panel(
            graph(
                7,
                "Changes by table and operation",
                "Changes emitted per second, by table and operation (pg2sink_changes_total).",
                [
                    query(
                        "sum by (schema, table, operation) "
                        f"(rate(pg2sink_changes_total{{{SEL}}}[{RATE}]))",
                        "{{schema}}.{{table}} {{operation}}",
                    )
                ],
                "ops",
                width=FULL,
            )
        )
        .with_panel(
            graph(
                8,
                "pgoutput messages by type",
                "Logical replication messages received per second, by type "
                "(pg2sink_messages_total).",
                [
                    query(
                        f"sum by (type) (rate(pg2sink_messages_total{{{SEL}}}[{RATE}]))",
                        "{{type}}",
                    )
                ],
                "ops",
            )
        )
        .with_panel(
            graph(
                9,
                "WAL throughput",
                "How fast the received and the confirmed LSN advance, in bytes of WAL per second.",
                [
                    query(
                        f"sum by (instance) (deriv(pg2sink_received_lsn_bytes{{{SEL}}}[{RATE}]))",
                        "received {{instance}}",
                        "A",
                    ),
                    query(
                        f"sum by (instance) (deriv(pg2sink_confirmed_lsn_bytes{{{SEL}}}[{RATE}]))",
                        "confirmed {{instance}}",
                        "B",
                    ),
                ],
                "Bps",
            )
        )
        # -- lag -----------------------------------------------------------------------
        .with_row(Row("Lag").id(102))
        .with_panel(
            graph(
                10,
                "Replication lag (bytes)",
                "Server WAL position (sampled every poll interval) minus the confirmed LSN.",
                [
                    query(
                        f"max by (instance) (pg2sink_replication_lag_bytes{{{SEL}}})",
                        "{{instance}}",
                    )
                ],
                "bytes",
                width=THIRD,
            )
        )
        .with_panel(
            graph(
                11,
                "Replication lag (seconds)",
                "Now minus the commit time of the oldest transaction received but not yet "
                "acknowledged by the sink; 0 when caught up.",
                [
                    query(
                        f"max by (instance) (pg2sink_replication_lag_seconds{{{SEL}}})",
                        "{{instance}}",
                    )
                ],
                "s",
                width=THIRD,
            )
        )
        .with_panel(
            graph(
                12,
                "WAL retained by the slot",
                "Server WAL position minus the slot's restart_lsn: disk the server cannot "
                "recycle until pg2sink confirms.",
                [
                    query(
                        f"max by (instance) (pg2sink_wal_retained_bytes{{{SEL}}})",
                        "{{instance}}",
                    )
                ],
                "bytes",
                width=THIRD,
            )
        )
        .with_panel(
            graph(
                26,
                "Slot health",
                "1 when the server invalidated the slot (by reason: wal_removed, rows_removed, "
                "wal_level_insufficient, idle_timeout; pg2sink then stops: drop and re-import, "
                "docs/postgresql.md), and the slot's wal_status (1 for the current one of "
                "reserved, extended, unreserved, lost).",
                [
                    query(
                        f"max by (instance, reason) (pg2sink_slot_invalidated{{{SEL}}})",
                        "invalidated {{reason}} {{instance}}",
                    ),
                    query(
                        f"max by (instance, status) (pg2sink_slot_wal_status{{{SEL}}})",
                        "wal_status {{status}} {{instance}}",
                        "B",
                    ),
                ],
                "none",
                stepped=True,
            )
        )
        .with_panel(
            graph(
                27,
                "Slot WAL margin (safe_wal_size)",
                "WAL that can still be written before the slot risks wal_status 'lost' and "
                "invalidation (max_slot_wal_keep_size); -1 when that setting is unlimited.",
                [
                    query(
                        f"min by (instance) (pg2sink_slot_safe_wal_size_bytes{{{SEL}}})",
                        "{{instance}}",
                    )
                ],
                "bytes",
            )
        )
        # -- sink ----------------------------------------------------------------------
        .with_row(Row("Sink").id(103))
        .with_panel(
            graph(
                13,
                "Flush latency",
                "Duration of each durable sink flush (fsync, or Kafka delivery of everything "
                "outstanding): p50, p90, p99.",
                quantiles("pg2sink_sink_flush_seconds", "flush"),
                "s",
                width=THIRD,
            )
        )
        .with_panel(
            graph(
                14,
                "Write latency",
                "Write-to-acknowledgement latency: from a transaction's commit reaching the "
                "sink until the sink holds it durably (the wait for a flush plus the flush), "
                "p50, p90, p99.",
                quantiles("pg2sink_sink_write_seconds", "write"),
                "s",
                width=THIRD,
            )
        )
        .with_panel(
            graph(
                15,
                "Records per flush",
                "Batch size: records written between two flushes, p50 and p99, and flushes "
                "per second.",
                [
                    query(
                        "histogram_quantile(0.5, sum by (instance, le) "
                        f"(rate(pg2sink_sink_flush_records_bucket{{{SEL}}}[{RATE}])))",
                        "p50 {{instance}}",
                        "A",
                    ),
                    query(
                        "histogram_quantile(0.99, sum by (instance, le) "
                        f"(rate(pg2sink_sink_flush_records_bucket{{{SEL}}}[{RATE}])))",
                        "p99 {{instance}}",
                        "B",
                    ),
                    query(
                        "sum by (instance) "
                        f"(rate(pg2sink_sink_flush_seconds_count{{{SEL}}}[{RATE}]))",
                        "flushes/s {{instance}}",
                        "C",
                    ),
                ],
                "short",
                width=THIRD,
            )
        )
        .with_panel(
            graph(
                16,
                "Sink buffer",
                "Bytes the sink holds written but not yet durable.",
                [query(f"max by (instance) (pg2sink_raw_buffer_bytes{{{SEL}}})", "{{instance}}")],
                "bytes",
            )
        )
        .with_panel(
            graph(
                17,
                "Health",
                "1 = healthy: the replication connection streams, the sink accepts records, "
                "the slot is active (sampled every poll interval).",
                [
                    query(
                        f"min by (instance) (pg2sink_replication_connected{{{SEL}}})",
                        "replication {{instance}}",
                        "A",
                    ),
                    query(
                        f"min by (instance) (pg2sink_sink_healthy{{{SEL}}})",
                        "sink {{instance}}",
                        "B",
                    ),
                    query(
                        f"min by (instance) (pg2sink_slot_active{{{SEL}}})",
                        "slot active {{instance}}",
                        "C",
                    ),
                ],
                "none",
                stepped=True,
            )
        )
        # -- errors --------------------------------------------------------------------
        .with_row(Row("Errors").id(104))
        .with_panel(
            graph(
                18,
                "Errors by kind",
                "Errors counted per interval, by kind (connect, slot_busy, sink, "
                "sink_unavailable, decode...; pg2sink_errors_total).",
                [
                    query(
                        f"sum by (kind) (increase(pg2sink_errors_total{{{SEL}}}[{RATE}]))",
                        "{{kind}}",
                    )
                ],
                "short",
                width=THIRD,
                bars=True,
            )
        )
        .with_panel(
            graph(
                19,
                "Logged warnings and errors",
                "Log lines at warning level or above per interval (pg2sink_log_messages_total).",
                [
                    query(
                        f"sum by (level) (increase(pg2sink_log_messages_total{{{SEL}}}[{RATE}]))",
                        "{{level}}",
                    )
                ],
                "short",
                width=THIRD,
                bars=True,
            )
        )
        .with_panel(
            graph(
                20,
                "Heartbeats",
                "Primary keepalive messages received from the server per second: they keep "
                "coming while the connection lives, even when nothing changes.",
                [
                    query(
                        f"sum by (instance) (rate(pg2sink_heartbeats_total{{{SEL}}}[{RATE}]))",
                        "{{instance}}",
                    )
                ],
                "ops",
                width=THIRD,
            )
        )
        # -- imports -------------------------------------------------------------------
        .with_row(Row("Imports").id(105))
        .with_panel(
            BarGauge()
            .id(21)
            .title("Import progress")
            .description(
                "Rows read over the estimated rows of each table being imported "
                "(the estimate is the planner's, so it may end slightly off 100%)."
            )
            .datasource(DATASOURCE)
            .with_target(
                query(
                    "clamp_max(sum by (schema, table) "
                    f"(pg2sink_import_rows_read_total{{{SEL}}}) / sum by (schema, table) "
                    f"(pg2sink_import_rows_estimated{{{SEL}}}), 1)",
                    "{{schema}}.{{table}}",
                )
            )
            .unit("percentunit")
            .min(0)
            .max(1)
            .span(THIRD)
            .height(GRAPH_H)
            .display_mode(BarGaugeDisplayMode.GRADIENT)
            .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
        )
        .with_panel(
            graph(
                22,
                "Import rows/s",
                "Rows read per second by each table's snapshot import.",
                [
                    query(
                        "sum by (schema, table) "
                        f"(rate(pg2sink_import_rows_read_total{{{SEL}}}[{RATE}]))",
                        "{{schema}}.{{table}}",
                    )
                ],
                "rowsps",
                width=THIRD,
            )
        )
        .with_panel(
            Table()
            .id(23)
            .title("Import state")
            .description("Current state of each table's import: pending, running, done, failed.")
            .datasource(DATASOURCE)
            .with_target(
                query(
                    f"max by (schema, table, state) (pg2sink_import_state{{{SEL}}}) == 1",
                    "",
                    instant=True,
                )
            )
            .span(THIRD)
            .height(GRAPH_H)
        )
        # -- process -------------------------------------------------------------------
        .with_row(Row("Process").id(106))
        .with_panel(
            graph(
                24,
                "Memory",
                "Resident set size of each pg2sink process.",
                [query(f"process_resident_memory_bytes{{{SEL}}}", "{{instance}}")],
                "bytes",
            )
        )
        .with_panel(
            graph(
                25,
                "CPU",
                "CPU time used per second (1 = one core). pg2sink's replication loop is one "
                "Python thread, so it tops out near 1.",
                [
                    query(
                        f"rate(process_cpu_seconds_total{{{SEL}}}[{RATE}])",
                        "{{instance}}",
                    )
                ],
                "percentunit",
            )
        )
    )


def render() -> str:
    """The dashboard as the JSON text committed in dashboards/pg2sink.json."""
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUTPUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
