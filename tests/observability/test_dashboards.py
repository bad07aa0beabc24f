"""dashboards/: the committed JSON is a fresh build, panels are well-formed, alerts check out."""

from __future__ import annotations

import re
import subprocess

from tests.observability.support import (
    ALERTS,
    DASHBOARD_JSON,
    DASHBOARDS,
    binary,
    load_build_module,
    load_dashboard,
    panel_queries,
    panels,
)


def test_committed_json_equals_a_fresh_build() -> None:
    fresh = load_build_module().render()
    assert isinstance(fresh, str)
    assert DASHBOARD_JSON.read_text() == fresh, (
        "dashboards/pg2sink.json is out of date: run `make dashboards` and commit the result"
    )


def test_panels_are_well_formed() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "pg2sink"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    shown = panels(dashboard)
    assert len(shown) >= 20
    for panel in shown:
        title = panel["title"]
        assert panel.get("description"), f"{title}: every panel says what it shows"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        targets = panel.get("targets", [])
        assert targets, f"{title}: no query"
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), f"{title}: duplicate refId"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, title
        for target in targets:
            assert 'job=~"$job", instance=~"$instance"' in target["expr"], (title, target["expr"])


def test_the_issue_s_panels_are_there() -> None:
    exprs = " ".join(expr for _, _, expr in panel_queries(load_dashboard()))
    for needle in (
        "pg2sink_changes_total",  # throughput by table and operation
        "pg2sink_replication_lag_bytes",
        "pg2sink_replication_lag_seconds",
        "pg2sink_sink_flush_seconds_bucket",  # sink latency percentiles
        "pg2sink_errors_total",
        "pg2sink_import_rows_read_total",  # imports progress
        "pg2sink_wal_retained_bytes",
    ):
        assert needle in exprs, needle
    assert re.search(r"sum by \(schema, table, operation\)", exprs)
    assert "histogram_quantile(0.99" in exprs


def test_promtool_check_rules() -> None:
    res = subprocess.run(
        [binary("promtool"), "check", "rules", str(ALERTS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 8 rules found" in res.stdout


def test_promtool_test_rules() -> None:
    res = subprocess.run(
        [binary("promtool"), "test", "rules", "alerts.test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=DASHBOARDS,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_issue_s_alerts_are_there() -> None:
    text = ALERTS.read_text()
    for alert in ("Pg2sinkReplicationLagBytesHigh", "Pg2sinkSlotInactive", "Pg2sinkSinkErrors"):
        assert f"alert: {alert}" in text
