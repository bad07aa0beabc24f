"""The NATS sink's TLS and logins against a nats-server of the test's own that requires
TLS, verifies client certificates (mutual TLS) and lets in one user by password.

The certificates are made with openssl in the test's directory: a CA, the server's
(for 127.0.0.1) and a client's, each signed by the CA.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import services

from pg2sink.errors import SinkError
from pg2sink.sinks.nats.config import NatsConfig
from pg2sink.sinks.nats.context import NatsContext
from tests.conftest import run_cli
from tests.sinks.nats.test_nats import NO_SERVER, change, opened, table_schema

PASSWORD = "Hunter7xyz"


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: Path
    server_key: Path
    client: Path
    client_key: Path


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


def signed(d: Path, name: str, ca: Path, ca_key: Path, extensions: str) -> tuple[Path, Path]:
    """A P-256 key and a certificate for `name` signed by the CA, with `extensions`."""
    key, csr, cert, ext = (d / f"{name}.{s}" for s in ("key", "csr", "pem", "ext"))
    ext.write_text(extensions)
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={name}")  # fmt: skip
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
            "-days", "1", "-out", cert, "-extfile", ext)  # fmt: skip
    return cert, key


def make_certs(d: Path) -> Certs:
    ca, ca_key = d / "ca.pem", d / "ca.key"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=CA")  # fmt: skip
    server, server_key = signed(d, "server", ca, ca_key, "subjectAltName=IP:127.0.0.1\n")
    client, client_key = signed(d, "client", ca, ca_key, "extendedKeyUsage=clientAuth\n")
    return Certs(ca, server, server_key, client, client_key)


class TlsNats(services.NatsServer):
    """A nats-server reading `<base>/tls.conf` (written before it starts) besides the
    usual flags."""

    def command(self) -> list[str]:
        return [*super().command(), "--config", str(self.base / "tls.conf")]


@pytest.fixture
def tls_nats(tmp_path: Path) -> Iterator[tuple[TlsNats, Certs]]:
    certs = make_certs(tmp_path)
    server = TlsNats(base=tmp_path / "nats", port=services.free_port())
    server.base.mkdir(parents=True)
    (server.base / "tls.conf").write_text(
        f"""
tls {{
  cert_file: "{certs.server}"
  key_file: "{certs.server_key}"
  ca_file: "{certs.ca}"
  verify: true
  timeout: 5
}}
authorization {{
  users = [{{user: me, password: "{PASSWORD}"}}]
}}
"""
    )
    server.start()
    try:
        yield server, certs
    finally:
        server.stop()


def test_mutual_tls_and_a_password_let_the_sink_publish(
    tls_nats: tuple[TlsNats, Certs], topic_prefix: str
) -> None:
    server, certs = tls_nats
    cfg = NatsConfig(
        nats_url=server.url,  # nats://: TLS because of the certificates
        nats_subject_prefix=topic_prefix,
        nats_user="me",
        nats_password=PASSWORD,
        nats_tls_ca=str(certs.ca),
        nats_tls_cert=str(certs.client),
        nats_tls_key=str(certs.client_key),
    )
    with opened(cfg) as sink:  # connected, and the stream created
        sink.write(table_schema("t"))
        sink.write(change(1))
        sink.checkpoint(2000)
        assert sink.flush() == 2000  # JetStream acknowledged both over TLS
    # without a client certificate the server refuses the handshake
    no_cert = NatsConfig(
        nats_url=server.url, nats_user="me", nats_password=PASSWORD, nats_tls_ca=str(certs.ca)
    )
    with pytest.raises(SinkError, match="cannot connect to NATS at"), opened(no_cert):
        pass


def test_a_wrong_password_over_mutual_tls_is_one_line_exit_2(
    tls_nats: tuple[TlsNats, Certs],
) -> None:
    server, certs = tls_nats
    wrong = f"{PASSWORD}-not"
    env = {
        **NO_SERVER,
        "PG2SINK_SINK": "nats",
        "PG2SINK_NATS_URL": server.url,
        "PG2SINK_NATS_USER": "me",
        "PG2SINK_NATS_PASSWORD": wrong,
        "PG2SINK_NATS_TLS_CA": str(certs.ca),
        "PG2SINK_NATS_TLS_CERT": str(certs.client),
        "PG2SINK_NATS_TLS_KEY": str(certs.client_key),
    }
    res = run_cli(env=env)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"cannot connect to NATS at {server.url}: " in res.stderr
    assert "authorization violation" in res.stderr.lower()
    assert wrong not in res.stderr + res.stdout and PASSWORD not in res.stderr


def test_a_context_file_gives_the_tls_files_and_the_login(
    tls_nats: tuple[TlsNats, Certs], topic_prefix: str, tmp_path: Path
) -> None:
    server, certs = tls_nats
    path = tmp_path / "ctx.json"
    path.write_text(
        json.dumps(
            {
                "url": server.url,
                "user": "me",
                "password": PASSWORD,
                "ca": str(certs.ca),
                "cert": str(certs.client),
                "key": str(certs.client_key),
                "nkey": "",
                "tls_first": False,
            }
        )
    )
    cfg = NatsConfig(nats_config=NatsContext.load(str(path)), nats_subject_prefix=topic_prefix)
    with opened(cfg) as sink:
        sink.write(table_schema("t"))
        sink.checkpoint(20)
        assert sink.flush() == 20  # acknowledged over mutual TLS, logged in from the file
