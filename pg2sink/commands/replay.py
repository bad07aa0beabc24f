"""`pg2sink replay --since DURATION|LSN`: the stream again, from the slot's confirmed
position, writing only the changes after the given point (docs/replay.md).

With --wal-retain the slot's confirmed position stays a window behind what the sink
holds, so a new session from the slot receives the window's changes again. Replay is
that session, with the stream's options: the records before the point are left out
(`Since`, a wrapper around the sink), the rest are written, and it goes on streaming as
`pg2sink stream` does. It confirms nothing to the slot (the window stays for another
replay) unless --advance-slot, then as --wal-retain says.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pg2sink.changelog.records import Message, Modification, Record, Schema
from pg2sink.commands.configs import stream_config
from pg2sink.config import StreamConfig
from pg2sink.errors import ConfigError
from pg2sink.logical.lsn import format_lsn, parse_lsn
from pg2sink.observability.stats import StreamStats
from pg2sink.options import parse_duration
from pg2sink.service import StreamService, make_sink
from pg2sink.sinks.base import ReportsHealth, Sink

log = logging.getLogger(__name__)

__all__ = ["Point", "Since", "parse_point", "run_replay"]


@dataclass(frozen=True)
class Point:
    """Where a replay starts: a commit time, or an LSN."""

    time: datetime | None = None
    lsn: int | None = None

    def __str__(self) -> str:
        if self.lsn is not None:
            return f"LSN {format_lsn(self.lsn)}"
        assert self.time is not None
        return f"commit time {self.time.isoformat()}"

    def keeps(self, record: Record) -> bool:
        """Whether `record` is at or after the point; Schema records always are (a
        sink needs a table's shape before its rows)."""
        if isinstance(record, Schema):
            return True
        if self.lsn is not None:
            return record.lsn >= self.lsn
        assert self.time is not None
        if isinstance(record, Message) and record.timestamp is None:
            return True  # a non-transactional message has no commit time: kept
        assert isinstance(record, Modification | Message) and record.timestamp is not None
        return record.timestamp >= self.time


def parse_point(text: str, now: datetime | None = None) -> Point:
    """--since: an LSN (X/Y) or a duration before `now`; ConfigError otherwise."""
    if "/" in text:
        try:
            return Point(lsn=parse_lsn(text.strip()))
        except ValueError as e:
            raise ConfigError(f"--since {text!r}: {e}") from None
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise ConfigError(f"--since {text!r}: an LSN (0/16B3748) or a duration: {e}") from None
    return Point(time=(now or datetime.now(UTC)) - timedelta(seconds=seconds))


class Since:
    """A sink that leaves out the records before a point; everything else is the inner
    sink's (its checkpoints, flushes and acknowledgements, so nothing is confirmed that
    the sink does not hold)."""

    def __init__(self, inner: Sink, point: Point) -> None:
        self.inner = inner
        self.point = point
        self.writes_json: bool = getattr(inner, "writes_json", False)
        self.skipped = 0

    def open(self) -> None:
        self.inner.open()

    def write(self, record: Record) -> None:
        if self.point.keeps(record):
            self.inner.write(record)
        else:
            self.skipped += 1

    def checkpoint(self, lsn: int) -> None:
        self.inner.checkpoint(lsn)

    def start_flush(self) -> None:
        self.inner.start_flush()

    def pending_bytes(self) -> int:
        return self.inner.pending_bytes()

    def flush(self) -> int | None:
        return self.inner.flush()

    def acknowledged(self) -> int | None:
        return self.inner.acknowledged()

    def close(self) -> None:
        log.info("replay: %d records before %s left out", self.skipped, self.point)
        self.inner.close()

    def report_health(self, stats: StreamStats) -> None:
        """The inner sink's outages (ReportsHealth), if it tells them."""
        if isinstance(self.inner, ReportsHealth):
            self.inner.report_health(stats)


def run_replay(cfg: StreamConfig, point: Point, *, advance_slot: bool = False) -> None:
    """The stream, its sink wrapped in `Since(point)`; the slot stays where it was
    unless `advance_slot` (--advance-slot)."""
    log.info("replay: writing the changes from %s on", point)
    if not advance_slot:
        log.info("replay: the slot stays where it is (--advance-slot moves it)")

    class Replay(StreamService):
        advances_slot = advance_slot

        @staticmethod
        def make_sink(cfg: StreamConfig) -> Sink:
            return Since(make_sink(cfg), point)

    Replay(cfg).run()


def run(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> None:
    """`pg2sink replay --since`: --since checked before anything connects."""
    point = parse_point(args.since)
    run_replay(stream_config(args), point, advance_slot=args.advance_slot)
