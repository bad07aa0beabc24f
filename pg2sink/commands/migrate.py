"""`pg2sink migrate`: the internal schema created or upgraded (yoyo-migrations)."""

from __future__ import annotations

import argparse

from pg2sink.commands.configs import source_config
from pg2sink.imports.migrate import apply_migrations

__all__ = ["run"]


def run(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> None:
    src = source_config(args)
    applied = apply_migrations(src.dsn, src.internal_schema)
    print(
        f"applied {len(applied)} migration(s) to schema {src.internal_schema}"
        + (": " + ", ".join(applied) if applied else " (it was up to date)")
    )
