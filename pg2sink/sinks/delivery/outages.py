"""Outage and recovery of a sink's server: one WARNING when it starts, one INFO when it
ends, and the sink's health for GET /status and pg2sink_sink_healthy.

A sink tells `Outages` what it finds out (`trouble` on a failure worth retrying,
`recovered` on the first success after), from whichever thread finds it out, and logs
its own lines when these say an outage started or ended, so that each outage gives
exactly one line each way however many attempts it takes. While an outage lasts, the
callback given to `report_to` (StreamStats.sink_outage) holds its description, so
/status answers 500 from the first failed attempt to the first success.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Outages"]


def _ignore(outage: str) -> None:
    """No one to tell yet (before report_to)."""


class Outages:
    """See the module docstring. `what` names the server in the health reason (none:
    the reason says it)."""

    def __init__(self, what: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.clock = clock
        #: when the outage began (None: no outage)
        self.since: float | None = None
        #: failed attempts in this outage, and the last one's reason
        self.attempts = 0
        self.reason = ""
        self._tell: Callable[[str], None] = _ignore

    @property
    def down(self) -> bool:
        return self.since is not None

    def describe(self) -> str:
        """The outage for GET /status ("" while there is none)."""
        if self.since is None:
            return ""
        return f"{self.what}: {self.reason}" if self.what else self.reason

    def report_to(self, tell: Callable[[str], None]) -> None:
        """Call `tell(description)` when an outage starts, `tell("")` when it ends; now
        with the present state."""
        self._tell = tell
        tell(self.describe())

    def trouble(self, reason: str) -> bool:
        """An attempt failed for `reason`; whether this starts an outage (then the
        caller logs its one WARNING)."""
        self.attempts += 1
        self.reason = reason
        if self.since is not None:
            return False
        self.since = self.clock()
        self._tell(self.describe())
        return True

    def recovered(self) -> tuple[float, int] | None:
        """An attempt succeeded: when this ends an outage, its seconds and failed
        attempts (then the caller logs its one INFO), else None."""
        since = self.since
        if since is None:
            return None
        ended = (self.clock() - since, self.attempts)
        self.since, self.attempts, self.reason = None, 0, ""
        self._tell("")
        return ended
