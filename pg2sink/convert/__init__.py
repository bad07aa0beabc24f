"""`pg2sink config convert FILE`: the configuration files of the tools pg2sink succeeds
as pg2sink configurations (docs/configuration.md, "Moving from psql-streamer /
wal-listener").

    model.py          the output: documents of settings, each naming the seed setting
                      it comes from, notes on what has no equivalent; rendered as TOML
    psql_streamer.py  psql-streamer's TOML: one document per source a sink reads
    wal_listener.py   wal-listener's config.yml: one document

The file's kind comes from its extension (.toml: psql-streamer; .yml, .yaml:
wal-listener), else from its content.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml

from pg2sink.convert import psql_streamer, wal_listener
from pg2sink.convert.model import Conversion, render, render_all
from pg2sink.errors import ConfigError

__all__ = ["Conversion", "convert_file", "render", "render_all"]


def _toml(text: str) -> dict[str, Any] | None:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def _yaml(text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def convert_file(path: str) -> Conversion:
    """The pg2sink configurations of the seed tool's file at `path`; ConfigError, one
    line naming the file, when it cannot be read or is neither tool's."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    suffix = Path(path).suffix.lower()
    if suffix == ".toml":
        data = _toml(text)
        if data is None:
            raise ConfigError(f"{path}: not TOML (psql-streamer's configuration is TOML)")
        return psql_streamer.convert(data, path)
    if suffix in (".yml", ".yaml"):
        found = _yaml(text)
        if not isinstance(found, dict):
            raise ConfigError(f"{path}: not a YAML mapping (wal-listener's config.yml is one)")
        return wal_listener.convert(found, path)
    data = _toml(text)
    if data is not None and ("source" in data or "sink" in data):
        return psql_streamer.convert(data, path)
    found = _yaml(text)
    if isinstance(found, dict) and {"listener", "database", "nats"} & {
        str(k).lower() for k in found
    }:
        return wal_listener.convert(found, path)
    raise ConfigError(
        f"{path}: neither psql-streamer's TOML ([source.NAME], [sink.NAME]) nor "
        "wal-listener's YAML (listener, database, nats)"
    )
