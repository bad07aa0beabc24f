"""The converter's output: pg2sink configurations, each a list of settings with the
seed setting each comes from, and notes on the seed settings with no equivalent; written
as the TOML that `--config` reads.

A Document is one source into one sink, the unit a `[pipeline.NAME]` section will hold
once pg2sink runs several in one process; until then each is its own file and process.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pg2sink.errors import ConfigError

__all__ = [
    "Conversion",
    "Document",
    "Section",
    "Setting",
    "go_duration",
    "integer",
    "notes_for",
    "render",
    "render_all",
    "strings",
    "toml_value",
]

#: a TOML value the converter writes
Value = str | int | float | bool | list[str]


@dataclass(frozen=True)
class Setting:
    """One pg2sink setting (its --config key) and where it comes from."""

    key: str
    value: Value
    origin: str
    """The seed's settings it comes from (`source.db1.dsn`), or why it is set."""


@dataclass
class Document:
    """One pg2sink configuration: one source into one sink."""

    name: str
    """Its file's name without `.toml` (`db1-kafka1`)."""
    title: str
    """What it converts (`source db1 -> sink kafka1`)."""
    command: str = "stream"
    settings: list[Setting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """The seed's settings with no pg2sink equivalent, each with why."""
    same: list[str] = field(default_factory=list)
    """The seed's settings that ask for what pg2sink does anyway (`async = false`)."""
    runnable: bool = True
    """False: pg2sink cannot run it yet; its settings are written commented out."""

    def set(self, key: str, value: Value, origin: str) -> None:
        self.settings = [s for s in self.settings if s.key != key]
        self.settings.append(Setting(key, value, origin))

    def note(self, section: Section, key: str, why: str) -> None:
        """When `section` sets `key`: a note naming it, and why it is not converted."""
        if section.get(key) is not None:
            self.notes.append(f"{section.origin(key)}: {why}")

    def value(self, key: str) -> Value | None:
        return next((s.value for s in self.settings if s.key == key), None)


@dataclass
class Conversion:
    """A seed tool's file converted."""

    tool: str
    """psql-streamer or wal-listener."""
    path: str
    documents: list[Document] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What applies to no document (a source no sink reads)."""


class Section:
    """A table of the seed's file, read as viper reads it: keys in any case. Remembers
    which keys were read, so that every other one gets a note."""

    def __init__(self, data: object, where: str, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: {where or 'the file'}: expected a table of settings")
        self.where = where
        self.path = path
        self._keys = {str(k).lower(): str(k) for k in data}
        self._data = {str(k): v for k, v in data.items()}
        self._read: set[str] = set()

    def names(self) -> list[str]:
        """The keys, as the file spells them."""
        return list(self._data)

    def get(self, key: str) -> Any:
        """The value of `key` (any case), None when it is not set."""
        name = self._keys.get(key.lower())
        if name is None:
            return None
        self._read.add(name)
        return self._data[name]

    def mark(self, *keys: str) -> None:
        """Count `keys` as read (converted elsewhere)."""
        for key in keys:
            self.get(key)

    def at(self, key: str) -> str:
        """`FILE: section.key`, for errors."""
        return f"{self.path}: {self.origin(key)}"

    def origin(self, key: str) -> str:
        """`section.key` as the file spells it."""
        name = self._keys.get(key.lower(), key)
        return f"{self.where}.{name}" if self.where else name

    def unread(self) -> list[tuple[str, Any]]:
        """(origin, value) of every key not read."""
        return [(self.origin(k), v) for k, v in self._data.items() if k not in self._read]


def integer(value: object, where: str) -> int:
    """An integer; ConfigError naming `where` else."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer")
    return value


def strings(value: object, where: str) -> list[str]:
    """A string or an array of strings, as a list; ConfigError naming `where` else."""
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        raise ConfigError(f"{where}: expected a string or an array of strings")
    return [str(v) for v in items]


#: a Go duration's parts (time.ParseDuration): 1h30m, 500ms, 1.5s
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def go_duration(value: object, where: str) -> float:
    """A Go duration as viper reads it (`10s`, `1m30s`; a bare number: nanoseconds) in
    seconds; ConfigError naming `where` for anything else."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) * 1e-9
    text = str(value).strip()
    if text == "0":
        return 0.0
    parts = _GO_PART.findall(text)
    if not isinstance(value, str) or "".join(n + u for n, u in parts) != text.lstrip("+"):
        raise ConfigError(f"{where}: not a Go duration: {value!r}")
    return sum(float(n) * _GO_UNIT[u] for n, u in parts)


def toml_value(value: object) -> str:
    """A value as TOML: a boolean, a number, an array, else a basic string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return str(value)
    # JSON's escapes are TOML's; raw non-ASCII is valid TOML, DEL must be escaped
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def _comment(text: str, indent: str = "") -> list[str]:
    """`text` as comment lines of at most 100 characters."""
    return textwrap.wrap(
        text,
        98 - len(indent),
        initial_indent=f"# {indent}",
        subsequent_indent="#   ",
        break_long_words=False,  # names and paths stay whole
        break_on_hyphens=False,
    )


def render(conversion: Conversion, document: Document) -> str:
    """A document as TOML: a header saying what it converts and how to run it, the
    notes, then one `key = value  # origin` line per setting (commented out when the
    document cannot run)."""
    lines = _comment(
        f"pg2sink configuration converted from {conversion.tool}'s {conversion.path}: "
        f"{document.title}. Run: pg2sink {document.command} --config {document.name}.toml"
    )
    notes = [*conversion.notes, *document.notes]
    if notes:
        lines += ["#", "# Not converted, or converted with a difference, and why:"]
        for note in notes:
            lines += _comment(note, "- ")
    if document.same:
        lines += ["#", *_comment("As pg2sink does anyway: " + ", ".join(document.same))]
    lines.append("")
    prefix = "" if document.runnable else "# "
    for s in document.settings:
        lines.append(f"{prefix}{s.key} = {toml_value(s.value)}  # {s.origin}")
    return "\n".join(lines) + "\n"


def render_all(conversion: Conversion) -> str:
    """Every document, one after the other (several: each under a line naming its file)."""
    if not conversion.documents:  # nothing to run: say why
        lines = _comment(f"{conversion.tool}'s {conversion.path}: nothing to convert")
        for note in conversion.notes:
            lines += _comment(note, "- ")
        return "\n".join(lines) + "\n"
    several = len(conversion.documents) > 1
    return "\n".join(
        (f"# ==== {d.name}.toml ====\n" if several else "") + render(conversion, d)
        for d in conversion.documents
    )


def notes_for(section: Section, tool: str) -> list[str]:
    """Notes on the keys of `section` the converter did not read: none the seed tool
    reads either (their values are not shown: a misspelt password's would be)."""
    return [f"{origin}: not a setting {tool} reads; left out" for origin, _ in section.unread()]
