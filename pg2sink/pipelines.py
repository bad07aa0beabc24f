"""Several pipelines in one process: `pg2sink stream --config FILE` with [pipeline.NAME]
tables (configfile.py reads them, cli.py builds each one's StreamConfig).

Each pipeline is a StreamService (service.py) in a thread of its own, with its own
catalog and replication connections, changelog builder, sink instance, reconnect backoff
and StreamStats. What the process shares: the signals, the log (a pipeline's lines name
it: logs.PIPELINE), and one HTTP API with one /metrics, every pg2sink_* series labelled
`pipeline` (observability/).

A fault stays in its pipeline. A server down or unreachable (at start too), a busy slot,
a sink outage: retried with that pipeline's backoff while the others stream; /status
names it (500 until it streams again). An error retrying cannot help (wal_level,
privileges, a table it cannot read) ends that pipeline alone: logged with its name, left
unhealthy in /status, the others go on; once every pipeline ended, or at SIGTERM, the
process exits 2 with one line naming each pipeline that ended in error. SIGINT/SIGTERM
asks every pipeline to stop: each makes its final flush and confirms what its own sink
holds, all within STOP_SECONDS.

Two pipelines must not share a slot (a server's), a publication (a database's), an
output file or a spill directory: check_distinct refuses that before anything starts.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict

from pg2sink.config import SecretDsn, StreamConfig
from pg2sink.errors import ConfigError, Pg2SinkError
from pg2sink.formats.config import origin_of
from pg2sink.logs import PIPELINE
from pg2sink.service import StreamService, serve_http
from pg2sink.sinks.file import FileConfig
from pg2sink.subscription.loop import StopRequested

__all__ = ["STOP_SECONDS", "PipelinesFailedError", "check_distinct", "run_pipelines"]

log = logging.getLogger(__name__)

#: how long the pipelines' final flushes may take after SIGTERM, within the 10 s a
#: container runtime waits before it kills
STOP_SECONDS = 8.0


class PipelinesFailedError(Pg2SinkError):
    """One or more pipelines ended in an error (each was reported when it happened)."""


def _server_of(dsn: SecretDsn) -> tuple[str, str, str]:
    """(host, port, database) a source names, libpq's way (its keywords, else PGHOST,
    PGPORT, PGDATABASE): two pipelines on the same ones share the server's slots and the
    database's publications."""
    text = dsn.reveal()
    host, database = origin_of(text)
    try:
        port = conninfo_to_dict(text).get("port")
    except Exception:  # an invalid DSN is the source's error to report, not this one's
        port = None
    return host, str(port or os.environ.get("PGPORT") or "5432"), database


def check_distinct(configs: Mapping[str, StreamConfig]) -> None:
    """ConfigError for two pipelines that would share a slot on one server, a publication
    of one database, an output file or a spill directory."""
    seen: dict[tuple[str, ...], str] = {}

    def claim(key: tuple[str, ...], name: str, what: str) -> None:
        other = seen.setdefault(key, name)
        if other != name:
            raise ConfigError(
                f"pipelines {other} and {name} both use {what}: each pipeline needs its own"
            )

    for name, cfg in configs.items():
        src = cfg.source
        host, port, database = _server_of(src.dsn)
        server = f"{host or 'the local socket'}:{port}"
        claim(("slot", host, port, src.slot), name, f"slot {src.slot} on {server}")
        claim(
            ("publication", host, port, database, src.publication),
            name,
            f"publication {src.publication} of database {database} on {server}",
        )
        output = cfg.sink_config
        if (cfg.sink == "file" or cfg.decode_only) and isinstance(output, FileConfig):
            path = output.file_path
            shown = "standard output" if path == "-" else f"the file {path}"
            claim(("file", os.path.abspath(path) if path != "-" else path), name, shown)
        if cfg.streaming and cfg.spill_dir is not None:
            spill = os.path.abspath(cfg.spill_dir)
            claim(("spill", spill), name, f"--spill-dir {cfg.spill_dir}")


@dataclass
class _Pipeline:
    name: str
    service: StreamService
    thread: threading.Thread | None = None
    error: BaseException | None = None


def run_pipelines(configs: Mapping[str, StreamConfig]) -> None:
    """Run every pipeline until SIGINT/SIGTERM, or until each ended; PipelinesFailedError (exit
    2) naming the pipelines that ended in an error."""
    check_distinct(configs)
    pipelines = [
        _Pipeline(name, StreamService(cfg, pipeline=name)) for name, cfg in configs.items()
    ]
    # the process's settings are the same in every pipeline (configfile.PROCESS_OPTIONS)
    first = next(iter(configs.values()))
    stop = StopRequested()
    stop.install()
    try:
        http = serve_http(first, {p.name: p.service.stats for p in pipelines})
        try:
            for p in pipelines:
                p.thread = threading.Thread(
                    target=_run, args=(p,), name=f"pg2sink-pipeline-{p.name}", daemon=True
                )
                p.thread.start()
            where = f"; HTTP API and /metrics on {http.url}" if http is not None else ""
            log.info("running %d pipelines: %s%s", len(pipelines), ", ".join(configs), where)
            _wait(stop, pipelines)
        finally:
            _stop(pipelines)
            if http is not None:
                http.close()
    finally:
        stop.uninstall()
    failed = [p for p in pipelines if p.error is not None]
    if failed:
        raise PipelinesFailedError(
            "; ".join(f"pipeline {p.name}: {_reason(p.error)}" for p in failed)
        )


def _reason(error: BaseException | None) -> str:
    return str(error) if isinstance(error, Pg2SinkError) else f"internal error: {error!r}"


def _run(p: _Pipeline) -> None:
    """A pipeline's thread: its service until stopped; an error it ends with is its own."""
    PIPELINE.set(p.name)  # this thread's log lines name the pipeline
    try:
        p.service.run()
    except Pg2SinkError as e:
        p.error = e
        log.error("%s; this pipeline stopped, the others go on", e)
    except Exception as e:
        p.error = e
        log.exception("internal error; this pipeline stopped, the others go on")
    if p.error is not None:
        p.service.stats.replication_down(f"pipeline stopped: {_reason(p.error)}")


def _wait(stop: StopRequested, pipelines: list[_Pipeline]) -> None:
    """Until SIGINT/SIGTERM, or until no pipeline runs any longer."""
    while not stop.requested and any(
        p.thread is not None and p.thread.is_alive() for p in pipelines
    ):
        select.select([stop.fileno], [], [], 0.5)
        stop.drain()


def _stop(pipelines: list[_Pipeline]) -> None:
    """Ask every pipeline to stop, and wait up to STOP_SECONDS for their final flushes."""
    for p in pipelines:
        p.service.stop.request()
    deadline = time.monotonic() + STOP_SECONDS
    for p in pipelines:
        if p.thread is not None:
            p.thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [p.name for p in pipelines if p.thread is not None and p.thread.is_alive()]
    if stuck:
        # their slots resume from what they confirmed: at-least-once, nothing lost
        log.error(
            "pipelines %s did not stop within %gs; exiting without their final flush",
            ", ".join(stuck),
            STOP_SECONDS,
        )
