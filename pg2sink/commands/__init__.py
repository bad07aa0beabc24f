"""The commands of `pg2sink`, a module each, and the one table from a command's name to
the function that runs it. cli.py parses the arguments (every command's options come
from the config classes) and hands them to `run`.

stream     stream.py    the service (pg2sink/service.py) until SIGINT or SIGTERM
replay     replay.py    the stream, leaving out the changes before --since
relay      relay.py     pg2sink's Kafka topics into another sink (pg2sink/relay/)
status     status.py    the slot, the publication, the role and the import jobs
import     status.py    a table's import requested again, or the import jobs listed
migrate    migrate.py   the internal schema created or upgraded
drop       drop.py      the slot, the publication and the DDL trigger dropped
config     config.py    a configuration file checked, or the effective settings shown
           convert.py   (config convert) psql-streamer's or wal-listener's file converted

A command's module is imported when it runs, so that `pg2sink status` does not load
the stream's modules.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

__all__ = ["COMMANDS", "run"]

#: each command: its module in this package and the function of it that runs the
#: command with the parsed arguments and the parser (what it prints goes to stdout;
#: errors raise; it returns the exit status, None for 0)
COMMANDS: dict[str, tuple[str, str]] = {
    "stream": ("stream", "run"),
    "replay": ("replay", "run"),
    "relay": ("relay", "run"),
    "status": ("status", "run_status"),
    "import": ("status", "run_import"),
    "migrate": ("migrate", "run"),
    "drop": ("drop", "run"),
    "config": ("config", "run"),
}


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the command `args.command`; the exit status (0: done)."""
    module, name = COMMANDS[args.command]
    command: Callable[[argparse.Namespace, argparse.ArgumentParser], int | None] = getattr(
        importlib.import_module(f"{__name__}.{module}"), name
    )
    return command(args, parser) or 0
