"""The DuckDB sink's options (--sink=duckdb; docs/sinks/duckdb.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pg2sink.errors import ConfigError
from pg2sink.options import flag

GROUP = "duckdb sink (--sink=duckdb)"


@dataclass(frozen=True)
class DuckDBConfig:
    """Where the warehouse file is."""

    duckdb_path: str = flag(
        "",
        group=GROUP,
        help="DuckDB database file (created when missing); raw changelog tables and "
        "latest-state views per source table",
        metavar="PATH",
    )

    def check(self) -> None:
        """A path is given, is not standard output, and its directory exists."""
        path = self.duckdb_path
        if not path:
            raise ConfigError("--sink=duckdb needs --duckdb-path FILE")
        if path == "-" or path == ":memory:":
            raise ConfigError(f"--duckdb-path {path!r}: the sink needs a database file")
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise ConfigError(f"--duckdb-path {path!r}: no directory {directory!r}")
        if os.path.isdir(path):
            raise ConfigError(f"--duckdb-path {path!r} is a directory")
