"""--nats-config FILE: the connection settings of a nats CLI context file.

The file is the JSON the `nats` command line tool keeps per context
(`~/.config/nats/context/NAME.json`, written by `nats context save`), so a NATS user
points pg2sink at the context they already use instead of copying its secrets into
flags. Its keys (natscli's natscontext package):

    url, user, password, token, creds,  ->  --nats-url, --nats-user, --nats-password,
    cert, key, ca                           --nats-token, --nats-creds, --nats-tls-cert,
                                            --nats-tls-key, --nats-tls-ca
    name, description, color_scheme     ->  ignored (the tool's own)
    nkey, user_jwt, user_seed, nsc,     ->  refused when set (pg2sink cannot log in or
    jetstream_*, inbox_prefix, ...          route that way), accepted when empty

`nats context save` writes every key, the unused ones empty, so an empty value is
"not set". Any other key is refused: a typo must not silently leave a setting out.
Paths may start with `~`. NatsConfig merges the result under its flags
(config.py, `merged`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pg2sink.errors import ConfigError

#: the context keys pg2sink uses: key -> NatsConfig field
USED = {
    "url": "nats_url",
    "user": "nats_user",
    "password": "nats_password",
    "token": "nats_token",
    "creds": "nats_creds",
    "cert": "nats_tls_cert",
    "key": "nats_tls_key",
    "ca": "nats_tls_ca",
}
#: the keys holding a path to a file pg2sink reads
PATHS = ("creds", "cert", "key", "ca")
#: the nats tool's own settings, meaningless to a client
IGNORED = ("name", "description", "color_scheme")
#: settings pg2sink has no equivalent for: refused unless empty (or false)
UNSUPPORTED = (
    "nkey",
    "user_jwt",
    "user_seed",
    "nsc",
    "jetstream_domain",
    "jetstream_api_prefix",
    "jetstream_event_prefix",
    "inbox_prefix",
    "socks_proxy",
    "tls_first",
    "windows_cert_store",
    "windows_cert_match_by",
    "windows_cert_match",
    "windows_ca_certs_match",
)


@dataclass(frozen=True)
class NatsContext:
    """The settings a context file gives, each None when it gives none."""

    path: str
    url: str | None = field(default=None, repr=False)
    """May hold a password or a token in its user info."""
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds: str | None = None
    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    @classmethod
    def load(cls, path: str, option: str = "--nats-config") -> NatsContext:
        """The file's settings; ConfigError (one line, no value quoted: any may be a
        secret) for a file that cannot be read or that pg2sink cannot follow."""
        where = f"{option} {path!r}"
        try:
            with open(os.path.expanduser(path), encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read {where}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"invalid {where}: not UTF-8 text") from None
        except json.JSONDecodeError as e:
            # the message names a position, never the text there
            raise ConfigError(f"invalid {where}: not JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"invalid {where}: expected a JSON object (a nats context)")
        values = {k: _setting(where, k, v) for k, v in data.items()}
        ctx = cls(path, **{k: v for k, v in values.items() if k in USED and v is not None})
        ctx._check(where)
        return ctx

    def _check(self, where: str) -> None:
        if self.password is not None and self.user is None:
            raise ConfigError(f"invalid {where}: password needs user")
        if self.token is not None and self.user is not None:
            raise ConfigError(f"invalid {where}: token and user exclude each other")
        if self.key is not None and self.cert is None:
            raise ConfigError(f"invalid {where}: key needs cert")
        for url in (self.url or "nats://").split(","):
            if urlsplit(url.strip()).scheme not in ("nats", "tls"):
                raise ConfigError(
                    f"invalid {where}: url: expected nats://host:port or tls://host:port"
                )
        if self.creds is not None and "://" in self.creds:
            raise ConfigError(f"invalid {where}: creds: pg2sink reads a file path only")
        for key in PATHS:
            value = getattr(self, key)
            if value is not None and not os.access(value, os.R_OK):
                raise ConfigError(f"cannot read {key} {value!r} of {where}")

    def settings(self) -> dict[str, str]:
        """NatsConfig field -> value, for the settings given."""
        return {f: v for k, f in USED.items() if (v := getattr(self, k)) is not None}

    def secrets(self) -> list[str]:
        """The password, the token and the URL's user info (for log redaction)."""
        out = [s for s in (self.password, self.token) if s]
        for url in (self.url or "").split(","):
            out += url_secrets(url.strip())
        return out


def url_secrets(url: str) -> list[str]:
    """The secrets of a NATS URL's user info: the password of user:password, or the
    token of token@host (a user info without a colon is a token to NATS)."""
    info, at, _ = urlsplit(url).netloc.rpartition("@")
    if not at or not info:
        return []
    user, colon, password = info.partition(":")
    if colon:
        return [password] if password else []
    return [user]


def _setting(where: str, key: str, value: Any) -> str | None:
    """One key's value: a text for a used key (None when empty), None for the others;
    ConfigError for an unknown key or an unsupported setting."""
    if key in USED:
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ConfigError(f"invalid {where}: {key} must be a string")
        text = value.strip()
        return os.path.expanduser(text) if key in PATHS else text
    if key in IGNORED:
        return None
    if key in UNSUPPORTED:
        if value in (None, "", False, []):
            return None
        raise ConfigError(f"invalid {where}: {key} is set, and pg2sink does not support it")
    raise ConfigError(
        f"invalid {where}: unknown key {key!r} (not a key of a nats context file; "
        f"pg2sink reads {', '.join(USED)})"
    )
