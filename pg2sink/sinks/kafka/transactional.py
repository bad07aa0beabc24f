"""--exactly-once: the Kafka sink's flushes as Kafka transactions (docs/kafka-exactly-once.md).

A transactional producer (transactional.id = --transactional-id, default
'<prefix>.<slot>') writes everything between two commits in one Kafka transaction, and
each commit adds one record to the offsets topic (offsets.py): the checkpoint (an LSN)
every change before which the transaction holds. Data and checkpoint become visible to
`isolation.level=read_committed` consumers together, or not at all.

Resends. After a crash PostgreSQL sends again every transaction after the slot's
confirmed position, which may be behind the last checkpoint Kafka holds (L). A
transaction Kafka already holds is recognised by its commit, not by its changes: its
changes come before the loop's `checkpoint(end)` at its commit, and Kafka holds it iff
`end <= L` (the stream is sent in commit order, and a checkpoint is taken only at a
commit or while no transaction is open, so no transaction ending after L was before L's
checkpoint). A change's own LSN is no test: a transaction that began before L and
committed after it has changes below L and is not in Kafka. So while checkpoints are
<= L, the sink holds its messages back (in memory, up to HOLD_BYTES; past that they go
into the Kafka transaction) and, at each such checkpoint, drops them (and aborts the
Kafka transaction if they went there); the first checkpoint above L produces what it
holds and ends the resent part.

Commits. A Kafka transaction is committed only at a checkpoint, when nothing was
produced after it (a commit in the middle of a PostgreSQL transaction would record a
checkpoint below changes it holds). `start_flush()` asks for a commit; it happens at once
when the sink is at a checkpoint, else at the next `checkpoint()`; either way only when
the producer is empty (a cheap commit) or the last commit is DRAIN_AFTER old, so a
steady stream commits about once a second. `acknowledged()` is the checkpoint of the
last committed transaction (or one with nothing to write).

Fencing. `init_transactions` with the same transactional.id fences any older producer:
its next produce or commit fails with a fatal "fenced" error, which is a SinkError (the
older pg2sink stops, exit code 2, without writing more). Other failures abort, start a
new producer (whose `init_transactions` settles the open transaction) and raise
SinkUnavailableError: the service reconnects, PostgreSQL resends from the confirmed
position and the offsets topic, read again, says what to skip.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import NoReturn

from confluent_kafka import KafkaError, KafkaException

from pg2sink.errors import ConfigError, SinkError, SinkUnavailableError
from pg2sink.logical.lsn import format_lsn
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.formats import Format
from pg2sink.sinks.kafka.offsets import (
    checkpoint_value,
    client_settings,
    ensure_topic,
    read_checkpoint,
)
from pg2sink.sinks.kafka.producer import reason
from pg2sink.sinks.kafka.sink import DRAIN_AFTER, KafkaSink
from pg2sink.sinks.kafka.topics import topic_name

__all__ = ["COMMIT_WAIT", "ExactlyOnceKafkaSink"]

log = logging.getLogger(__name__)

#: Longest wait of init_transactions, a commit or an abort, in seconds.
COMMIT_WAIT = 10.0

#: Bytes of messages held back while resent changes come (one transaction's): past it,
#: they go into the Kafka transaction, which an abort drops if Kafka had them.
HOLD_BYTES = 64 << 20

#: A message held back: topic, key, value, headers.
_Held = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None]

#: What the producer of a fenced (older) instance hears.
_FENCED = frozenset(
    (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
)
#: Transaction errors a new producer would meet again.
_REFUSED = frozenset(
    (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)
)


class ExactlyOnceKafkaSink(KafkaSink):
    """The Kafka sink with --exactly-once; see the module docstring."""

    def __init__(self, cfg: KafkaConfig, fmt: Format | None = None) -> None:
        super().__init__(cfg, fmt)
        self.slot = ""
        self.offsets_topic = cfg.offsets_topic or topic_name(cfg.topic_prefix, "offsets")
        #: the producer's transactions are initialised and the offsets topic read
        self._ready = False
        self._in_transaction = False
        #: the checkpoint Kafka held at start (L); None once a checkpoint passed it
        self._stored: int | None = None
        #: produce() goes straight to the producer: a transaction is open and nothing is
        #: held (the fast path, one test per message)
        self._direct = False
        #: messages held back while resent changes come, until the next checkpoint says
        #: whether Kafka has them; their key and value bytes
        self._held: list[_Held] = []
        self._held_bytes = 0
        self._latest: int | None = None
        self._committed: int | None = None
        #: messages produced (self._produced) at the latest checkpoint and at the last
        #: commit or abort
        self._at_checkpoint = 0
        self._at_commit = 0
        self._skipped = 0
        self._commit_wanted = False
        self._last_commit = 0.0
        #: another producer took the transactional id over (a SinkError was raised)
        self._fenced_out = False

    def use_slot(self, slot: str) -> None:
        """The replication slot (sinks/base.UsesSlot): the default transactional id."""
        self.slot = slot
        if not self.cfg.transactional_id:
            default = f"{self.cfg.topic_prefix}.{slot}"
            self.cfg = dataclasses.replace(self.cfg, transactional_id=default)

    @property
    def transactional_id(self) -> str:
        return self.cfg.transactional_id or ""

    def open(self) -> None:
        """Create the producer; its transactions start with the first change or checkpoint."""
        if not self.transactional_id:
            raise ConfigError("--exactly-once needs --transactional-id (or the slot's name)")
        super().open()

    def _settle(self) -> None:
        """init_transactions (fencing older producers of the id and settling their open
        transaction), then the checkpoint Kafka holds."""
        try:
            self._producer.init_transactions(COMMIT_WAIT)
        except KafkaException as e:
            self._transaction_failed(e, "initialisation")
        settings = client_settings(self.cfg.bootstrap_servers, self.cfg.producer.reveal())
        ensure_topic(settings, self.offsets_topic)
        self._stored = read_checkpoint(settings, self.offsets_topic, self.transactional_id)
        self._ready = True
        self._last_commit = time.monotonic()
        log.info(
            "exactly-once: transactional id %r; Kafka holds the changes up to %s (%s)",
            self.transactional_id,
            "nothing" if self._stored is None else format_lsn(self._stored),
            self.offsets_topic,
        )

    # -- producing -------------------------------------------------------------------

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
    ) -> None:
        if not self._direct:
            self._produce_first(topic, key, value, headers)
            return
        KafkaSink._produce(self, topic, key, value, headers)

    def _produce_first(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
    ) -> None:
        """The first message of a transaction, or one of the resent part: held back (the
        next checkpoint tells whether Kafka has it) up to HOLD_BYTES, else produced."""
        if not self._ready:
            self._settle()
        if self._stored is not None and self._held_bytes < HOLD_BYTES:
            # produce() copies the headers, the caller reuses its list: copied here
            self._held.append((topic, key, value, None if headers is None else list(headers)))
            self._held_bytes += len(key or b"") + len(value or b"")
            return
        self._release()
        KafkaSink._produce(self, topic, key, value, headers)

    def _release(self) -> None:
        """Begin a Kafka transaction if none is open, and produce the held messages."""
        if not self._in_transaction:
            try:
                self._producer.begin_transaction()
            except KafkaException as e:
                self._transaction_failed(e, "begin")
            self._in_transaction = True
        held, self._held = self._held, []
        for message in held:
            KafkaSink._produce(self, *message)
        self._direct = self._stored is None

    # -- checkpoints and commits -----------------------------------------------------

    def _checkpoint(self, lsn: int) -> None:
        if not self._ready:
            self._settle()
        stored = self._stored
        if stored is not None:
            if lsn <= stored:
                self._resent(lsn)
                return
            self._stored = None
            self._held_bytes = 0
            if self._held:
                self._release()  # the first transaction Kafka did not have
            self._direct = self._in_transaction
            log.info(
                "exactly-once: resent changes up to %s skipped (%d messages)",
                format_lsn(stored),
                self._skipped,
            )
        self._latest = lsn
        self._at_checkpoint = self._produced
        if self._commit_wanted and self._commit_due():
            self._commit()

    def _resent(self, lsn: int) -> None:
        """A checkpoint at or below what Kafka holds: drop what came since the last one
        (held back, or in a Kafka transaction: aborted)."""
        self._skipped += len(self._held)
        self._held.clear()
        self._held_bytes = 0
        if self._produced != self._at_commit:
            self._skipped += self._produced - self._at_commit
            try:
                self._producer.abort_transaction(COMMIT_WAIT)
            except KafkaException as e:
                self._transaction_failed(e, "abort")
            self._in_transaction = self._direct = False
        self._at_checkpoint = self._at_commit = self._produced
        self._latest = lsn
        if self._committed is None or lsn > self._committed:  # never backwards
            self._committed = lsn

    def _commit_due(self) -> bool:
        """Whether a commit is cheap (everything delivered) or a second late."""
        return (
            len(self._producer) == 0 or time.monotonic() - self._last_commit >= DRAIN_AFTER
        ) and not self._health.down

    def _commit(self) -> None:
        """Commit the Kafka transaction with the latest checkpoint (taken just now: nothing
        was produced after it)."""
        lsn = self._latest
        assert lsn is not None and self._produced == self._at_checkpoint
        if self._produced != self._at_commit:
            value = checkpoint_value(self.slot, lsn)
            self._produce(self.offsets_topic, self.transactional_id.encode(), value, None)
            try:
                self._producer.commit_transaction(COMMIT_WAIT)
            except KafkaException as e:
                self._transaction_failed(e, "commit")
            self._in_transaction = self._direct = False
            self._at_checkpoint = self._at_commit = self._produced
            self._last_commit = time.monotonic()
            self._drained()  # delivered: the health and counters of a drain
        self._committed = lsn
        self._commit_wanted = False

    def _commit_pending(self) -> bool:
        """A checkpoint is waiting, and nothing was produced after it."""
        return self._latest != self._committed and self._produced == self._at_checkpoint

    def start_flush(self) -> None:
        """Ask for a commit: now if at a checkpoint and due, else at the next checkpoint."""
        if self._producer is None or not self._ready:
            return
        self._drained()
        self._commit_wanted = True
        if self._commit_pending() and self._commit_due():
            self._commit()

    def acknowledged(self) -> int | None:
        if self._producer is not None and self._ready:
            self._drained()
            if self._commit_wanted and self._commit_pending() and self._commit_due():
                self._commit()
        return self._committed

    def flush(self) -> int | None:
        if self._producer is not None and self._ready and self._commit_pending():
            self._commit()
        return self._committed

    def close(self) -> None:
        """Abort a transaction left open (changes after the last checkpoint), then close."""
        producer = self._producer
        if producer is not None and self._in_transaction and not self._fenced_out:
            producer.purge(in_queue=True, in_flight=False, blocking=False)
            try:
                producer.abort_transaction(5.0)
            except KafkaException as e:
                log.debug("abort at close: %s", reason(e))
            self._in_transaction = self._direct = False
        if self._fenced_out:
            # it accepts nothing more, and its flush may fail inside librdkafka's binding
            # (SystemError, seen): dropped, so the SinkError that fenced it is what shows
            self._producer = None
        super().close()

    # -- failures --------------------------------------------------------------------

    def _transaction_failed(self, e: KafkaException, what: str) -> NoReturn:
        """Raise for a failed init, begin, commit or abort; the sink starts over unless
        it was fenced or refused."""
        error = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
        if error is not None and error.code() in _FENCED:
            raise self._fenced(error)
        text = f"Kafka transaction {what} failed for transactional id {self.transactional_id!r}"
        if error is not None and error.code() in _REFUSED:
            raise SinkError(f"{text}: {reason(e)}")
        self._restart(fatal=True)
        raise SinkUnavailableError(
            f"{text} ({reason(e)}); the open transaction is aborted and its changes are "
            "sent again from the last committed checkpoint"
        )

    def _fenced(self, error: KafkaError) -> SinkError:
        self._failure = None
        self._fenced_out = True
        return SinkError(
            f"another producer took over Kafka transactional id {self.transactional_id!r} "
            f"({error.str()}): this pg2sink stops without writing more"
        )

    def _drained(self) -> bool:
        # a transactional producer's poll raises its fatal errors (fenced, above all)
        try:
            return super()._drained()
        except KafkaException as e:
            self._transaction_failed(e, "delivery")

    def _wait_for_room(self) -> None:
        try:
            super()._wait_for_room()
        except KafkaException as e:
            self._transaction_failed(e, "delivery")

    def _raise_failure(self) -> None:
        error = self._failure
        if error is not None and error.code() in _FENCED:
            raise self._fenced(error)
        super()._raise_failure()

    def _restart(self, fatal: bool) -> None:
        """Start over with a new producer: its init_transactions (at the next change or
        checkpoint) aborts the open transaction, and the offsets topic is read again."""
        super()._restart(fatal=True)
        self._ready = self._in_transaction = self._direct = self._commit_wanted = False
        self._held.clear()
        self._held_bytes = 0
        self._at_checkpoint = self._at_commit = self._produced
        self._latest = self._committed

    def _error(self, error: KafkaError, topic: str) -> SinkError:
        e = super()._error(error, topic)
        if type(e) is SinkUnavailableError:
            return SinkUnavailableError(
                f"Kafka did not accept a message for topic {topic!r}: {error.str()}; the "
                "open transaction is aborted and sent again from the last committed checkpoint"
            )
        return e
