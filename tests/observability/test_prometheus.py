"""Every dashboard panel's PromQL returns data from a real Prometheus scraping pg2sink.

Starts Debian's `prometheus` (installed by scripts/setup-system.sh) with a 1 s
scrape interval and the alert rules loaded, lets it scrape a metrics endpoint
under a small workload, then sends every query of dashboards/pg2sink.json, as
Grafana would, to /api/v1/query and requires at least one series back.

The endpoint comes from the `target` fixture, in two variants:

- `synthetic`: pg2sink's own HTTP server (observability.http) fed by a
  StreamStats that a thread updates the way the replication loop does. It
  proves the dashboard against the metric names and labels the collector
  exposes, whatever the wiring.
- `pg2sink`: a real `pg2sink stream --metrics-address ...` process against the
  test database under an INSERT/UPDATE/DELETE workload. It runs by itself as
  soon as `pg2sink stream --help` lists --metrics-address (skipped until
  then), and from then on proves the wiring too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import services

from pg2sink.observability.http import start_http_server
from pg2sink.observability.stats import ImportProgress, ServerPosition, StreamStats
from tests.conftest import Database, Pg2Sink, wait_for
from tests.observability.support import (
    ALERTS,
    binary,
    load_dashboard,
    panel_queries,
)

pytestmark = pytest.mark.slow


@dataclass
class Target:
    """A metrics endpoint under workload."""

    kind: str
    address: str  # host:port


def _has_metrics_flag() -> bool:
    res = subprocess.run(
        [sys.executable, "-m", "pg2sink", "stream", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return "--metrics-address" in res.stdout


class SyntheticStream:
    """Updates a StreamStats the way the replication loop does, from a thread."""

    def __init__(self, stats: StreamStats) -> None:
        self.stats = stats
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="synthetic-stream", daemon=True)

    def run(self) -> None:
        s = self.stats
        customers = s.table_changes("public", "customers")
        orders = s.table_changes("sales", "orders")
        s.info.update(slot="pg2sink", publication="pg2sink", sink="file")
        s.publication_tables = 2
        s.replication_up()
        s.sink_up()
        s.imports[("public", "big")] = ImportProgress(0, 100_000, "running")
        s.imports[("public", "small")] = ImportProgress(500, 500, "done")
        lsn = 0x1_0000_0000
        tick = 0
        while not self.stop.wait(0.05):
            tick += 1
            # one transaction per tick: begin, a few changes, commit
            s.messages["begin"] += 1
            s.messages["insert"] += 3
            s.messages["update"] += 1
            customers["INSERT"] += 3
            orders["UPDATE"] += 1
            s.messages["commit"] += 1
            lsn += 4096
            s.commit_received(lsn, datetime.now(UTC))
            if tick % 2 == 0:  # the sink flushes every other tick
                s.observe_flush(0.002 + (tick % 7) / 1000, 8)
                s.write_seconds.observe(0.01)
                s.acknowledge(lsn - 4096)
            s.raw_buffer_bytes = 4096 * (tick % 3)
            if tick % 10 == 0:
                s.heartbeats += 1
                s.set_server_position(
                    ServerPosition(lsn + 8192, lsn - 65536, True, "reserved", 1 << 30)
                )
            if tick % 25 == 0:
                s.log_messages["warning"] += 1
            big = s.imports[("public", "big")]
            big.rows_read = min(big.rows_read + 1000, 100_000)

    def __enter__(self) -> SyntheticStream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def _workload(db: Database, stop: threading.Event) -> None:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        i = 0
        while not stop.wait(0.05):
            i += 1
            conn.execute("INSERT INTO customers (name) VALUES (%s)", (f"c{i}",))
            conn.execute("UPDATE customers SET name = name || '!' WHERE id = %s", (i,))
            if i % 5 == 0:
                conn.execute("DELETE FROM customers WHERE id = %s", (i - 2,))


@pytest.fixture(params=["synthetic", "pg2sink"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    port = services.free_port()
    if request.param == "synthetic":
        stats = StreamStats()
        with start_http_server(f"127.0.0.1:{port}", stats), SyntheticStream(stats):
            yield Target("synthetic", f"127.0.0.1:{port}")
        return
    if not _has_metrics_flag():
        pytest.skip("pg2sink stream has no --metrics-address yet (wiring pending)")
    db: Database = request.getfixturevalue("db")
    make: Callable[..., Pg2Sink] = request.getfixturevalue("pg2sink_proc")
    db.connect().execute("CREATE TABLE customers (id serial PRIMARY KEY, name text)")
    # rows from before the start: imported (Spark), so the import panels have data
    db.connect().execute(
        "CREATE TABLE imported AS SELECT g AS id, 'v' || g AS v FROM generate_series(1, 20000) g;"
        " ALTER TABLE imported ADD PRIMARY KEY (id)"
    )
    proc = make(
        "--sink=file",
        f"--file-path={tmp_path / 'out.jsonl'}",
        f"--metrics-address=127.0.0.1:{port}",
        "--publication-poll-interval=1s",
        "--heartbeat-interval=1s",
        env={"PG2SINK_NO_IMPORTS": "0"},
    ).start()
    proc.wait_streaming()
    stop = threading.Event()
    writer = threading.Thread(target=_workload, args=(db, stop), daemon=True)
    writer.start()
    try:
        yield Target("pg2sink", f"127.0.0.1:{port}")
    finally:
        stop.set()
        writer.join(10)
        proc.stop()


class Prometheus:
    """Debian's prometheus binary on a free loopback port, scraping one target."""

    def __init__(self, workdir: Path, target: str) -> None:
        self.port = services.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(ALERTS)],
                    "scrape_configs": [
                        {"job_name": "pg2sink", "static_configs": [{"targets": [target]}]}
                    ],
                }
            )
        )
        self.log = workdir / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as e:  # 400/422 carry the PromQL error
            body = json.load(e)
        return body

    def query(self, expr: str) -> Any:
        return self.get("/api/v1/query", query=expr)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def prometheus(target: Target, tmp_path: Path) -> Iterator[Prometheus]:
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    prom = Prometheus(workdir, target.address)
    try:
        wait_for(prom.ready, 60, "prometheus to be ready")

        def scraped_enough() -> bool:
            # rate() over Grafana's window needs several samples of every series
            res = prom.query('count_over_time(pg2sink_up{job="pg2sink"}[1m])')
            result = res.get("data", {}).get("result", [])
            return bool(result) and float(result[0]["value"][1]) >= 6

        wait_for(scraped_enough, 60, "six scrapes of the target")
        yield prom
    finally:
        prom.stop()


