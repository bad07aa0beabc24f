"""`--config FILE`: settings from a TOML file, below flags and PG2SINK_ variables.

Every option has a key: its long flag without the dashes, with `-` or `_` between words
(`slot`, `file_path`, `kafka-bootstrap-servers`); a repeatable option takes an array or
one string, a switch a boolean, a duration a string ("10s") or a number of seconds. The
file's values become the options' defaults (options.add_option reads them after the
environment), so a flag wins over a variable, which wins over the file. A secret may come
from the environment or a file instead of the text: `"${NAME}"` in a string is
variable NAME's value (an unset one is an error), and `KEY_file = "PATH"` reads a
secret option's value from PATH (`mask_key_file`, `source_file`); `password_file`
sets the source's password (libpq's PGPASSWORD, a secret).

An unknown key, a value of the wrong type or a bad value is one line naming the file,
the line and the key (ConfigError, exit 2).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pg2sink.errors import ConfigError

__all__ = ["FileValue", "SettingsFile", "config_path", "load"]

#: `${NAME}` in a string value
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class FileValue:
    """One key's value as option text: a string, or strings for a repeatable option."""

    text: str | list[str]
    where: str
    """`FILE:LINE: KEY`, for errors."""


@dataclass(frozen=True)
class SettingsFile:
    """A read configuration file: the values by option name (`--slot`)."""

    path: str
    values: Mapping[str, FileValue]
    #: secrets read from the file (the environment's or files' text), to redact
    secrets: tuple[str, ...] = ()
    password: str | None = None


def config_path(argv: Iterable[str], environ: Mapping[str, str]) -> str | None:
    """`--config FILE` (or `--config=FILE`) among the arguments, else PG2SINK_CONFIG."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--config="):
            return arg.partition("=")[2]
    return environ.get("PG2SINK_CONFIG") or None


def _line_of(text: str, key: str) -> int:
    """The line where `key` is set (1-based; 0 if it cannot be found)."""
    pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=", re.MULTILINE)
    match = pattern.search(text)
    return text.count("\n", 0, match.start()) + 1 if match else 0


def _expand(value: str, where: str, environ: Mapping[str, str], secrets: list[str]) -> str:
    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise ConfigError(f"{where}: ${{{name}}} names an unset environment variable")
        secrets.append(environ[name])
        return environ[name]

    return _REFERENCE.sub(variable, value)


def _read_secret(path: str, where: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read {path}: {e.strerror}") from None


def _text(value: Any, where: str, repeat: bool, switch: bool) -> str | list[str]:
    """A TOML value as the option's text; ConfigError for a wrong type."""
    if switch:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {type(value).__name__}")
        return "true" if value else "false"
    if repeat:
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in items):
            raise ConfigError(f"{where}: expected a string or an array of strings")
        return [str(v) for v in items]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f"{where}: expected a string or a number, got {type(value).__name__}")
    return str(value)


def load(
    path: str,
    options: Mapping[str, tuple[bool, bool, bool]],
    environ: Mapping[str, str] | None = None,
) -> SettingsFile:
    """Read `path`; `options` maps each option's long name (`--slot`) to (repeatable,
    switch, secret). ConfigError, one line, for anything the file gets wrong."""
    environ = os.environ if environ is None else environ
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--config {path}: {e.strerror}") from None
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not TOML: {e}") from None
    keys = {name.removeprefix("--").replace("-", "_"): name for name in options}
    values: dict[str, FileValue] = {}
    secrets: list[str] = []
    password = None
    for key, value in data.items():
        where = f"{path}:{_line_of(raw, key)}: {key}"
        normal = key.replace("-", "_")
        if normal == "password_file":
            password = _read_secret(_expand(str(value), where, environ, secrets), where)
            secrets.append(password)
            continue
        from_file = normal.endswith("_file") and normal.removesuffix("_file") in keys
        name = keys.get(normal.removesuffix("_file") if from_file else normal)
        if name is None or (from_file and not options[name][2]):
            close = difflib.get_close_matches(normal, [*keys, "password_file"], n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{where}: unknown key{hint}")
        repeat, switch, secret = options[name]
        text = _text(value, where, repeat, switch)
        if isinstance(text, str):
            text = _expand(text, where, environ, secrets)
            if from_file:
                text = _read_secret(text, where)
            if secret:
                secrets.append(text)
        else:
            text = [_expand(t, where, environ, secrets) for t in text]
            if secret:
                secrets.extend(text)
        values[name] = FileValue(text, where)
    return SettingsFile(path, values, tuple(s for s in secrets if s), password)
