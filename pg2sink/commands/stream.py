"""`pg2sink stream` (the default command): the service until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse

from pg2sink.commands.configs import stream_config
from pg2sink.service import run_stream

__all__ = ["run"]


def run(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> None:
    run_stream(stream_config(args))
