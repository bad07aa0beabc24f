"""Who may use the HTTP API and how it is served (--http-token-file, --http-tls-cert,
--http-tls-key): the files read once at start, into an Access the handlers check."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

__all__ = ["Access", "load_access"]


@dataclass(frozen=True)
class Access:
    """Who may use the HTTP API and how it is served."""

    token: str | None = None
    """Required as `Authorization: Bearer TOKEN` on every endpoint but /health; None: none."""
    tls: ssl.SSLContext | None = None
    """Serve over TLS with this context; None: plain HTTP."""


def load_access(token_file: str | None, cert: str | None, key: str | None) -> Access:
    """The Access of --http-token-file, --http-tls-cert and --http-tls-key; ValueError
    naming the option for a file that cannot be used (never quoting the token)."""
    token = None
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise ValueError(f"--http-token-file {token_file}: {e.strerror}") from None
        if not token:
            raise ValueError(f"--http-token-file {token_file} is empty")
    if (cert is None) != (key is None):
        raise ValueError("--http-tls-cert and --http-tls-key go together")
    tls = None
    if cert is not None and key is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            tls.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            what = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ValueError(f"--http-tls-cert {cert} / --http-tls-key {key}: {what}") from None
    return Access(token, tls)
