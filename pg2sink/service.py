"""Wiring of `pg2sink stream`: connections, checks, retries.

One streaming session = catalog connection + server checks + publication
reconcile + slot + replication connection + the replication loop. A session
that loses its connection after it started is retried with backoff (the
slot keeps our position, so nothing is lost); a failure before the first
session started is reported and exits, unless --retry-initial asks to wait
(a standby instance waiting for the active one's slot).

With several pipelines in one process (pipelines.py) a service is one, in a thread: the
process owns the signals and the HTTP API; a failure at start is retried as later.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import TextIO

import psycopg
from psycopg.rows import TupleRow

from pg2sink.catalog.catalog import Catalog
from pg2sink.catalog.server import check_server, connect
from pg2sink.catalog.standby import (
    connect_primary,
    in_recovery,
    primary_position,
    wait_for_replay,
    warn_without_feedback,
)
from pg2sink.config import StreamConfig
from pg2sink.errors import (
    ConfigError,
    ConnectError,
    Pg2SinkError,
    ServerConfigError,
    SinkError,
    SlotBusyError,
)
from pg2sink.imports import jobs
from pg2sink.imports.engine import ImportEngine
from pg2sink.imports.gate import ImportGate
from pg2sink.imports.jdbc import connection_properties
from pg2sink.imports.migrate import apply_migrations, set_capture_ddl
from pg2sink.observability.http import Server, serve_api
from pg2sink.observability.position import (
    check_slot_valid,
    invalidated_message,
    server_position,
)
from pg2sink.observability.stats import LogCounter, StreamStats
from pg2sink.publication.generated import check_generated_server
from pg2sink.publication.manager import PublicationManager, Reconciliation
from pg2sink.publication.patterns import TableFilter
from pg2sink.publication.published import Table
from pg2sink.routing.check import check_tables, unmatched_rules
from pg2sink.routing.outbox import check_sink, publisher_for
from pg2sink.routing.stage import RoutingStage
from pg2sink.sinks import entries
from pg2sink.sinks.base import ImportTarget, Sink, UsesSlot
from pg2sink.sinks.file import FileConfig, repair_torn_line
from pg2sink.subscription.connection import ReplicationStream
from pg2sink.subscription.handlers import ChangelogHandler, DecodeOnlyHandler, Feed
from pg2sink.subscription.in_progress import (
    StreamingHandler,
    check_streaming_server,
    default_spill_dir,
)
from pg2sink.subscription.loop import ChangeHandler, StopRequested, Streamer
from pg2sink.subscription.reconnect import Reconnect
from pg2sink.subscription.slot import (
    check_failover_server,
    enable_failover,
    ensure_slot,
    standby_nudge,
)

log = logging.getLogger(__name__)

#: SQLSTATEs of a server that ended the session: admin_shutdown, crash_shutdown,
#: cannot_connect_now (class 08, connection exceptions, is matched as a class)
#: https://www.postgresql.org/docs/current/errcodes-appendix.html
_SERVER_GONE = frozenset({"57P01", "57P02", "57P03"})


def make_sink(cfg: StreamConfig) -> Sink:
    """The sink `cfg` asks for (not opened yet), by its entry (sinks/entries.py)."""
    sink = entries.entry(cfg.sink).create(cfg.sink_config)
    if isinstance(sink, UsesSlot):
        sink.use_slot(cfg.source.slot)
    return sink


def _open_output(path: str) -> TextIO:
    """--decode-only's output: standard output, or a file appended to after cutting a
    line a crash tore at its end (as the file sink does, sinks/file/append.py)."""
    if path == "-":
        return sys.stdout
    out: TextIO | None = None
    try:
        out = open(path, "a", encoding="utf-8")  # noqa: SIM115 (run() closes it)
        repair_torn_line(out.fileno(), path)
    except OSError as e:
        if out is not None:
            out.close()
        raise ConfigError(f"cannot open --file-path {path!r}: {e.strerror}") from None
    return out


class StreamService:
    """Runs streaming sessions until SIGINT/SIGTERM."""

    #: how a session's sink is made (`pg2sink replay` wraps it: pg2sink/commands/replay.py)
    make_sink = staticmethod(make_sink)
    #: whether sessions confirm to the slot what the sink holds (`pg2sink replay` does
    #: not unless told: the window stays for the next replay)
    advances_slot = True

    def __init__(self, cfg: StreamConfig, *, pipeline: str | None = None) -> None:
        #: its name among several pipelines of the process (pipelines.py); None: alone
        self.pipeline = pipeline
        if cfg.routing.outbox and not cfg.decode_only:
            check_sink(cfg.sink, cfg.routing.outbox_headers_column is not None)
        self.cfg = cfg
        #: --only, --exclude-column, --mask-column, --outbox (pg2sink/routing/)
        self.rules = cfg.routing.rules()
        self._routes_checked = False
        self._internal_left_out = False
        self.stop = StopRequested()
        self.table_filter = TableFilter.from_patterns(cfg.source.tables, cfg.source.exclude_tables)
        self.started = False
        self.http: Server | None = None
        self.stats = StreamStats()
        self.reconnect = Reconnect(cfg.retry_interval)
        #: imports (docs/imports.md): the stream's gate and the job thread, unless
        #: --no-imports or --decode-only
        self.imports = cfg.imports and not cfg.decode_only
        self.gate: ImportGate | None = ImportGate() if self.imports else None
        self.engine: ImportEngine | None = None
        #: where pg2sink's schema and import jobs are written: --source, or --primary
        #: while --source is a standby (set by each session's _prepare)
        self._writer = cfg.source.dsn
        self.stats.info.update(
            slot=cfg.source.slot,
            publication=cfg.source.publication,
            sink="decode-only" if cfg.decode_only else cfg.sink,
        )

    def run(self) -> None:
        alone = self.pipeline is None
        if alone:
            self.stop.install()
        counter = LogCounter(self.stats, self.pipeline)
        logging.getLogger().addHandler(counter)
        sink: Sink | None = None
        out: TextIO | None = None
        http: Server | None = None
        try:
            http = self.http = serve_http(self.cfg, self.stats) if alone else None
            if self.cfg.decode_only:
                output = self.cfg.sink_config
                out = _open_output(output.file_path if isinstance(output, FileConfig) else "-")
            else:
                sink = self.make_sink(self.cfg)
                sink.open()
            self.stats.sink_up()
            self._loop(sink, out)
        except Pg2SinkError as e:
            self.stats.count_error(e)
            raise
        finally:
            if self.engine is not None:
                self.engine.stop()
            if sink is not None:
                sink.close()
            if out is not None and out is not sys.stdout:
                out.close()
            if http is not None:
                http.close()
            logging.getLogger().removeHandler(counter)
            self.stop.uninstall() if alone else self.stop.close()

    def _loop(self, sink: Sink | None, out: TextIO | None) -> None:
        while not self.stop.requested:
            try:
                self._session(sink, out)
                return
            except psycopg.Error as e:
                if not _server_lost(e):
                    raise
                # any connection of the session (catalog, replication), at any step
                reason = " ".join(str(e).split())
                error: Pg2SinkError = ConnectError(f"lost the connection to PostgreSQL: {reason}")
            except Pg2SinkError as e:
                error = e
            self._failed(error)

    def _failed(self, error: Pg2SinkError) -> None:
        """Raise what cannot be retried; else count it and wait before the next session."""
        self.stats.replication_down(str(error))
        if isinstance(error, SinkError):
            self.stats.sink_down(str(error))
        retried = self.started or self.cfg.retry_initial or self.pipeline is not None
        if not error.retryable or not retried:
            if isinstance(error, SlotBusyError) and not self.started:
                raise SlotBusyError(
                    f"{error}; stop it, or pass --retry-initial to wait and take over when it exits"
                ) from None
            raise error
        self.stats.count_error(error)
        self._sleep(self.reconnect.failed(str(error)))

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.requested and time.monotonic() < deadline:
            time.sleep(min(0.2, deadline - time.monotonic()))

    def _session(self, sink: Sink | None, out: TextIO | None) -> None:
        """One streaming session: prepare, take the slot, stream until stopped or lost."""
        src = self.cfg.source
        with ExitStack() as stack:
            conn = connect(src.dsn)
            stack.callback(conn.close)
            # on a hot standby, what pg2sink writes goes to --primary (catalog/standby.py)
            standby = in_recovery(conn)
            if src.slot_failover:
                check_failover_server(conn, standby)
            if src.publish_generated_columns:
                check_generated_server(conn)
            primary = conn
            if standby:
                primary = connect_primary(conn, src.primary, src.publication, src.internal_schema)
                stack.callback(primary.close)
                if not self.started:
                    warn_without_feedback(conn)
            manager = self._prepare(conn, primary)
            stats = self.stats

            def poll() -> None:
                """Every --publication-poll-interval: membership, then the server's position."""
                stats.publication_tables = len(self._reconcile(manager).members)
                position = server_position(conn, src.slot)
                stats.set_server_position(position)
                if position.invalidation_reason is not None:
                    raise ServerConfigError(
                        invalidated_message(src.slot, position.invalidation_reason)
                    )

            stats.publication_tables = len(self._reconcile(manager).members)
            if manager.publishes_internal_schema() and not self._internal_left_out:
                # a FOR ALL TABLES (or IN SCHEMA) publication used as it is publishes
                # pg2sink's own bookkeeping too: it never reaches the sink
                self.rules = self.rules.without_schema(src.internal_schema)
                self._internal_left_out = True
            if standby:
                # the publication as the primary has it now, before the slot's start
                wait_for_replay(conn, primary_position(primary), stop=lambda: self.stop.requested)
            ensure_slot(
                conn,
                src.slot,
                failover=src.slot_failover,
                nudge=standby_nudge(primary) if standby else None,
            )
            check_slot_valid(conn, src.slot)
            repl = self._start_replication(conn, stack)
            stats.set_server_position(server_position(conn, src.slot))
            handler = self._handler(conn, stack, sink, out)
            streamer = Streamer(
                repl,
                handler,
                heartbeat_interval=self.cfg.heartbeat_interval,
                flush_interval=self.cfg.flush_interval,
                poll_interval=self.cfg.publication_poll_interval,
                poll=poll,
                confirm=out is None,
                advance=self.advances_slot,
                stop=self.stop,
                stats=stats,
                wal_retain=self.cfg.wal_retain,
            )
            if isinstance(handler, StreamingHandler):
                handler.progress = streamer.tick  # housekeeping during long replays
            streamer.run()

    def _prepare(
        self, conn: psycopg.Connection[TupleRow], primary: psycopg.Connection[TupleRow]
    ) -> PublicationManager:
        """The server's checks and, at the first start, pg2sink's schema; the session's
        publication manager. `primary` is `conn`, or --primary when `conn` is a standby:
        the schema and the publication are written there."""
        src = self.cfg.source
        check_server(conn)
        if self.imports and not self.started:
            # A connection setting the JDBC readers cannot honour (a CRL, a key pgjdbc
            # cannot read...) stops the start before the slot and the publication
            # exist: every import would fail and retry forever.
            connection_properties(conn.info)
        writer = self._writer = src.dsn if primary is conn else (src.primary or src.dsn)
        if self.engine is not None:
            self.engine.state_dsn = writer
        if not self.cfg.decode_only and not self.started:
            apply_migrations(writer, src.internal_schema)
            try:
                set_capture_ddl(
                    writer, src.internal_schema, src.slot, src.publication, self.cfg.capture_ddl
                )
            except ServerConfigError as e:
                # a role that may not create event triggers (managed services): the rest
                # of the stream works without the DDL messages
                log.warning("%s: DDL is not captured, the stream goes on without it", e)
        if self.cfg.streaming:
            check_streaming_server(conn.info.server_version)
        return PublicationManager(
            primary,
            src.publication,
            src.schemas,
            self.table_filter,
            src.internal_schema,
            publish_via_partition_root=src.publish_via_partition_root,
            on_change=self._membership_changed if self.imports else None,
            allow_no_replica_identity=src.allow_no_replica_identity,
            exclusions=self.rules.excluded,
            publish_generated_columns=src.publish_generated_columns,
            mode=src.publication_mode,
        )

    def _start_replication(
        self, conn: psycopg.Connection[TupleRow], stack: ExitStack
    ) -> ReplicationStream:
        """START_REPLICATION on a connection of its own; then, once, the import engine."""
        src, stats = self.cfg.source, self.stats
        repl = ReplicationStream(connect(src.dsn, replication=True))
        stack.callback(repl.close)
        if src.slot_failover:
            enable_failover(conn, repl.conn, src.slot)
        repl.start(
            src.slot,
            src.publication,
            streaming=self.cfg.streaming,
            # pgoutput sends logical decoding messages only when asked
            extra_options=[("messages", "true")] if self.cfg.messages else [],
        )
        stats.replication_up()
        self.reconnect.streaming()
        if self.imports and self.engine is None:
            # Only once this process streams from the slot: a transaction committed
            # after an import's snapshot must be in the slot's stream, and the gate
            # that orders it after the import rows is this process's (a standby
            # waiting for the slot runs no imports).
            self.engine = ImportEngine(
                self.cfg,
                self.stats,
                self.gate or ImportGate(),
                _import_target(self.cfg),
                state_dsn=self._writer,
            )
            self.engine.start()
        stats.sink_up()
        if not self.started:
            if self.http is not None:
                log.info("pg2sink is streaming; HTTP API and /metrics on %s", self.http.url)
            else:
                log.info("pg2sink is streaming")
        self.started = True
        return repl

    def _handler(
        self,
        conn: psycopg.Connection[TupleRow],
        stack: ExitStack,
        sink: Sink | None,
        out: TextIO | None,
    ) -> ChangeHandler:
        """What the loop feeds: the changelog into the sink (behind the import gate's
        stage, and spilling with --streaming), or --decode-only's printer."""
        if out is not None:
            return DecodeOnlyHandler(out)
        assert sink is not None
        src = self.cfg.source
        rules = self.rules
        changelog = ChangelogHandler(
            Catalog(conn),
            sink,
            self.stats,
            messages=self.cfg.messages,
            message_prefixes=self.cfg.message_prefixes,
            via_partition_root=src.publish_via_partition_root,
            annotate=rules.annotate if rules.masked else None,
        )
        builder = changelog.builder

        def builder_feed() -> Feed:
            return builder.feed

        next_feed: Callable[[], Feed] = builder_feed
        if self.gate is not None:  # imports: the gate's stage in front of the builder
            stage = self.gate.stage(builder)
            changelog.put_in_front(stage)
            next_feed = stage.bind
            # the session's end releases a hold() waiting for this loop's binding
            stack.callback(stage.detach)
        if rules.active:  # --only, --exclude-column, --mask-column, --outbox: in front
            publish = publisher_for(sink) if rules.outbox else None
            changelog.put_in_front(
                RoutingStage(rules, builder.catalog, next_feed, publish, builder.tag_counts)
            )
        if not self.cfg.streaming:
            return changelog
        # created after START_REPLICATION took the slot: it deletes old spills
        spilling = StreamingHandler(changelog, self.cfg.spill_dir or default_spill_dir(src.slot))
        stack.callback(spilling.discard_spills)
        return spilling

    def _membership_changed(
        self,
        conn: psycopg.Connection[TupleRow],
        joined: Sequence[Table],
        left: Sequence[Table],
    ) -> None:
        """In the reconcile transaction: a job per joined table, left tables' jobs expire."""
        src = self.cfg.source
        jobs.expire_jobs(
            conn, src.internal_schema, src.publication, [(t.schema, t.name) for t in left]
        )
        # an outbox's rows are never imported (routing/outbox.py)
        imported = [
            (t.schema, t.name) for t in joined if self.rules.outbox_for(t.schema, t.name) is None
        ]
        jobs.create_jobs(conn, src.internal_schema, src.publication, imported)

    def _reconcile(self, manager: PublicationManager) -> Reconciliation:
        rec = manager.reconcile()
        if manager.info is not None:
            self.stats.publication_actions = dict(manager.info.actions)
        # what routing would refuse at a table's first change, refused now (every
        # member at the first reconcile, then the tables that join)
        routed = rec.joined if self._routes_checked else rec.members
        check_tables(manager.conn, Catalog(manager.conn), self.rules, [t.oid for t in routed])
        members = [t.oid for t in rec.members]
        strict = self.cfg.routing.strict_routing
        for line in unmatched_rules(manager.conn, self.rules, members, strict=strict):
            log.warning("%s", line)
        self._routes_checked = True
        if self.gate is not None and rec.joined:
            for t in rec.joined:
                if not t.has_primary_key and t.replica_identity != "i":
                    # until its import, a keyless table's changes are in the import to come
                    self.gate.pending(t.schema, t.name)
            if self.engine is not None:
                self.engine.wake()
        return rec


def serve_http(cfg: StreamConfig, stats: StreamStats | Mapping[str, StreamStats]) -> Server | None:
    """The HTTP API and /metrics on --metrics-address ('off': none), for one pipeline's
    stats or several pipelines' by name."""
    return serve_api(
        cfg.metrics_address, stats, cfg.http_token_file, cfg.http_tls_cert, cfg.http_tls_key
    )


def _import_target(cfg: StreamConfig) -> ImportTarget | None:
    """Where the imports of this stream write: its sink's import target (sinks/entries.py), None
    for a sink that has none (jobs then stay pending, with a warning saying why)."""
    make = entries.entry(cfg.sink).imports
    return make(cfg.sink_config) if make is not None else None


def _server_lost(e: psycopg.Error) -> bool:
    """Whether `e` means the connection or the server went away (retryable), not a
    problem with what was asked."""
    state = e.sqlstate
    if state is None:  # raised by the client: the socket closed, the connection is broken
        return isinstance(e, psycopg.OperationalError)
    return state.startswith("08") or state in _SERVER_GONE


def run_stream(cfg: StreamConfig) -> None:
    StreamService(cfg).run()
