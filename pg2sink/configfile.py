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

`[pipeline.NAME]` tables each hold one pipeline's settings (several pipelines in one
process: pg2sink/pipelines.py): a pipeline's values are the top level's, overridden by
its table's. The options of the whole process (PROCESS_OPTIONS) and `password_file` are
refused in a pipeline's table.

An unknown key, a value of the wrong type or a bad value is one line naming the file,
the line and the key (ConfigError, exit 2).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pg2sink.errors import ConfigError

__all__ = ["PROCESS_OPTIONS", "FileValue", "SettingsFile", "config_path", "load", "word_value"]

#: `${NAME}` in a string value
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: a `[pipeline.NAME]`'s name: a Prometheus label value and a path segment of /status/NAME
_PIPELINE_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")

#: options of the whole process, refused in a `[pipeline.NAME]` table: the one HTTP API
#: and log, the Spark driver the pipelines' imports share, the file itself
PROCESS_OPTIONS = frozenset(
    {
        "--metrics-address",
        "--http-token-file",
        "--http-tls-cert",
        "--http-tls-key",
        "--log-level",
        "--log-format",
        "--config",
        "--pipeline",
        "--spark-master",
        "--spark-driver-memory",
        "--spark-class-cache",
        "--jdbc-driver",
    }
)


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
    #: `[pipeline.NAME]` tables: each pipeline's own values, by name (empty: none)
    pipelines: Mapping[str, Mapping[str, FileValue]] = field(default_factory=dict)

    def merged(self, pipeline: str) -> dict[str, FileValue]:
        """A pipeline's values: the top level's, overridden by its own table's."""
        return {**self.values, **self.pipelines[pipeline]}


def word_value(argv: Iterable[str], flag: str) -> str | None:
    """`FLAG VALUE` (or `FLAG=VALUE`) among the arguments, before argparse reads them."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.partition("=")[2]
    return None


def config_path(argv: Iterable[str], environ: Mapping[str, str]) -> str | None:
    """`--config FILE` (or `--config=FILE`) among the arguments, else PG2SINK_CONFIG."""
    return word_value(argv, "--config") or environ.get("PG2SINK_CONFIG") or None


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


def _section_start(text: str, name: str) -> int:
    """Where `[pipeline.NAME]` starts in `text` (0 if it cannot be found)."""
    quoted = rf"(?:{re.escape(name)}|\"{re.escape(name)}\"|'{re.escape(name)}')"
    match = re.search(rf"^\s*\[\s*pipeline\s*\.\s*{quoted}\s*\]", text, re.MULTILINE)
    return match.start() if match else 0


class _Reader:
    """Turns a table of the file into option values, collecting the secrets it reads."""

    def __init__(
        self,
        path: str,
        raw: str,
        options: Mapping[str, tuple[bool, bool, bool]],
        environ: Mapping[str, str],
    ) -> None:
        self.path, self.raw, self.options, self.environ = path, raw, options, environ
        self.keys = {name.removeprefix("--").replace("-", "_"): name for name in options}
        self.secrets: list[str] = []
        self.password: str | None = None

    def where(self, key: str, section: str | None) -> str:
        start = 0 if section is None else _section_start(self.raw, section)
        line = _line_of(self.raw[start:], key)
        line = line + self.raw.count("\n", 0, start) if line else 0
        prefix = "" if section is None else f"[pipeline.{section}] "
        return f"{self.path}:{line}: {prefix}{key}"

    def values(self, table: Mapping[str, Any], section: str | None) -> dict[str, FileValue]:
        """The option values of `table`: the file's top level (section None) or one
        `[pipeline.NAME]`, where the process-wide options and password_file are refused."""
        values: dict[str, FileValue] = {}
        for key, value in table.items():
            where = self.where(key, section)
            normal = key.replace("-", "_")
            if normal == "password_file":
                if section is not None:
                    raise ConfigError(
                        f"{where}: sets libpq's password for the whole process; in a pipeline "
                        'write it in its source ("password=${VARIABLE}") or use source_file'
                    )
                path = _expand(str(value), where, self.environ, self.secrets)
                self.password = _read_secret(path, where)
                self.secrets.append(self.password)
                continue
            name, from_file = self._name(normal, where, section)
            values[name] = self._value(name, from_file, value, where)
        return values

    def _name(self, normal: str, where: str, section: str | None) -> tuple[str, bool]:
        """The option a key sets, and whether it is `KEY_file` (a secret read from a file)."""
        keys = self.keys
        from_file = normal.endswith("_file") and normal.removesuffix("_file") in keys
        name = keys.get(normal.removesuffix("_file") if from_file else normal)
        if name is None or (from_file and not self.options[name][2]):
            close = difflib.get_close_matches(normal, [*keys, "password_file"], n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{where}: unknown key{hint}")
        if section is not None and name in PROCESS_OPTIONS:
            raise ConfigError(
                f"{where}: a setting of the whole process (one HTTP API, one log, one "
                "Spark driver): set it at the top of the file, before the [pipeline.*] tables"
            )
        return name, from_file

    def _value(self, name: str, from_file: bool, value: Any, where: str) -> FileValue:
        repeat, switch, secret = self.options[name]
        environ, secrets = self.environ, self.secrets
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
        return FileValue(text, where)


def _pipelines(data: dict[str, Any], reader: _Reader) -> dict[str, dict[str, FileValue]]:
    """The `[pipeline.NAME]` tables of the file (taken out of `data`), by name."""
    tables = data.pop("pipeline", {})
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise ConfigError(
            f"{reader.where('pipeline', None)}: expected [pipeline.NAME] tables of settings"
        )
    pipelines = {}
    for name, table in tables.items():
        if not _PIPELINE_NAME.fullmatch(name):
            line = reader.raw.count("\n", 0, _section_start(reader.raw, name)) + 1
            raise ConfigError(
                f"{reader.path}:{line}: [pipeline.{name}]: a pipeline's name is letters, "
                "digits, '_' and '-' (a metric label, and a path: /status/NAME)"
            )
        pipelines[name] = reader.values(table, name)
    return pipelines


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
    reader = _Reader(path, raw, options, environ)
    pipelines = _pipelines(data, reader)
    values = reader.values(data, None)
    secrets = tuple(s for s in reader.secrets if s)
    return SettingsFile(path, values, secrets, reader.password, pipelines)