def test_prometheus_scraping_pg2sink(target: Target, prometheus: Prometheus) -> None:
    """One Prometheus per variant (it takes ~8 s to gather enough samples), three checks."""
    assert prometheus.query('up{job="pg2sink"}')["data"]["result"][0]["value"][1] == "1"
    check_every_panel_returns_series(target, prometheus)
    check_dashboard_variables_find_the_target(target, prometheus)
    check_alert_rules_evaluate_cleanly(prometheus)


def check_every_panel_returns_series(target: Target, prometheus: Prometheus) -> None:
    failures = []
    queries = panel_queries(load_dashboard())
    assert len(queries) >= 25
    for title, ref, expr in queries:
        res = prometheus.query(expr)
        if res.get("status") != "success":
            failures.append(f"{title} [{ref}]: {res.get('error')}\n    {expr}")
        elif not res["data"]["result"]:
            failures.append(f"{title} [{ref}]: no series\n    {expr}")
    assert not failures, "panels without data:\n" + "\n".join(failures)


def check_dashboard_variables_find_the_target(target: Target, prometheus: Prometheus) -> None:
    # what Grafana's label_values(pg2sink_info, job) and
    # label_values(pg2sink_info{job=~"$job"}, instance) ask Prometheus
    jobs = prometheus.get("/api/v1/label/job/values", **{"match[]": "pg2sink_info"})
    assert jobs["data"] == ["pg2sink"]
    instances = prometheus.get(
        "/api/v1/label/instance/values", **{"match[]": 'pg2sink_info{job=~".*"}'}
    )
    assert instances["data"] == [target.address]


def check_alert_rules_evaluate_cleanly(prometheus: Prometheus) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        groups = prometheus.get("/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(not r["lastEvaluation"].startswith("0001") for r in rules):
            return rules
        return None

    rules = wait_for(evaluated, 30, "every alert rule to be evaluated")
    assert len(rules) == 8
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not bad
    # a healthy stream under a light workload pages nobody
    firing = [r["name"] for r in rules if r["state"] == "firing"]
    assert not firing
