"""Helpers the end-to-end tests share: pg2sink started with the file sink, and its output.

tests/conftest.py owns the fixtures (servers, databases, the pg2sink process); this module
holds the small functions several test modules would otherwise each write again.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg
import services
from psycopg.rows import TupleRow

from tests.conftest import Database, Pg2Sink, read_jsonl

#: The `pg2sink_proc` fixture: a pg2sink process factory.
Proc = Callable[..., Pg2Sink]

#: Short intervals, so that a test sees new tables and durable output within a second.
FAST = ("--publication-poll-interval", "0.3s", "--flush-interval", "0.1s")


def start(proc: Proc, out: Path, *extra: str) -> Pg2Sink:
    """pg2sink with the file sink writing `out`, once it streams."""
    p = proc("--file-path", str(out), *FAST, *extra).start()
    p.wait_streaming()
    return p


def modifications(path: Path) -> list[dict[str, Any]]:
    """The Modification records of a JSON-lines output file."""
    return [r for r in read_jsonl(path) if r["kind"] == "modification"]


def scalar(
    conn: psycopg.Connection[TupleRow], query: str, params: tuple[Any, ...] | None = None
) -> Any:
    """The one value a query returns."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


class _Server(Protocol):
    def start(self) -> object: ...

    def stop(self) -> None: ...


_S = TypeVar("_S", bound=_Server)


@contextlib.contextmanager
def own_server(kind: Callable[..., _S], name: str) -> Iterator[_S]:
    """A server of `kind` (a scripts/services.py class) of the test's own, started in a
    temporary directory on a free port, so that stopping it disturbs no other test (its
    store survives a stop and start); removed at the end."""
    base = Path(tempfile.mkdtemp(prefix=f"pg2sink-{name}-own-"))
    base.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root (services.py)
    server = kind(base=base / name, port=services.free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


class RandomWriter(threading.Thread):
    """Random transactions of a few `_statement()`s each until stopped."""

    def __init__(self, db: Database, seed: int, most: int = 6, pause: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.conn = db.connect()
        self.rng = random.Random(seed)
        self.most = most
        self.pause = pause
        self.stopped = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                with self.conn.transaction():
                    for _ in range(self.rng.randint(1, self.most)):
                        self._statement()
                self.transactions += 1
                time.sleep(self.pause)
        except BaseException as e:  # reported by the test
            self.error = e

    def _statement(self) -> None:
        raise NotImplementedError
