"""The NATS JetStream sink's options (--sink=nats; docs/sinks/nats.md)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pg2sink.errors import ConfigError
from pg2sink.formats.config import Formatting
from pg2sink.options import duration, flag
from pg2sink.sinks.nats.context import NatsContext, url_secrets

__all__ = ["DEFAULT_URL", "NatsConfig", "shown_url", "subject_problem", "url_secrets"]

GROUP = "nats sink (--sink=nats)"

#: what a subject token may not hold: the separator, the wildcards, whitespace
_NOT_IN_TOKEN = re.compile(r"[.*>\s]")
#: what JetStream refuses in a stream name (it names a directory of the server's store)
_NOT_IN_STREAM = re.compile(r"[.*>\s/\\]")

DEFAULT_URL = "nats://127.0.0.1:4222"
#: settings given together: a flag of one group leaves the file's whole group out, so a
#: --nats-token never meets the file's user (the token would be refused beside it)
_GROUPS = (
    ("nats_creds", "nats_user", "nats_password", "nats_token"),
    ("nats_tls_cert", "nats_tls_key"),
    ("nats_tls_ca",),
    ("nats_url",),
)


@dataclass(frozen=True)
class NatsConfig:
    """What `--sink=nats` needs (docs/sinks/nats.md). A field's `help` documents it; a
    docstring under a field says what the code needs beyond it."""

    nats_config: NatsContext | None = flag(  # noqa: RUF009 (flag() is dataclasses.field())
        None,
        group=GROUP,
        help="a nats CLI context file (~/.config/nats/context/NAME.json) to take the URL, "
        "credentials and TLS files from; the flags given override it",
        metavar="FILE",
        build=lambda path, name: NatsContext.load(path, name),
        repr=False,
    )
    """Merged into the fields below by __post_init__; its secrets are registered for
    redaction as it is built (options.build)."""
    nats_url: str = flag(
        "",
        group=GROUP,
        help="NATS server(s), nats://[user:password@]host:port[,nats://...]; tls:// for TLS; "
        f"default: --nats-config's url, else {DEFAULT_URL}",
        metavar="URL",
        parse=str.strip,
        secret=True,
        repr=False,
    )
    """May hold a password or a token in its user info, hence not in repr. Never empty
    after __post_init__ ("": not given)."""
    nats_subject_prefix: str = flag(
        "pg2sink",
        group=GROUP,
        help="a table's changes go to PREFIX.<schema>.<table>, its Schema records to "
        "PREFIX.<schema>.<table>.schema, messages (--messages) to PREFIX.messages; with "
        "--format wal-listener, wal-listener's topicPrefix: a table's events go to "
        "PREFIX<schema>_<table> and no Schema record is sent",
        metavar="PREFIX",
        parse=str.strip,
    )
    nats_stream: str | None = flag(
        None,
        group=GROUP,
        help="the JetStream stream holding PREFIX.>, created when missing; default: the "
        "prefix with each '.' as '_'",
        metavar="NAME",
    )
    nats_creds: str | None = flag(
        None,
        group=GROUP,
        help="credentials file (JWT and NKey seed) to log in with",
        metavar="FILE",
    )
    nats_user: str | None = flag(None, group=GROUP, help="user name to log in with", metavar="USER")
    nats_password: str | None = flag(
        None,
        group=GROUP,
        help="password of --nats-user",
        metavar="PASSWORD",
        secret=True,
        repr=False,
    )
    nats_token: str | None = flag(
        None,
        group=GROUP,
        help="authentication token to log in with",
        metavar="TOKEN",
        secret=True,
        repr=False,
    )
    nats_tls_ca: str | None = flag(
        None,
        group=GROUP,
        help="CA certificates (PEM) the server's TLS certificate is checked against; implies TLS",
        metavar="FILE",
    )
    nats_tls_cert: str | None = flag(
        None,
        group=GROUP,
        help="client certificate (PEM) for servers that verify clients (mutual TLS); implies TLS",
        metavar="FILE",
    )
    nats_tls_key: str | None = flag(
        None,
        group=GROUP,
        help="private key (PEM) of --nats-tls-cert, unless that file holds it",
        metavar="FILE",
    )
    nats_ack_timeout: float = duration(
        10.0,
        GROUP,
        "longest wait for JetStream's acknowledgements before the connection is "
        "replaced, and for room while the server is away before the stream restarts "
        "from the last confirmed position",
    )
    nats_duplicate_window: float = duration(
        120.0,
        GROUP,
        "duplicate window of a stream pg2sink creates: a message published again within "
        "it (same Nats-Msg-Id) is stored once",
    )
    format: str = "json"
    """The message format: the shared --format option's choice (formats/config.py, set by
    the CLI): json or a formats/ encoder's name."""
    formatting: Formatting = field(default_factory=Formatting)
    """What the format's encoder needs beyond its name (set by the CLI)."""

    def __post_init__(self) -> None:
        # the flags given win, group by group (_GROUPS); frozen, hence object.__setattr__.
        # Idempotent: dataclasses.replace() runs it again on filled fields.
        given = self.nats_config.settings() if self.nats_config else {}
        for group in _GROUPS:
            if all(getattr(self, f) in (None, "") for f in group):
                for f in group:
                    if f in given:
                        object.__setattr__(self, f, given[f])
        if not self.nats_url:
            object.__setattr__(self, "nats_url", DEFAULT_URL)

    @property
    def stream(self) -> str:
        """The stream's name: --nats-stream, else the prefix with '.' as '_'."""
        return self.nats_stream or self.nats_subject_prefix.replace(".", "_")

    def check(self) -> None:
        """ConfigError for what can be checked without a server (the CLI calls it)."""
        prefix = self.nats_subject_prefix
        # wal-listener's subjects follow the prefix with no '.' of their own
        problem = subject_problem(
            prefix.removesuffix(".") if self.format == "wal-listener" else prefix
        )
        if problem:
            raise ConfigError(f"invalid --nats-subject-prefix {prefix!r}: {problem}")
        if _NOT_IN_STREAM.search(self.stream):
            raise ConfigError(
                f"invalid --nats-stream {self.stream!r}: no '.', '*', '>', '/', '\\' or spaces"
            )
        for url in self.nats_url.split(","):
            if urlsplit(url.strip()).scheme not in ("nats", "tls"):
                raise ConfigError(
                    "invalid --nats-url: expected nats://host:port or tls://host:port"
                )
        if self.nats_password is not None and self.nats_user is None:
            raise ConfigError("--nats-password needs --nats-user")
        if self.nats_token is not None and self.nats_user is not None:
            raise ConfigError("--nats-token and --nats-user exclude each other")
        if self.nats_tls_key is not None and self.nats_tls_cert is None:
            raise ConfigError("--nats-tls-key needs --nats-tls-cert")
        for name, path in (
            ("--nats-creds", self.nats_creds),
            ("--nats-tls-ca", self.nats_tls_ca),
            ("--nats-tls-cert", self.nats_tls_cert),
            ("--nats-tls-key", self.nats_tls_key),
        ):
            if path is not None and not os.access(path, os.R_OK):
                raise ConfigError(f"cannot read {name} {path!r}")

    def secrets(self) -> list[str]:
        """Every secret value of this configuration (for log redaction)."""
        out = [s for s in (self.nats_password, self.nats_token) if s]
        for url in self.nats_url.split(","):
            out += url_secrets(url.strip())
        return out


def subject_problem(subject: str) -> str | None:
    """Why `subject` cannot be published to (None: it can)."""
    if not subject or any(not t or _NOT_IN_TOKEN.search(t) for t in subject.split(".")):
        return "dot-separated tokens without spaces, '*' or '>'"
    return None


def shown_url(url: str) -> str:
    """The URL(s) without their user info, for logs and errors."""
    out = []
    for one in url.split(","):
        parts = urlsplit(one.strip())
        out.append(f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}")
    return ",".join(out)
