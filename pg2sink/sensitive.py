"""Values that hold secrets and never show them: a libpq DSN, KAFKA-style KEY=VALUE
client settings, a URL's password.

Each type reveals its secrets only to the client library (`reveal()`), lists them for
log redaction (`secrets()`), and shows itself without them (str, repr).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping

import psycopg.conninfo
from psycopg import pq

from pg2sink.errors import ConfigError

#: libpq settings whose value is a secret: the password, and the client key's passphrase
_SECRET_DSN_KEYS = ("password", "sslpassword")


class SecretDsn:
    """A libpq connection string whose password never leaks through str/repr."""

    __slots__ = ("_dsn",)

    def __init__(self, dsn: str, option: str = "--source") -> None:
        try:
            # Parsing validates both key=value DSNs and postgresql:// URIs.
            psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as e:
            raise ConfigError(f"invalid {option} connection string: {_scrub(str(e))}") from None
        self._dsn = dsn

    def reveal(self) -> str:
        """The full DSN, for handing to libpq only."""
        return self._dsn

    @property
    def password(self) -> str | None:
        return _password_of(self._dsn)

    def secrets(self) -> list[str]:
        """The values that must never appear in output: password, sslpassword."""
        params = psycopg.conninfo.conninfo_to_dict(self._dsn)
        return [str(params[k]) for k in _SECRET_DSN_KEYS if params.get(k)]

    def redacted(self) -> str:
        """The DSN without its secrets, for messages and logs."""
        params = psycopg.conninfo.conninfo_to_dict(self._dsn)
        for key in _SECRET_DSN_KEYS:
            params.pop(key, None)
        return psycopg.conninfo.make_conninfo("", **params) or "(libpq environment)"

    def __repr__(self) -> str:
        return f"SecretDsn({self.redacted()!r})"

    __str__ = redacted


def _scrub(message: str) -> str:
    """libpq's complaint about a DSN it could not parse, without the DSN's text but its
    key names.

    libpq quotes what it could not parse (`missing "=" after "..."`, `invalid connection
    option "..."`, a whole URI), and what it could not parse is often a password: an
    unquoted space inside one, a `%` that is not percent-encoding. So every quoted part
    that is not a libpq keyword goes, and a hint says how to quote a value."""
    message = " ".join(message.split())
    keywords = _libpq_keywords()
    message = re.sub(r'"([^"]*)"', lambda m: _shown(m.group(1), keywords), message)
    message = re.sub(r"(password\s*=\s*)\S+", r"\1***", message)
    if "missing" in message and "after" in message:
        message += " (a value holding spaces goes in single quotes: password='a b')"
    return message


def _shown(quoted: str, keywords: frozenset[str]) -> str:
    """A part libpq quoted, if it is a key name or punctuation (`missing "=" after`)."""
    return f'"{quoted}"' if quoted in keywords or quoted in ("=", "]") else '"..."'


def _password_of(dsn: str) -> str | None:
    try:
        pw = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:
        return None
    return str(pw) if pw else None


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    """Every connection option libpq knows (host, sslmode...): names, never secrets."""
    return frozenset(d.keyword.decode() for d in pq.Conninfo.get_defaults())


#: Parts of a client setting's name that mark its value as a secret (sasl.password,
#: ssl.key.password, sasl.jaas.config, basic.auth.user.info, bearer.auth.token, ssl.key.pem...).
_SECRET_KEY_PARTS = ("password", "secret", "user.info", "token", "jaas", ".pem", "credentials")


_SETTING_KEY = re.compile(r"[A-Za-z0-9_.-]+")


def is_secret_setting(key: str) -> bool:
    """Whether the value of client setting `key` must never be shown."""
    key = key.lower()
    return any(part in key for part in _SECRET_KEY_PARTS)


class Settings:
    """KEY=VALUE client settings (librdkafka, the registry client) whose secrets never leak.

    `reveal()` gives the values for handing to the client; str/repr mask every secret.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        self._items: dict[str, str] = dict(items or {})

    @classmethod
    def parse(cls, pairs: Iterable[str], flag: str) -> Settings:
        """Settings from `KEY=VALUE` strings; ConfigError naming `flag` for a bad one."""
        items: dict[str, str] = {}
        for number, pair in enumerate(pairs, 1):
            key, eq, value = pair.partition("=")
            key = key.strip()
            if not eq or not _SETTING_KEY.fullmatch(key):
                # never the text: without a well-formed key, it may be any part of a
                # secret (PG2SINK_KAFKA_CONFIG='sasl.password=a,b' once showed 'b')
                raise ConfigError(
                    f"invalid {flag} (setting {number}): expected KEY=VALUE with a key of "
                    "letters, digits, '.', '_' or '-' (the text is not shown: it may hold "
                    "a secret)"
                )
            items[key] = value
        return cls(items)

    def reveal(self) -> dict[str, str]:
        """The settings with their real values, for the client library only."""
        return dict(self._items)

    def secrets(self) -> list[str]:
        """The values that must never appear in output."""
        return [v for k, v in self._items.items() if v and is_secret_setting(k)]

    def get(self, key: str) -> str | None:
        return self._items.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __bool__(self) -> bool:
        return bool(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and other._items == self._items

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items.items())))

    def __repr__(self) -> str:
        shown = {k: "***" if is_secret_setting(k) else v for k, v in self._items.items()}
        return f"Settings({shown!r})"

    __str__ = __repr__


def url_password(url: str) -> str | None:
    """The password of a `scheme://user:password@host` URL, if any."""
    m = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@:]*:([^/@]*)@", url)
    return m.group(1) if m and m.group(1) else None
