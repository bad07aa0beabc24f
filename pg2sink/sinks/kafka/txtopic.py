"""--transaction-topic: the Kafka sink's BEGIN and END records (sinks/txmeta.py).

Each transaction that changed a published table gets a BEGIN record before its first
message and an END record (with its commit LSN and its event counts, total and per
table) after its last, on the transaction topic: JSON whatever --format says, keyed by
`{"id": "<xid>"}` as Debezium keys them, so one transaction's two records share a
partition. Every data message already carries the transaction's xid (header `xid`, and
field `xid` of the value) and its position in it (`sequence`).

With --exactly-once both records belong to the Kafka transaction of the transaction's
changes, so a read_committed consumer sees the three together or not at all.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pg2sink.changelog.builder import RowWriter, TableShape
from pg2sink.changelog.records import Modification, Operation, Record
from pg2sink.formats.jsonenc import dumps
from pg2sink.formats.kafka import Format
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.sink import KafkaSink
from pg2sink.sinks.txmeta import TransactionTracker

__all__ = ["TransactionTopicKafkaSink"]


class TransactionTopicKafkaSink(KafkaSink):
    """The Kafka sink with --transaction-topic; see the module docstring."""

    def __init__(self, cfg: KafkaConfig, fmt: Format | None = None) -> None:
        super().__init__(cfg, fmt)
        assert cfg.transaction_topic, "a sink with a transaction topic"
        self.transaction_topic = cfg.transaction_topic
        self._transactions = TransactionTracker(self._publish_transaction)

    def write(self, record: Record) -> None:
        if isinstance(record, Modification):  # a Truncation too: one per table
            self._transactions.begin(record.xid, record.timestamp)
            self._transactions.count(record.namespace, record.name)
        super().write(record)

    def row_writer(self, table: TableShape) -> RowWriter | None:
        """The base writer, counting the changes it takes (one it declines comes back
        through write())."""
        inner = super().row_writer(table)
        if inner is None:
            return None
        begin = self._transactions.begin
        count = self._transactions.count
        namespace, name = table.namespace, table.name

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
        self._transactions.checkpoint(lsn)
        super().checkpoint(lsn)

    def _publish_transaction(self, record: dict[str, Any]) -> None:
        """One BEGIN or END record to the transaction topic."""
        topic = self.transaction_topic
        self._topics.check(self._producer, topic)
        self._produce(topic, dumps({"id": record["id"]}), dumps(record), None)

    def _restart(self, fatal: bool) -> None:
        self._transactions.forget()  # the server sends the transaction again
        super()._restart(fatal)
