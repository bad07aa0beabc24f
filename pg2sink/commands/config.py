"""`pg2sink config check FILE` and `pg2sink config show`: a configuration file checked
without connecting, or the settings `pg2sink stream` would run with (configshow.py)."""

from __future__ import annotations

import argparse

from pg2sink.commands.configs import stream_config
from pg2sink.configshow import config_command

__all__ = ["run"]


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return config_command(args, parser, stream_config)
