"""Wiring of `pg2sink stream` and `pg2sink drop`: connections, checks, retries.

One streaming session = catalog connection + server checks + publication
reconcile + slot + replication connection + the replication loop. A session
that loses its connection after it started is retried with backoff (the
slot keeps our position, so nothing is lost); a failure before the first
session started is reported and exits, unless --retry-initial asks to wait
(a standby instance waiting for the active one's slot).
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import ExitStack
from typing import TextIO

from pg2sink.catalog.catalog import Catalog
from pg2sink.catalog.server import check_server, connect
from pg2sink.config import SourceConfig, StreamConfig
from pg2sink.errors import ConfigError, Pg2SinkError
from pg2sink.publication.manager import PublicationManager
from pg2sink.publication.patterns import TableFilter
from pg2sink.sinks.base import Sink
from pg2sink.sinks.file import FileSink
from pg2sink.subscription.handlers import ChangelogHandler, DecodeOnlyHandler
from pg2sink.subscription.replication import ReplicationStream
from pg2sink.subscription.slot import drop_slot, ensure_slot
from pg2sink.subscription.stream import ChangeHandler, StopRequested, Streamer

log = logging.getLogger(__name__)

SINKS = ("file", "kafka")

_BACKOFF_CAP = 30.0


def make_sink(cfg: StreamConfig) -> Sink:
    """The sink `cfg` asks for (not opened yet)."""
    if cfg.sink == "file":
        return FileSink(cfg.file_path)
    if cfg.sink == "kafka":
        if cfg.kafka is None:
            raise ConfigError("--sink=kafka needs --kafka-bootstrap-servers")
        try:
            # imported here: confluent-kafka and fastavro are the optional [kafka] extra
            from pg2sink.sinks.kafka import KafkaSink
        except ImportError as e:
            raise ConfigError(
                f"--sink=kafka needs the kafka extra (pip install 'pg2sink[kafka]'): {e}"
            ) from None
        return KafkaSink(cfg.kafka)
    raise ConfigError(f"unknown --sink {cfg.sink!r}: choose one of {', '.join(SINKS)}")


def _open_output(path: str) -> TextIO:
    if path == "-":
        return sys.stdout
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot open --file-path {path!r}: {e.strerror}") from None


class StreamService:
    """Runs streaming sessions until SIGINT/SIGTERM."""

    def __init__(self, cfg: StreamConfig) -> None:
        self.cfg = cfg
        self.stop = StopRequested()
        self.table_filter = TableFilter.from_patterns(cfg.source.tables, cfg.source.exclude_tables)
        self.started = False

    def run(self) -> None:
        self.stop.install()
        sink: Sink | None = None
        out: TextIO | None = None
        try:
            if self.cfg.decode_only:
                out = _open_output(self.cfg.file_path)
            else:
                sink = make_sink(self.cfg)
                sink.open()
            self._loop(sink, out)
        finally:
            if sink is not None:
                sink.close()
            if out is not None and out is not sys.stdout:
                out.close()
            self.stop.uninstall()

    def _loop(self, sink: Sink | None, out: TextIO | None) -> None:
        delay = self.cfg.retry_interval if not self.started else 1.0
        last_error = ""
        while not self.stop.requested:
            try:
                self._session(sink, out)
                return
            except Pg2SinkError as e:
                if not e.retryable or not (self.started or self.cfg.retry_initial):
                    raise
                if str(e) != last_error:  # log once per state change
                    log.warning("%s; retrying", e)
                    last_error = str(e)
                self._sleep(delay)
                delay = min(delay * 2, _BACKOFF_CAP) if self.started else delay

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.requested and time.monotonic() < deadline:
            time.sleep(min(0.2, deadline - time.monotonic()))

    def _session(self, sink: Sink | None, out: TextIO | None) -> None:
        src = self.cfg.source
        with ExitStack() as stack:
            conn = connect(src.dsn)
            stack.callback(conn.close)
            check_server(conn)
            manager = PublicationManager(
                conn, src.publication, src.schemas, self.table_filter, src.internal_schema
            )
            manager.reconcile()
            ensure_slot(conn, src.slot)
            repl = ReplicationStream(connect(src.dsn, replication=True))
            stack.callback(repl.close)
            repl.start(src.slot, src.publication)
            if not self.started:
                log.info("pg2sink is streaming")
            self.started = True
            handler: ChangeHandler
            if out is not None:
                handler = DecodeOnlyHandler(out)
            else:
                assert sink is not None
                handler = ChangelogHandler(Catalog(conn), sink)
            streamer = Streamer(
                repl,
                handler,
                heartbeat_interval=self.cfg.heartbeat_interval,
                flush_interval=self.cfg.flush_interval,
                poll_interval=self.cfg.publication_poll_interval,
                poll=manager.reconcile,
                confirm=out is None,
                stop=self.stop,
            )
            streamer.run()


def run_stream(cfg: StreamConfig) -> None:
    StreamService(cfg).run()


def run_drop(src: SourceConfig) -> list[str]:
    """Drop the slot and the publication; returns what was done, line by line."""
    conn = connect(src.dsn)
    done: list[str] = []
    try:
        if drop_slot(conn, src.slot):
            done.append(f"dropped replication slot {src.slot}")
        else:
            done.append(f"replication slot {src.slot} did not exist")
        manager = PublicationManager(
            conn, src.publication, src.schemas, TableFilter(), src.internal_schema
        )
        if manager.drop():
            done.append(f"dropped publication {src.publication}")
        else:
            done.append(f"publication {src.publication} did not exist")
    finally:
        conn.close()
    return done
