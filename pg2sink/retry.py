"""The one retry policy: how long to wait before the next attempt after a failure.

Every loop that tries again (a sink's request, a background commit, the NATS
connection, the replication session) asks a `Backoff` for its wait and waits its own
way (a condition, an event, asyncio), so that a stop or a reset ends the wait early.

- Exponential: `first`, then twice as long each failure, at most `cap`.
- Jitter: the wait is a random share of that bound, from `1 - jitter` of it to all of
  it, so that writers failing together do not retry together (`jitter=1`: "full
  jitter", anything from nothing to the bound; `jitter=0`: the bound itself).
- Reset after health: `succeeded()` marks the moment things work again; the next
  failure starts again from `first` if they kept working for `healthy` seconds (0: any
  success resets), and keeps growing otherwise (a server that fails soon after each
  start is not hammered).

No I/O and an injectable clock and random source: tested with a fake clock
(tests/sinks/test_delivery.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

__all__ = ["Backoff", "bounded_wait", "retries_within"]


def bounded_wait(
    attempt: int,
    first: float,
    cap: float,
    jitter: float = 0.0,
    rand: Callable[[], float] = random.random,
) -> float:
    """The wait before retry number `attempt` (0-based): `first * 2**attempt` capped at
    `cap`, of which a random share `jitter` may be left out."""
    bound = cap if attempt >= 64 else min(cap, first * 2.0**attempt)
    return bound * (1.0 - jitter + jitter * rand()) if jitter else bound


def retries_within(deadline: float, first: float, cap: float) -> int:
    """How many retries a client waiting `bounded_wait(attempt, first, cap)` (no jitter)
    between its attempts may make for its waits to fit in `deadline` seconds."""
    retries, waited = 0, 0.0
    while waited + (wait := bounded_wait(retries, first, cap)) <= deadline:
        retries, waited = retries + 1, waited + wait
    return retries


class Backoff:
    """See the module docstring."""

    __slots__ = ("_attempt", "_ok_since", "cap", "clock", "first", "healthy", "jitter", "rand")

    def __init__(
        self,
        first: float,
        cap: float,
        *,
        jitter: float = 0.0,
        healthy: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.first = first
        self.cap = cap
        self.jitter = jitter
        self.healthy = healthy
        self.clock = clock
        self.rand = rand
        self._attempt = 0
        #: when things last started working (None: failing since)
        self._ok_since: float | None = None

    @property
    def attempts(self) -> int:
        """Failures since the last reset."""
        return self._attempt

    def failed(self) -> float:
        """A failure: the seconds to wait before the next attempt."""
        if self._ok_since is not None:
            if self.clock() - self._ok_since >= self.healthy:
                self._attempt = 0
            self._ok_since = None
        wait = bounded_wait(self._attempt, self.first, self.cap, self.jitter, self.rand)
        self._attempt += 1
        return wait

    def succeeded(self) -> None:
        """Things work (again): the next failure starts from `first` once they worked
        for `healthy` seconds."""
        if self._ok_since is None:
            self._ok_since = self.clock()

    def reset(self) -> None:
        """Start from `first` at the next failure, whatever came before."""
        self._attempt = 0
        self._ok_since = None
