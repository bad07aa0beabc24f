"""Observability: counters the stream updates, Prometheus metrics and the HTTP API.

    stats      StreamStats: plain attributes the hot path updates without locks
               (stdlib only, so the streaming core never imports prometheus_client)
    metrics    StatsCollector: pg2sink_* metric families built from a StreamStats
               at scrape time; make_registry() for a dedicated registry
    http       start_http_server(address, stats): /health /status /stats /metrics
    position   server_position(conn, slot): the server's WAL position and the slot

Metric names, labels and the JSON documents are described in docs/observability.md.
This package imports only `stats` eagerly; import `metrics`, `http` and
`position` from their modules.
"""

from pg2sink.observability.stats import (
    ImportProgress,
    LogCounter,
    ServerPosition,
    StreamStats,
    error_kind,
)

__all__ = ["ImportProgress", "LogCounter", "ServerPosition", "StreamStats", "error_kind"]
