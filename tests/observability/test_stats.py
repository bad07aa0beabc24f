"""StreamStats: the plain counters, the lag arithmetic, the histogram buckets."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from pg2sink.changelog.records import Operation
from pg2sink.errors import (
    ConfigError,
    ConnectError,
    DecodeError,
    Pg2SinkError,
    SinkError,
    SinkUnavailableError,
    SlotBusyError,
)
from pg2sink.observability.stats import (
    ERROR_KINDS,
    MESSAGE_TYPES,
    Buckets,
    LogCounter,
    ServerPosition,
    StreamStats,
    error_kind,
)

T0 = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_table_changes_counts_per_table_and_operation() -> None:
    stats = StreamStats()
    ops = stats.table_changes("public", "customers")
    assert ops == {"INSERT": 0, "UPDATE": 0, "DELETE": 0, "TRUNCATE": 0, "IMPORT": 0}
    ops[Operation.INSERT] += 1  # the records' StrEnum finds the plain string key
    ops["INSERT"] -= 1
    ops["INSERT"] += 2
    stats.table_changes("public", "customers")["DELETE"] += 1  # same dict again
    assert stats.table_changes("public", "customers") is ops
    stats.table_changes("sales", "orders")["UPDATE"] += 5
    assert stats.changes == {
        ("public", "customers", "INSERT"): 2,
        ("public", "customers", "UPDATE"): 0,
        ("public", "customers", "DELETE"): 1,
        ("public", "customers", "TRUNCATE"): 0,
        ("public", "customers", "IMPORT"): 0,
        ("sales", "orders", "INSERT"): 0,
        ("sales", "orders", "UPDATE"): 5,
        ("sales", "orders", "DELETE"): 0,
        ("sales", "orders", "TRUNCATE"): 0,
        ("sales", "orders", "IMPORT"): 0,
    }


def test_lag_seconds_is_the_age_of_the_oldest_unacknowledged_commit() -> None:
    clock = Clock(T0.timestamp() + 100)
    stats = StreamStats(clock)
    assert stats.lag_seconds() == 0.0  # nothing received: caught up
    stats.commit_received(1000, datetime.fromtimestamp(T0.timestamp() + 10, UTC))
    stats.commit_received(2000, datetime.fromtimestamp(T0.timestamp() + 40, UTC))
    assert stats.received_lsn == 2000
    assert stats.lag_seconds() == pytest.approx(90)
    stats.acknowledge(1500)  # covers the first transaction only
    assert stats.confirmed_lsn == 1500
    assert stats.last_ack_commit_time == datetime.fromtimestamp(T0.timestamp() + 10, UTC)
    assert stats.lag_seconds() == pytest.approx(60)
    stats.acknowledge(2000)
    assert stats.lag_seconds() == 0.0
    assert stats.last_ack_commit_time == datetime.fromtimestamp(T0.timestamp() + 40, UTC)


def test_lag_seconds_after_an_idle_period_counts_from_the_new_commit() -> None:
    # The last acknowledged commit is an hour old, but what waits was committed
    # 2 s ago: the lag is 2 s, not an hour.
    clock = Clock(T0.timestamp())
    stats = StreamStats(clock)
    stats.commit_received(100, datetime.fromtimestamp(T0.timestamp(), UTC))
    stats.acknowledge(100)
    clock.now += 3600
    assert stats.lag_seconds() == 0.0
    stats.commit_received(200, datetime.fromtimestamp(clock.now - 2, UTC))
    assert stats.lag_seconds() == pytest.approx(2)


def test_acknowledge_never_moves_the_confirmed_lsn_back() -> None:
    stats = StreamStats()
    stats.acknowledge(500)
    stats.acknowledge(400)
    assert stats.confirmed_lsn == 500


def test_pending_commits_are_bounded_and_err_on_the_high_side(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("pg2sink.observability.stats._PENDING_MAX", 3)
    clock = Clock(T0.timestamp() + 100)
    stats = StreamStats(clock)
    for i in range(10):
        stats.commit_received(100 * (i + 1), datetime.fromtimestamp(T0.timestamp() + i, UTC))
    assert len(stats._pending) == 3
    assert stats.received_lsn == 1000
    # the third entry stretches over transactions 3..10 and keeps transaction 3's time
    stats.acknowledge(200)
    assert stats.lag_seconds() == pytest.approx(98)
    stats.acknowledge(999)
    assert stats.lag_seconds() == pytest.approx(98)
    stats.acknowledge(1000)
    assert stats.lag_seconds() == 0.0


def test_replication_up_forgets_what_the_server_will_resend() -> None:
    stats = StreamStats()
    stats.commit_received(100, T0)
    stats.replication_up()
    assert stats.lag_seconds() == 0.0
    assert stats.replication_connected and stats.replication_reason == ""


def test_lag_bytes_and_wal_retained_need_a_server_sample() -> None:
    clock = Clock(1000.0)
    stats = StreamStats(clock)
    assert stats.lag_bytes() is None
    assert stats.wal_retained_bytes() is None
    stats.acknowledge(7000)
    stats.set_server_position(ServerPosition(wal_lsn=10_000, restart_lsn=6000, active=True))
    assert stats.lag_bytes() == 3000
    assert stats.wal_retained_bytes() == 4000
    assert stats.slot_active is True
    assert stats.server_sampled_at == 1000.0
    stats.acknowledge(12_000)  # confirmed past a stale sample: no negative lag
    assert stats.lag_bytes() == 0
    stats.set_server_position(ServerPosition(wal_lsn=12_000, restart_lsn=None, active=None))
    assert stats.wal_retained_bytes() is None
    assert stats.slot_active is None


def test_health_flags_and_reasons() -> None:
    stats = StreamStats()
    assert not stats.healthy
    stats.replication_up()
    stats.sink_up()
    assert stats.healthy
    stats.sink_down("broker unreachable")
    assert not stats.healthy and stats.sink_reason == "broker unreachable"
    stats.replication_down("")
    assert stats.replication_reason == "disconnected"


def test_a_sink_outage_outlasts_a_new_session() -> None:
    stats = StreamStats()
    stats.replication_up()
    stats.sink_up()
    stats.sink_outage("Kafka at b:9092 is unreachable: 1/1 brokers are down")
    assert not stats.sink_healthy and "unreachable" in stats.sink_reason
    stats.sink_up()  # a session starts again while no broker answers
    assert not stats.healthy and "unreachable" in stats.sink_reason
    stats.sink_outage("")
    assert stats.healthy and stats.sink_reason == ""


def test_buckets_are_cumulative_with_inf_equal_to_count() -> None:
    b = Buckets((0.1, 1.0, 10.0))
    for v in (0.05, 0.1, 0.5, 5.0, 50.0, 100.0):
        b.observe(v)
    # le is inclusive: 0.1 falls in the 0.1 bucket
    assert b.cumulative() == [("0.1", 2), ("1.0", 3), ("10.0", 4), ("+Inf", 6)]
    assert b.count == 6
    assert b.sum == pytest.approx(155.65)


def test_buckets_reject_unsorted_bounds() -> None:
    with pytest.raises(ValueError, match="increase"):
        Buckets((1.0, 0.5))


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ConnectError("x"), "connect"),
        (SlotBusyError("x"), "slot_busy"),
        (ConfigError("x"), "config"),
        (DecodeError("x"), "decode"),
        (SinkError("x"), "sink"),
        (SinkUnavailableError("x"), "sink_unavailable"),
        (RuntimeError("x"), "internal"),
    ],
)
def test_error_kind(error: BaseException, kind: str) -> None:
    assert error_kind(error) == kind


def test_count_error_by_exception_or_kind() -> None:
    stats = StreamStats()
    stats.count_error(SinkUnavailableError("down"))
    stats.count_error(SinkUnavailableError("still down"))
    stats.count_error("connect")
    assert {k: n for k, n in stats.errors.items() if n} == {"sink_unavailable": 2, "connect": 1}
    stats.count_error("something_new")
    assert stats.errors["something_new"] == 1


def test_every_error_class_has_a_kind_that_starts_at_zero() -> None:
    def subclasses(cls: type[BaseException]) -> list[type[BaseException]]:
        return [cls] + [s for sub in cls.__subclasses__() for s in subclasses(sub)]

    stats = StreamStats()
    for cls in subclasses(Pg2SinkError):
        if cls.__module__ == "pg2sink.errors":
            assert error_kind(cls("x")) in ERROR_KINDS, cls
    assert set(stats.errors) == set(ERROR_KINDS)
    assert set(stats.messages) == set(MESSAGE_TYPES)
    assert not any(stats.errors.values()) and not any(stats.messages.values())


def test_log_counter_counts_warnings_and_worse() -> None:
    stats = StreamStats()
    logger = logging.getLogger("tests.observability.log_counter")
    logger.propagate = False
    handler = LogCounter(stats)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        logger.info("not counted")
        logger.warning("one")
        logger.error("two")
        logger.error("three")
    finally:
        logger.removeHandler(handler)
    assert stats.log_messages == {"warning": 1, "error": 2, "critical": 0}
