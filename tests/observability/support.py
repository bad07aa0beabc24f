"""Helpers shared by the dashboard, Prometheus and compose tests."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
DASHBOARD_JSON = DASHBOARDS / "pg2sink.json"
ALERTS = DASHBOARDS / "alerts.yml"

#: What Grafana substitutes for the dashboard's variables when every job and
#: instance is selected; $__rate_interval becomes a window that holds several
#: samples at the tests' 1 s scrape interval.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$job": ".*", "$instance": ".*"}


def load_build_module() -> ModuleType:
    """dashboards/build.py as a module (dashboards/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "pg2sink_dashboards_build", DASHBOARDS / "build.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD_JSON.read_text())
    return data


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that shows data (rows excluded), including panels inside collapsed rows."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL as Grafana sends it) for every target of every panel."""
    return [
        (panel["title"], target["refId"], to_promql(target["expr"]))
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def to_promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unsubstituted Grafana variable in {expr}"
    return expr


def binary(name: str) -> str:
    """A program from Debian's prometheus package; `make system` installs it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: run `make system` (scripts/setup-system.sh installs "
            "Debian's prometheus package)"
        )
    return path
