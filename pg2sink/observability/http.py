"""The HTTP API on --metrics-address: /health, /status, /stats, /metrics.

    GET /health   200 {"status": "ok"} while the process serves requests
    GET /status   200 when the replication connection and the sink are healthy and the
                  slot is valid, 500 otherwise; the JSON body names what is not and why,
                  and the slot's health at the last poll
    GET /stats    200, the StreamStats counters as JSON (schema in docs/observability.md)
    GET /metrics  200, Prometheus text format (OpenMetrics when the scraper asks)
    GET or POST /debug/on, /debug/off
                  200, the root log level to debug, or back to the level at start
                  (psql-streamer's endpoints)

A process running several pipelines serves one API for all: /metrics labels every
pg2sink_* series with `pipeline`; /status is 200 only when every pipeline is healthy, its
body each pipeline's status by name; /status/NAME and /stats/NAME are one pipeline's
documents, /stats holds them all by name.

With a token (--http-token-file) every endpoint but /health answers 401 unless the
request carries `Authorization: Bearer TOKEN`; with a certificate (--http-tls-cert) it
is served over TLS, the handshake made in the request's own thread.

A stdlib ThreadingHTTPServer in a daemon thread: requests never wait for the
replication loop, and the loop never waits for a request. The listener binds
to loopback unless told otherwise. Responses carry counters, LSNs, table names
and health reasons, never configuration; reasons pass through `redact` as a
second guard in case an error message quotes a secret.
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from pg2sink import __version__, options
from pg2sink.errors import ConfigError
from pg2sink.logical.lsn import format_lsn
from pg2sink.observability.access import Access, load_access
from pg2sink.observability.stats import StreamStats

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "DEFAULT_ADDRESS",
    "Access",
    "Server",
    "load_access",
    "parse_address",
    "serve_api",
    "start_http_server",
    "stats_document",
]

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1:9525"

_JSON = "application/json"


def parse_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' → (host, port). IPv6 hosts go in brackets: '[::1]:9525'.

    An empty host (':9525') means every IPv4 interface. Port 0 picks a free port.
    """
    text = address.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(
            f"invalid metrics address {address!r}: expected HOST:PORT, e.g. {DEFAULT_ADDRESS}"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(
            f"invalid metrics address {address!r}: put an IPv6 host in brackets, e.g. [::1]:9525"
        )
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(
            f"invalid metrics address {address!r}: the port must be a number from 0 to 65535"
        )
    return host or "0.0.0.0", int(port_text)


def stats_document(stats: StreamStats, now: float | None = None) -> dict[str, Any]:
    """The JSON body of GET /stats (documented in docs/observability.md)."""
    s = stats
    now = s.clock() if now is None else now
    tables: list[dict[str, Any]] = []
    for (schema, table), ops in sorted(dict(s.tables).items()):
        tables.append({"schema": schema, "table": table, **{k.lower(): v for k, v in ops.items()}})
    imports = [
        {
            "schema": schema,
            "table": table,
            "state": p.state,
            "rows_read": p.rows_read,
            "rows_estimated": p.rows_estimated,
            "error": p.error,
        }
        for (schema, table), p in sorted(dict(s.imports).items())
    ]
    return {
        "version": __version__,
        "uptime_seconds": round(now - s.started_at, 3),
        "healthy": s.healthy,
        "replication": {"connected": s.replication_connected, "reason": s.replication_reason},
        "sink": {
            "healthy": s.sink_healthy,
            "reason": s.sink_reason,
            "flushes": s.flush_seconds.count,
            "flush_seconds_total": round(s.flush_seconds.sum, 6),
            "flushed_records_total": int(s.flush_records.sum),
            "raw_buffer_bytes": s.raw_buffer_bytes,
        },
        "lsn": {
            "received": format_lsn(s.received_lsn),
            "confirmed": format_lsn(s.confirmed_lsn),
            "server": format_lsn(s.server_wal_lsn) if s.server_wal_lsn else None,
            "slot_restart": format_lsn(s.slot_restart_lsn) if s.slot_restart_lsn else None,
        },
        "lag": {"bytes": s.lag_bytes(), "seconds": round(s.lag_seconds(now), 3)},
        "last_ack_commit_time": (
            s.last_ack_commit_time.isoformat() if s.last_ack_commit_time else None
        ),
        "wal_retained_bytes": s.wal_retained_bytes(),
        "slot_active": s.slot_active,
        "slot_health": slot_health_document(s),
        "publication_tables": s.publication_tables,
        "publication_actions": dict(s.publication_actions),
        "messages": dict(sorted(dict(s.messages).items())),
        "changes": tables,
        "heartbeats": s.heartbeats,
        "errors": dict(sorted(dict(s.errors).items())),
        "log_messages": dict(sorted(dict(s.log_messages).items())),
        "imports": imports,
    }


def slot_health_document(s: StreamStats) -> dict[str, Any]:
    """The slot's health at the last poll, as /status and /stats show it."""
    since = s.slot_inactive_since
    return {
        "wal_status": s.slot_wal_status,
        "safe_wal_size": s.slot_safe_wal_size,
        "inactive_since": (datetime.fromtimestamp(since, UTC).isoformat() if since else None),
        "invalidation_reason": s.slot_invalidation_reason,
    }


def status_document(stats: StreamStats) -> tuple[bool, dict[str, Any]]:
    """(healthy, JSON body of GET /status)."""
    problems: dict[str, str] = {}
    if stats.slot_invalidation_reason is not None:
        problems["slot"] = f"invalidated ({stats.slot_invalidation_reason})"
    if not stats.replication_connected:
        problems["replication"] = stats.replication_reason or "not connected"
    if not stats.sink_healthy:
        problems["sink"] = stats.sink_reason or "unhealthy"
    body: dict[str, Any] = {
        "status": "ok" if not problems else "unhealthy",
        "replication": "ok" if "replication" not in problems else "failing",
        "sink": "ok" if "sink" not in problems else "failing",
    }
    if stats.server_sampled_at is not None:
        body["slot"] = slot_health_document(stats)
    if problems:
        body["problems"] = problems
    # a failed import is retried (--import-backoff-*): shown, not a health problem
    failed = {
        f"{schema}.{table}": p.error or "failed"
        for (schema, table), p in sorted(dict(stats.imports).items())
        if p.state == "failed"
    }
    if failed:
        body["imports_failed"] = failed
    return not problems, body


def pipelines_status(pipelines: Mapping[str, StreamStats]) -> tuple[bool, dict[str, Any]]:
    """(every pipeline healthy, JSON body of GET /status for several pipelines)."""
    each = {name: status_document(stats) for name, stats in pipelines.items()}
    healthy = all(ok for ok, _ in each.values())
    body = {
        "status": "ok" if healthy else "unhealthy",
        "unhealthy": [name for name, (ok, _) in each.items() if not ok],
        "pipelines": {name: doc for name, (_, doc) in each.items()},
    }
    return healthy, body


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = f"pg2sink/{__version__}"
    protocol_version = "HTTP/1.1"
    #: seconds an idle keep-alive connection may hold its thread
    timeout = 30

    def do_GET(self) -> None:
        self._respond(head=False)

    def do_HEAD(self) -> None:
        self._respond(head=True)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if path in _DEBUG:
            self._respond(head=False)
        else:
            body = orjson.dumps({"error": "method not allowed", "post": list(_DEBUG)})
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, _JSON, body, False)

    def _authorized(self) -> bool:
        token = self.server.app.access.token
        if token is None:
            return True
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        # compare_digest: the time taken says nothing of how much of the token matched
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), token)

    def _respond(self, head: bool) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        app = self.server.app
        try:
            if path != "/health" and not self._authorized():
                refusal = orjson.dumps({"error": "unauthorized: Authorization: Bearer TOKEN"})
                challenge = ("WWW-Authenticate", 'Bearer realm="pg2sink"')
                self._send(HTTPStatus.UNAUTHORIZED, _JSON, refusal, head, challenge)
            elif path in _DEBUG:
                level = logging.DEBUG if path == "/debug/on" else app.base_level
                logging.getLogger().setLevel(level)
                name = logging.getLevelName(level).lower()
                log.warning("log level %s, from the HTTP API (%s)", name, self.client_address[0])
                self._send(HTTPStatus.OK, _JSON, orjson.dumps({"log_level": name}), head)
            elif path == "/health":
                self._send(HTTPStatus.OK, _JSON, orjson.dumps({"status": "ok"}), head)
            elif path == "/status" or path.startswith("/status/"):
                self._status(path.removeprefix("/status").removeprefix("/"), head)
            elif path == "/stats" or path.startswith("/stats/"):
                self._stats(path.removeprefix("/stats").removeprefix("/"), head)
            elif path == "/metrics":
                # imported on the first scrape, not at start: prometheus_client is slow
                # to import, which every run would otherwise pay up front
                from prometheus_client.exposition import choose_encoder

                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._send(HTTPStatus.OK, content_type, encoder(app.registry()), head)
            else:
                self._not_found(head)
        except Exception:
            log.exception("HTTP API: %s %s failed", self.command, path)
            self._send(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                _JSON,
                orjson.dumps({"error": "internal error"}),
                head,
            )

    def _status(self, name: str, head: bool) -> None:
        """GET /status, or /status/NAME of one of several pipelines."""
        app = self.server.app
        if not name and app.pipelines is not None:
            healthy, body = pipelines_status(app.pipelines)
        else:
            stats = app.pipeline(name)
            if stats is None:
                self._not_found(head)
                return
            healthy, body = status_document(stats)
        code = HTTPStatus.OK if healthy else HTTPStatus.INTERNAL_SERVER_ERROR
        self._send(code, _JSON, app.json(body), head)

    def _stats(self, name: str, head: bool) -> None:
        """GET /stats (every pipeline's by name, when several), or /stats/NAME."""
        app = self.server.app
        if not name and app.pipelines is not None:
            each = {n: stats_document(s) for n, s in app.pipelines.items()}
            body: dict[str, Any] = {"version": __version__, "pipelines": each}
        else:
            stats = app.pipeline(name)
            if stats is None:
                self._not_found(head)
                return
            body = stats_document(stats)
        self._send(HTTPStatus.OK, _JSON, app.json(body), head)

    def _not_found(self, head: bool) -> None:
        app = self.server.app
        body: dict[str, Any] = {"error": "not found", "endpoints": list(_ENDPOINTS)}
        if app.pipelines is not None:
            body["pipelines"] = list(app.pipelines)
        self._send(HTTPStatus.NOT_FOUND, _JSON, orjson.dumps(body), head)

    def _send(
        self,
        code: HTTPStatus,
        content_type: str,
        body: bytes,
        head: bool,
        *headers: tuple[str, str],
    ) -> None:
        self.send_response(code)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # one DEBUG line per request instead of http.server's stderr lines
        if log.isEnabledFor(logging.DEBUG):
            log.debug("HTTP API %s: %s", self.client_address[0], format % args)


