"""Transaction metadata: one BEGIN and one END record per transaction (Debezium's).

A sink sees a transaction as its changes (each Modification carries the transaction's
xid and commit time) followed by `checkpoint(lsn)` at its commit, with `lsn` the end of
the commit record. `TransactionTracker` turns that into two records per transaction that
touched a published table (a transaction without such a change has none):

    {"status": "BEGIN", "id": "735", "event_count": null, "data_collections": null,
     "ts_ms": 1795492821811, "xid": 735, "lsn": null, "timestamp": "2026-...Z"}
    ... the transaction's changes ...
    {"status": "END", "id": "735", "event_count": 3,
     "data_collections": [{"data_collection": "public.a", "event_count": 2},
                          {"data_collection": "public.b", "event_count": 1}],
     "ts_ms": 1795492821811, "xid": 735, "lsn": 22052544, "timestamp": "2026-...Z"}

`status`, `id`, `event_count`, `data_collections` and `ts_ms` are Debezium's transaction
metadata fields (`id` the xid as text; `ts_ms` the commit time in milliseconds since the
epoch); `xid`, `lsn` (the END's commit end LSN, the position the slot confirms; null in
BEGIN, which comes before the commit is known) and `timestamp` (the commit time as the
data records write it) are pg2sink's. A consumer re-assembles a transaction from its data
records' `xid` and `sequence` (0, 1, ... in the transaction) and the END's counts.
Truncations count as events of each table they truncate; Schema and Message records do
not count.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

__all__ = ["TransactionTracker", "transaction_object"]

#: the record's fields, in their order
_FIELDS = ("status", "id", "event_count", "data_collections", "ts_ms", "xid", "lsn", "timestamp")


def transaction_object(
    status: str,
    xid: int,
    commit_time: datetime,
    lsn: int | None = None,
    counts: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One BEGIN (no `lsn` nor `counts`) or END record, as the module docstring shows."""
    collections = (
        None
        if counts is None
        else [{"data_collection": name, "event_count": n} for name, n in counts.items()]
    )
    values = (
        status,
        str(xid),
        None if counts is None else sum(counts.values()),
        collections,
        int(commit_time.timestamp() * 1000),
        xid,
        lsn,
        commit_time,
    )
    return dict(zip(_FIELDS, values, strict=True))


class TransactionTracker:
    """BEGIN at a transaction's first change, END at its commit's checkpoint; `emit`
    writes each record where the sink puts them (a line, a message)."""

    __slots__ = ("_counts", "_emit", "_time", "_xid")

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        self._emit = emit
        self._xid: int | None = None
        self._time: datetime | None = None
        #: 'schema.table' -> events of the open transaction, in order of first change
        self._counts: dict[str, int] = {}

    def begin(self, xid: int, commit_time: datetime) -> None:
        """A change of transaction `xid` follows: BEGIN if it is the transaction's first."""
        if xid == self._xid:
            return
        if self._xid is not None:
            # no checkpoint came between two transactions (the loop checkpoints only a
            # commit past the last checkpoint): end the previous one without its LSN
            self._end(None)
        self._xid, self._time = xid, commit_time
        self._emit(transaction_object("BEGIN", xid, commit_time))

    def count(self, namespace: str, name: str) -> None:
        """One event of the open transaction on table `namespace.name`."""
        key = f"{namespace}.{name}"
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1

    def checkpoint(self, lsn: int) -> None:
        """Everything so far is below `lsn`: END of the open transaction, if any."""
        if self._xid is not None:
            self._end(lsn)

    def forget(self) -> None:
        """Drop the open transaction (the sink starts over: the server sends it again)."""
        self._xid, self._time, self._counts = None, None, {}

    def _end(self, lsn: int | None) -> None:
        assert self._xid is not None and self._time is not None
        record = transaction_object("END", self._xid, self._time, lsn, self._counts)
        self.forget()
        self._emit(record)
