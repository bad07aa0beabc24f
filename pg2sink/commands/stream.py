"""`pg2sink stream` (the default command): the service until SIGINT or SIGTERM; with a
--config file holding [pipeline.NAME] tables, every pipeline in this one process."""

from __future__ import annotations

import argparse

from pg2sink.commands.configs import stream_config
from pg2sink.service import run_stream

__all__ = ["run"]


def run(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> None:
    each_pipeline = getattr(args, "each_pipeline", None)  # set by cli.main
    if each_pipeline is None:
        run_stream(stream_config(args))
        return
    from pg2sink.pipelines import run_pipelines

    run_pipelines(each_pipeline(stream_config))