_DEBUG = ("/debug/on", "/debug/off")
_ENDPOINTS = ("/health", "/status", "/stats", "/metrics", *_DEBUG)


class _App:
    def __init__(
        self,
        stats: StreamStats | Mapping[str, StreamStats],
        registry: CollectorRegistry | None,
        redact: Callable[[str], str],
        access: Access,
    ) -> None:
        self.stats = stats
        #: several pipelines' stats by name (None: one pipeline alone, `stats`)
        self.pipelines = None if isinstance(stats, StreamStats) else stats
        self.access = access
        #: the level /debug/off restores: the one set at start (--log-level)
        self.base_level = logging.getLogger().level
        self._registry = registry
        self._lock = threading.Lock()
        self.redact = redact

    def registry(self) -> CollectorRegistry:
        """The metrics registry, made on first use (see the /metrics handler)."""
        with self._lock:
            if self._registry is None:
                from pg2sink.observability.metrics import make_registry

                self._registry = make_registry(self.stats)
            return self._registry

    def pipeline(self, name: str) -> StreamStats | None:
        """The stats of pipeline `name` ('' for one pipeline alone); None: no such one."""
        if self.pipelines is None:
            return self.stats if not name and isinstance(self.stats, StreamStats) else None
        return self.pipelines.get(name) if name else None

    def json(self, body: dict[str, Any]) -> bytes:
        return orjson.dumps(_redact_strings(body, self.redact))


