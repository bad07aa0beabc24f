"""The HTTP API over a real socket: /health, /status, /stats, /metrics."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pg2sink.observability.http import (
    Server,
    parse_address,
    start_http_server,
    status_document,
)
from pg2sink.observability.stats import ImportProgress, ServerPosition, StreamStats


@pytest.fixture
def stats() -> StreamStats:
    return StreamStats()


@pytest.fixture
def server(stats: StreamStats) -> Iterator[Server]:
    with start_http_server("127.0.0.1:0", stats) as srv:
        yield srv


def get(
    srv: Server, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(srv: Server, path: str) -> tuple[int, Any]:
    status, headers, body = get(srv, path)
    assert headers["content-type"] == "application/json"
    return status, json.loads(body)


def test_health_answers_while_the_process_lives(server: Server) -> None:
    assert get_json(server, "/health") == (200, {"status": "ok"})


def test_status_names_what_is_unhealthy(server: Server, stats: StreamStats) -> None:
    status, body = get_json(server, "/status")
    assert status == 500
    assert body == {
        "status": "unhealthy",
        "replication": "failing",
        "sink": "failing",
        "problems": {"replication": "not connected yet", "sink": "not open yet"},
    }
    stats.replication_up()
    stats.sink_up()
    assert get_json(server, "/status") == (
        200,
        {"status": "ok", "replication": "ok", "sink": "ok"},
    )
    stats.sink_down("cannot flush 'out.jsonl': No space left on device")
    status, body = get_json(server, "/status")
    assert status == 500
    assert body["replication"] == "ok"
    assert body["problems"] == {"sink": "cannot flush 'out.jsonl': No space left on device"}


def test_stats_is_the_counters_as_json(server: Server, stats: StreamStats) -> None:
    stats.table_changes("public", "customers")["INSERT"] += 3
    stats.messages["insert"] = 3
    stats.acknowledge(0x16B374D848)
    stats.heartbeats = 2
    stats.imports[("public", "orders")] = ImportProgress(10, 100, "running")
    status, body = get_json(server, "/stats")
    assert status == 200
    assert body["changes"] == [
        {
            "schema": "public",
            "table": "customers",
            "insert": 3,
            "update": 0,
            "delete": 0,
            "truncate": 0,
            "import": 0,
        }
    ]
    assert body["messages"]["insert"] == 3
    assert body["messages"]["begin"] == 0
    assert body["lsn"]["confirmed"] == "16/B374D848"
    assert body["lsn"]["server"] is None
    assert body["lag"] == {"bytes": None, "seconds": 0.0}
    assert body["heartbeats"] == 2
    assert body["imports"] == [
        {
            "schema": "public",
            "table": "orders",
            "state": "running",
            "rows_read": 10,
            "rows_estimated": 100,
            "error": None,
        }
    ]
    assert body["healthy"] is False


def test_metrics_in_prometheus_text_format(server: Server, stats: StreamStats) -> None:
    stats.heartbeats = 5
    status, headers, body = get(server, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["pg2sink_heartbeats"].samples[0].value == 5


def test_metrics_in_openmetrics_when_asked(server: Server) -> None:
    status, headers, body = get(
        server, "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_unknown_path_is_404_and_head_has_no_body(server: Server) -> None:
    status, _, body = get(server, "/nope")
    assert status == 404
    assert json.loads(body)["endpoints"] == [
        *("/health", "/status", "/stats", "/metrics", "/debug/on", "/debug/off")
    ]
    status, headers, body = get(server, "/health", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    # a query string or a trailing slash does not matter
    assert get(server, "/health/?x=1")[0] == 200


def test_reasons_pass_through_redact(stats: StreamStats) -> None:
    stats.sink_down("SASL authentication failed for password hunter2")
    with start_http_server(
        "127.0.0.1:0", stats, redact=lambda text: text.replace("hunter2", "***")
    ) as srv:
        for path in ("/status", "/stats", "/metrics", "/health"):
            _, _, body = get(srv, path)
            assert b"hunter2" not in body, path
        assert get_json(srv, "/status")[1]["problems"]["sink"].endswith("password ***")


def test_close_frees_the_port(stats: StreamStats) -> None:
    srv = start_http_server("127.0.0.1:0", stats)
    port = srv.port
    srv.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_address_in_use_is_an_oserror(server: Server, stats: StreamStats) -> None:
    with pytest.raises(OSError):
        start_http_server(f"127.0.0.1:{server.port}", stats)


def test_ipv6_loopback(stats: StreamStats) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        srv = start_http_server("[::1]:0", stats)
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    with srv:
        assert srv.url.startswith("http://[::1]:")
        assert get(srv, "/health")[0] == 200


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9525", ("127.0.0.1", 9525)),
        ("localhost:0", ("localhost", 0)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        (":9525", ("0.0.0.0", 9525)),
        ("[::1]:9525", ("::1", 9525)),
        ("[::]:9525", ("::", 9525)),
        (" 127.0.0.1:9525 ", ("127.0.0.1", 9525)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9525", "expected HOST:PORT"),
        ("localhost", "expected HOST:PORT"),
        ("127.0.0.1:http", "port must be a number"),
        ("127.0.0.1:70000", "port must be a number"),
        ("127.0.0.1:", "port must be a number"),
        ("::1:9525", "IPv6 host in brackets"),
    ],
)
def test_parse_address_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_address(text)


def test_status_names_an_invalidated_slot_and_shows_its_health() -> None:
    stats = StreamStats()
    stats.replication_up()
    stats.sink_up()
    healthy = ServerPosition(0x3000, 0x800, True, "extended", 1 << 20)
    stats.set_server_position(healthy)
    ok, body = status_document(stats)
    assert ok and body["slot"]["wal_status"] == "extended"
    assert body["slot"]["safe_wal_size"] == 1 << 20 and "problems" not in body
    lost = ServerPosition(0x3000, None, False, "lost", None, 1.7e9, "wal_removed")
    stats.set_server_position(lost)
    ok, body = status_document(stats)
    assert not ok and not stats.healthy
    assert body["problems"] == {"slot": "invalidated (wal_removed)"}
    assert body["slot"]["invalidation_reason"] == "wal_removed"
    assert body["slot"]["inactive_since"].startswith("2023-11-14T")
