"""Imports connect as the stream does under TLS: every libpq TLS setting reaches pgjdbc.

A dedicated PostgreSQL with ssl=on, a self-signed CA made here with openssl, and a
pg_hba.conf that lets in only TLS connections with a client certificate (`cert`): a
pg2sink started with `sslmode=verify-full sslrootcert=... sslcert=... sslkey=...`
imports the table (its JDBC readers verified the server against the CA and showed the
client certificate). A libpq setting imports cannot honour stops the start with one
line and exit code 2, and never shows sslpassword.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import services
from psycopg import sql

from pg2sink.errors import ConfigError
from pg2sink.imports.jdbc import key_properties
from tests.conftest import PG_VERSION, Pg2Sink, clean_env, run_cli, wait_for
from tests.imports.support import IMPORTS_ON, read_changelog

pytestmark = pytest.mark.slow

SECRET = "Hunter2xyz"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(certs: Path, name: str, subject: str, extensions: str | None = None) -> None:
    """name.key (unencrypted PKCS-8 PEM, 0600) and name.crt signed by the CA."""
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
        "-out", f"{name}.csr", "-subj", subject, cwd=certs,
    )  # fmt: skip
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key"]
    args += ["-CAcreateserial", "-days", "2", "-out", f"{name}.crt"]
    if extensions is not None:
        (certs / f"{name}.ext").write_text(extensions)
        args += ["-extfile", f"{name}.ext"]
    _openssl(*args, cwd=certs)
    os.chmod(certs / f"{name}.key", 0o600)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[services.Postgres, Path]]:
    """A PostgreSQL that accepts only TLS connections with a certificate of its CA."""
    base = Path(tempfile.mkdtemp(prefix="pg2sink-tls-"))
    base.chmod(0o755)
    certs = base / "certs"
    certs.mkdir()
    certs.chmod(0o755)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=pg2sink test CA", cwd=certs,
    )  # fmt: skip
    _issue(certs, "server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\n")
    _issue(certs, "client", "/CN=postgres")  # cert authentication: CN = the role
    # the same key in the traditional RSA form: libpq reads it, pgjdbc does not
    _openssl("rsa", "-in", "client.key", "-traditional", "-out", "client-rsa.key", cwd=certs)
    os.chmod(certs / "client-rsa.key", 0o600)
    services._chown_to_server_user(certs / "server.key")
    hba = certs / "pg_hba.conf"
    hba.write_text(
        "hostssl all all 127.0.0.1/32 cert\n"
        "hostssl replication all 127.0.0.1/32 cert\n"
        "host all all 127.0.0.1/32 reject\n"
    )
    server = services.Postgres(
        base=base / "pg",
        port=services.free_port(),
        version=PG_VERSION,
        settings={
            "ssl": "on",
            "ssl_cert_file": str(certs / "server.crt"),
            "ssl_key_file": str(certs / "server.key"),
            "ssl_ca_file": str(certs / "ca.crt"),
            "hba_file": str(hba),
        },
    )
    server.start()
    try:
        yield server, certs
    finally:
        server.destroy()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _tls_dsn(server: services.Postgres, certs: Path, dbname: str, key: str = "client.key") -> str:
    return (
        f"{server.dsn(dbname)} sslmode=verify-full sslrootcert={certs / 'ca.crt'}"
        f" sslcert={certs / 'client.crt'} sslkey={certs / key}"
    )


def _database(server: services.Postgres, certs: Path, name: str) -> str:
    with psycopg.connect(_tls_dsn(server, certs, "postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = _tls_dsn(server, certs, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.items (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO public.items SELECT g, 'v' || g FROM generate_series(1, 500) g")
    return dsn


def _env(dsn: str, name: str) -> dict[str, str]:
    """pg2sink on database `name` (a slot of its own: slots are per server)."""
    return {
        **IMPORTS_ON,
        "PG2SINK_SOURCE": dsn,
        "PG2SINK_SLOT": f"slot_{name}",
        "PG2SINK_PUBLICATION": "tls_pub",
    }


def test_an_import_under_verify_full_with_a_client_certificate(
    tls_server: tuple[services.Postgres, Path], tmp_path: Path
) -> None:
    server, certs = tls_server
    dsn = _database(server, certs, "imports_tls")
    # without the certificate the server lets nobody in: the readers need every setting
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"{server.dsn('imports_tls')} sslmode=verify-full").close()
    out = tmp_path / "changes.jsonl"
    # sslpassword reaches the readers too (unused by an unencrypted key), never the log
    dsn = f"{dsn} sslpassword={SECRET}"
    env = clean_env(**_env(dsn, "imports_tls"), PG2SINK_PUBLICATION_POLL_INTERVAL="500ms")
    proc = Pg2Sink(["--file-path", str(out)], env, tmp_path).start()
    try:
        proc.wait_streaming(60)

        def done() -> bool:
            assert proc.proc is not None and proc.proc.poll() is None, proc.stderr()
            with psycopg.connect(dsn, autocommit=True) as conn:
                rows = conn.execute("SELECT state FROM pg2sink.import_jobs").fetchall()
            assert ("failed",) not in rows, proc.stderr()
            return rows == [("done",)]

        wait_for(done, 240, "the import")
    finally:
        code = proc.stop()
    assert code == 0, proc.stderr()
    assert SECRET not in proc.stderr() and SECRET.encode() not in out.read_bytes()
    imported = [r for r in read_changelog(out) if r.get("operation") == "IMPORT"]
    assert sorted(r["after"]["id"] for r in imported) == list(range(1, 501))


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ("sslcrl={certs}/none.crl", "sslcrl"),
        ("ssl_max_protocol_version=TLSv1.2", "ssl_max_protocol_version"),
        ("sslkey={certs}/client-rsa.key", "sslkey"),
    ],
)
def test_a_setting_imports_cannot_honour_stops_the_start(
    tls_server: tuple[services.Postgres, Path], extra: str, named: str
) -> None:
    server, certs = tls_server
    name = f"imports_refused_{named.split('=')[0]}"
    dsn = _database(server, certs, name)
    bad = f"{dsn} {extra.format(certs=certs)} sslpassword={SECRET}"
    r = run_cli("stream", "--file-path", "-", env=_env(bad, name))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert SECRET not in r.stderr + r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("pg2sink: error: imports cannot honour") and named in last, last
    # refused before anything was made: no slot, no publication left behind
    with psycopg.connect(dsn, autocommit=True) as conn:
        made = conn.execute(
            "SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s)"
            " + (SELECT count(*) FROM pg_publication WHERE pubname = 'tls_pub')",
            (f"slot_{name}",),
        ).fetchone()
    assert made == (0,)


def test_which_keys_pgjdbc_reads_as_libpq_does(tmp_path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", "ec.key", cwd=tmp_path)  # fmt: skip
    _openssl("pkcs8", "-topk8", "-in", "ec.key", "-passout", f"pass:{SECRET}",
             "-out", "locked.key", cwd=tmp_path)  # fmt: skip
    ec = str(tmp_path / "ec.key")
    assert key_properties(ec) == {"sslkey": ec, "pemKeyAlgorithm": "EC"}
    with pytest.raises(ConfigError, match="unencrypted PKCS-8"):
        key_properties(str(tmp_path / "locked.key"))
    (tmp_path / "ec.pk8").write_bytes((tmp_path / "ec.key").read_bytes())
    with pytest.raises(ConfigError, match=r"name it \*\.key or \*\.pem"):
        key_properties(str(tmp_path / "ec.pk8"))
