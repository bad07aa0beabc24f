"""The HTTP API's access and run-time switches over real sockets: /debug/on and /debug/off
(psql-streamer's), a bearer token (--http-token-file) and TLS (--http-tls-cert/key),
with http.client here and curl against a real pg2sink process."""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import services

from pg2sink.observability.http import Access, Server, load_access, start_http_server
from pg2sink.observability.stats import StreamStats
from tests.conftest import Database, wait_for
from tests.support import Proc

TOKEN = "t0ken-n3ver-sh0wn"


@pytest.fixture
def cert(tmp_path: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1, made by openssl."""
    crt, key = tmp_path / "api.crt", tmp_path / "api.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(crt), str(key)


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


@pytest.fixture
def root_level() -> Iterator[None]:
    """The root logger's level as a run sets it, restored afterwards."""
    root = logging.getLogger()
    saved = root.level
    root.setLevel(logging.INFO)
    yield
    root.setLevel(saved)


def request(
    srv: Server, path: str, *, method: str = "GET", token: str | None = None, ca: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    if ca is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection(
            srv.host, srv.port, timeout=10
        )
    else:
        context = ssl.create_default_context(cafile=ca)
        conn = http.client.HTTPSConnection(srv.host, srv.port, timeout=10, context=context)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_debug_on_and_off_switch_the_root_log_level(root_level: None) -> None:
    with start_http_server("127.0.0.1:0", StreamStats()) as srv:
        status, _, body = request(srv, "/debug/on")
        assert (status, json.loads(body)) == (200, {"log_level": "debug"})
        assert logging.getLogger().level == logging.DEBUG
        status, _, body = request(srv, "/debug/off", method="POST")
        assert (status, json.loads(body)) == (200, {"log_level": "info"})
        assert logging.getLogger().level == logging.INFO
        assert request(srv, "/status", method="POST")[0] == 405


def test_a_token_guards_every_endpoint_but_health(root_level: None, token_file: str) -> None:
    access = load_access(token_file, None, None)
    with start_http_server("127.0.0.1:0", StreamStats(), access=access) as srv:
        assert request(srv, "/health")[0] == 200
        for path in ("/status", "/stats", "/metrics", "/debug/on"):
            status, headers, body = request(srv, path)
            assert status == 401 and headers["www-authenticate"].startswith("Bearer"), path
            assert request(srv, path, token="wrong")[0] == 401
            assert TOKEN.encode() not in body
        assert logging.getLogger().level == logging.INFO  # the refused /debug/on did nothing
        assert request(srv, "/stats", token=TOKEN)[0] == 200
        assert request(srv, "/status", token=TOKEN)[0] == 500  # nothing streams: unhealthy
        assert request(srv, "/debug/on", token=TOKEN)[0] == 200
        assert logging.getLogger().level == logging.DEBUG


def test_tls_serves_a_verifying_client_and_survives_a_plain_one(cert: tuple[str, str]) -> None:
    access = load_access(None, *cert)
    with start_http_server("127.0.0.1:0", StreamStats(), access=access) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            request(srv, "/health")  # plain HTTP to a TLS port: no answer
        status, _, body = request(srv, "/health", ca=cert[0])
        assert (status, json.loads(body)) == (200, {"status": "ok"})


def test_bad_access_files_are_one_line_errors(tmp_path: Path, cert: tuple[str, str]) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    for args, words in [
        ((str(empty), None, None), "is empty"),
        ((str(tmp_path / "none"), None, None), "No such file"),
        ((None, cert[0], None), "go together"),
        ((None, str(bad), cert[1]), "--http-tls-cert"),
    ]:
        with pytest.raises(ValueError, match=words) as e:
            load_access(*args)
        assert "\n" not in str(e.value)
    assert load_access(None, None, None) == Access()


def test_a_pg2sink_process_serves_its_api_over_tls_to_curl_with_the_token(
    db: Database, pg2sink_proc: Proc, tmp_path: Path, cert: tuple[str, str], token_file: str
) -> None:
    port = services.free_port()
    p = pg2sink_proc(
        "--file-path", str(tmp_path / "out.jsonl"), "--metrics-address", f"127.0.0.1:{port}",
        "--http-token-file", token_file, "--http-tls-cert", cert[0], "--http-tls-key", cert[1],
    ).start()  # fmt: skip
    p.wait_streaming()

    def curl(path: str, *extra: str) -> tuple[int, str]:
        done = subprocess.run(
            ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "--cacert", cert[0], *extra,
             f"https://127.0.0.1:{port}{path}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        body, _, code = done.stdout.rpartition("\n")
        return int(code), body

    bearer = ("-H", f"Authorization: Bearer {TOKEN}")
    assert curl("/status")[0] == 401
    code, body = curl("/status", *bearer)
    assert code == 200 and json.loads(body)["status"] == "ok"
    assert "DEBUG" not in p.stderr()
    assert curl("/debug/on", *bearer) == (200, '{"log_level":"debug"}')
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t VALUES (1)")
    wait_for(lambda: " DEBUG " in p.stderr(), what="debug lines after /debug/on")
    assert curl("/debug/off", *bearer)[0] == 200
    assert p.stop() == 0
    assert TOKEN not in p.stderr()