def _redact_strings(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_strings(v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_strings(v, redact) for v in value]
    return value


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    app: _App

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that leaves mid-request or fails the TLS handshake: its problem, one
        # DEBUG line, not socketserver's traceback on stderr
        log.debug("HTTP API: a request from %s failed", client_address[0], exc_info=True)


class Server:
    """A running HTTP API; `close()` stops it and frees the port."""

    def __init__(self, httpd: _HTTPServer) -> None:
        self._httpd = httpd
        # close() waits up to one poll interval for serve_forever to notice
        self._thread = threading.Thread(
            target=httpd.serve_forever, args=(0.1,), name="pg2sink-http", daemon=True
        )
        self._thread.start()

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self._httpd.app.access.tls is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_http_server(
    address: str,
    stats: StreamStats | Mapping[str, StreamStats],
    *,
    registry: CollectorRegistry | None = None,
    redact: Callable[[str], str] = lambda text: text,
    access: Access | None = None,
) -> Server:
    """Serve /health, /status, /stats and /metrics for `stats` on `address` (HOST:PORT):
    one pipeline's, or several pipelines' by name.

    Raises ValueError for a malformed address and OSError when it cannot be
    bound (port in use, unknown host). `registry` defaults to make_registry(stats).
    """
    host, port = parse_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Bound(_HTTPServer):
        address_family = family

    httpd = Bound((host, port), _Handler)
    access = access if access is not None else Access()
    httpd.app = _App(stats, registry, redact, access)
    if access.tls is not None:
        # the handshake on the first read, in the request's thread: a slow or plain-HTTP
        # client never holds up the accepting loop
        httpd.socket = access.tls.wrap_socket(
            httpd.socket, server_side=True, do_handshake_on_connect=False
        )
    server = Server(httpd)
    log.debug("HTTP API listening on %s (%s)", server.url, " ".join(_ENDPOINTS))
    return server


def serve_api(
    address: str,
    stats: StreamStats | Mapping[str, StreamStats],
    token_file: str | None,
    cert: str | None,
    key: str | None,
) -> Server | None:
    """The HTTP API of `stats` (one pipeline's, or several pipelines' by name) on
    --metrics-address `address` ('off': None), with the
    access --http-token-file, --http-tls-cert and --http-tls-key give; ConfigError
    (one line) when the files cannot be read or the address cannot be listened on."""
    if address == "off":
        return None
    try:
        access = load_access(token_file, cert, key)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    options.add_secret(access.token)
    try:
        return start_http_server(address, stats, access=access)
    except ValueError as e:
        raise ConfigError(f"invalid --metrics-address {address!r}: {e}") from None
    except OSError as e:
        raise ConfigError(
            f"cannot listen on --metrics-address {address}: {e.strerror}; "
            "pick another address, or 'off'"
        ) from None
