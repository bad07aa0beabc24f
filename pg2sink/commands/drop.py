"""`pg2sink drop`: the slot, the publication pg2sink manages and the --capture-ddl
trigger removed; on a hot standby the slot is the standby's and the rest the primary's
(--primary). A publication pg2sink did not create is left as it is."""

from __future__ import annotations

import argparse

from pg2sink.catalog.server import connect
from pg2sink.catalog.standby import connect_primary, in_recovery
from pg2sink.commands.configs import source_config
from pg2sink.config import SourceConfig
from pg2sink.imports.migrate import set_capture_ddl
from pg2sink.publication.manager import PublicationManager
from pg2sink.publication.patterns import TableFilter
from pg2sink.subscription.slot import drop_slot


def run_drop(src: SourceConfig) -> list[str]:
    """Drop the slot and the publication; returns what was done, line by line."""
    conn = connect(src.dsn)
    primary = conn
    done: list[str] = []
    try:
        if drop_slot(conn, src.slot):
            done.append(f"dropped replication slot {src.slot}")
        else:
            done.append(f"replication slot {src.slot} did not exist")
        writer = src.dsn
        if in_recovery(conn):  # the slot was the standby's; the rest is the primary's
            primary = connect_primary(conn, src.primary, src.publication, src.internal_schema)
            writer = src.primary or src.dsn
        manager = PublicationManager(
            primary,
            src.publication,
            src.schemas,
            TableFilter(),
            src.internal_schema,
            mode=src.publication_mode,
        )
        kept = manager.kept()
        if kept is not None:
            done.append(kept)
        elif manager.drop():
            done.append(f"dropped publication {src.publication}")
        else:
            done.append(f"publication {src.publication} did not exist")
        if set_capture_ddl(writer, src.internal_schema, src.slot, src.publication, False):
            done.append("dropped the --capture-ddl event trigger")
    finally:
        if primary is not conn:
            primary.close()
        conn.close()
    return done


def run(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> None:
    """`pg2sink drop`: what was done, a line each."""
    for line in run_drop(source_config(args)):
        print(line)
