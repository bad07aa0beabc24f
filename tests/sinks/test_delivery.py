"""The delivery machinery every sink shares, as pure logic with a fake clock: the retry
policy (pg2sink/retry.py) and the delivery engine (pg2sink/sinks/delivery/)."""

from __future__ import annotations

import pytest

from pg2sink.retry import Backoff, bounded_wait


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the retry policy ----------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(1.0, 10.0, clock=FakeClock())
    assert [backoff.failed() for _ in range(6)] == [1, 2, 4, 8, 10, 10]
    assert backoff.attempts == 6


def test_jitter_takes_a_random_share_of_the_bound() -> None:
    draws = iter([0.0, 1.0, 0.5])
    backoff = Backoff(1.0, 10.0, jitter=0.2, rand=lambda: next(draws), clock=FakeClock())
    assert [backoff.failed() for _ in range(3)] == pytest.approx([0.8, 2.0, 3.6])
    assert bounded_wait(3, 0.1, 5.0, 1.0, lambda: 0.5) == pytest.approx(0.4)  # full jitter
    assert bounded_wait(10_000, 0.1, 5.0) == 5.0  # no overflow however long it failed


def test_a_success_resets_only_after_the_healthy_period() -> None:
    clock = FakeClock()
    backoff = Backoff(1.0, 30.0, healthy=3.0, clock=clock)
    assert [backoff.failed() for _ in range(3)] == [1, 2, 4]
    backoff.succeeded()
    clock.now += 2.9  # failed again too soon: still growing
    assert backoff.failed() == 8
    backoff.succeeded()
    clock.now += 3.0
    assert [backoff.failed(), backoff.failed()] == [1, 2]


def test_without_a_healthy_period_any_success_resets() -> None:
    backoff = Backoff(0.1, 5.0, clock=FakeClock())
    assert [backoff.failed(), backoff.failed()] == pytest.approx([0.1, 0.2])
    backoff.succeeded()
    assert backoff.failed() == pytest.approx(0.1)
    backoff.failed()
    backoff.reset()
    assert backoff.failed() == pytest.approx(0.1)
