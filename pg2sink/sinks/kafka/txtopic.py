"""--transaction-topic: the Kafka sink's BEGIN and END records (sinks/txmeta.py).

Each transaction that changed a published table gets a BEGIN record before its first
message and an END record (with its commit LSN and its event counts, total and per
table) after its last, on the transaction topic: JSON whatever --format says, keyed by
`{"id": "<xid>"}` as Debezium keys them, so one transaction's two records share a
partition. Every data message already carries the transaction's xid (header `xid`, and
field `xid` of the value) and its position in it (`sequence`).

A part of the sink, not a kind of it: KafkaSink holds one when the option is given and
calls it at each change, checkpoint and restart; it produces through the sink's own
`_produce`, so with --exactly-once both records belong to the Kafka transaction of the
transaction's changes, and a read_committed consumer sees the three together or not at
all.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from pg2sink.changelog.builder import RawRowWriter
from pg2sink.changelog.jsonenc import dumps
from pg2sink.changelog.records import Modification, Operation
from pg2sink.sinks.txmeta import TransactionTracker

__all__ = ["TransactionTopic"]

#: the sink's _produce: (topic, key, value, headers)
Produce = Callable[[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None], None]


class TransactionTopic:
    """The BEGIN and END records of the changes a sink writes; see the module docstring."""

    def __init__(self, topic: str, produce: Produce, check: Callable[[str], None]) -> None:
        self.topic = topic
        self._produce = produce
        self._check = check
        self._transactions = TransactionTracker(self._publish)

    @classmethod
    def of(
        cls, topic: str | None, produce: Produce, check: Callable[[str], None]
    ) -> TransactionTopic | None:
        """The part of a sink producing with `produce` and checking a topic before its
        first message with `check`; None without --transaction-topic."""
        return cls(topic, produce, check) if topic else None

    def change(self, m: Modification) -> None:
        """A change (a Truncation too: one per table) is written next."""
        self._transactions.begin(m.xid, m.timestamp)
        self._transactions.count(m.namespace, m.name)

    def wrap(self, inner: RawRowWriter, namespace: str, name: str) -> RawRowWriter:
        """`inner`, counting the changes it takes (one it declines comes back through
        the sink's write, which counts it)."""
        begin = self._transactions.begin
        count = self._transactions.count

        def write(
            data: bytes, commit_time: datetime, sequence: int, lsn: int, xid: int, op: Operation
        ) -> bool:
            begin(xid, commit_time)
            if not inner(data, commit_time, sequence, lsn, xid, op):
                return False
            count(namespace, name)
            return True

        return write

    def checkpoint(self, lsn: int) -> None:
        """Before the sink's own checkpoint: the END record of the transaction ended."""
        self._transactions.checkpoint(lsn)

    def forget(self) -> None:
        """The server sends the transaction again (a replay)."""
        self._transactions.forget()

    def _publish(self, record: dict[str, Any]) -> None:
        """One BEGIN or END record to the transaction topic."""
        self._check(self.topic)
        self._produce(self.topic, dumps({"id": record["id"]}), dumps(record), None)
