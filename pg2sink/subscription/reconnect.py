"""When to try again after a streaming session failed, and the log lines about it.

The service reports events (a session started streaming, a session or an attempt
failed) and waits as long as this says; nothing here does I/O, so the policy is tested
with a fake clock.

- Before the first session streamed, only --retry-initial retries: every
  --retry-interval (a standby waiting for the active instance's slot).
- Once streaming, an outage is retried with exponential backoff (pg2sink.retry): 1 s,
  2 s, 4 s ... up to 30 s. After a session that streamed for a healthy period (3 s,
  the first two waits together) the next outage starts again at 1 s; after a shorter
  one (a server or sink that keeps failing soon after each start) the backoff keeps
  growing. No jitter: one process reconnects to one server (no crowd to spread), and
  the waits in the log read as the policy says.
- One line per state change: a WARNING when an outage starts, an INFO when streaming
  resumes; a new reason within one outage is logged once at INFO.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pg2sink.retry import Backoff

log = logging.getLogger(__name__)

#: The first wait of an outage, and the longest.
FIRST_WAIT = 1.0
MAX_WAIT = 30.0
#: How long a session must stream to end an outage (and reset the backoff).
HEALTHY_SECONDS = 3.0


class Reconnect:
    """Backoff and logging of the reconnect loop (see the module docstring)."""

    def __init__(
        self,
        retry_interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        first_wait: float = FIRST_WAIT,
        max_wait: float = MAX_WAIT,
        healthy_seconds: float = HEALTHY_SECONDS,
    ) -> None:
        #: --retry-interval: the wait before the first session streamed
        self.retry_interval = retry_interval
        self.clock = clock
        self._backoff = Backoff(first_wait, max_wait, healthy=healthy_seconds, clock=clock)
        #: when the current session started streaming (None: not streaming)
        self._up_since: float | None = None
        #: when the current outage started (None: no outage since the last session)
        self._down_since: float | None = None
        self._ever_streamed = False
        self._failures = 0
        self._reasons: set[str] = set()

    def streaming(self) -> None:
        """A session started streaming: an outage, if any, is over."""
        now = self.clock()
        if self._down_since is not None:
            log.info(
                "streaming again after %.1fs (%d failed attempt%s)",
                now - self._down_since,
                self._failures,
                "" if self._failures == 1 else "s",
            )
        self._down_since = None
        self._up_since = now
        self._ever_streamed = True
        self._backoff.succeeded()

    def failed(self, reason: str) -> float:
        """A session (or an attempt to start one) failed for `reason`: seconds to wait."""
        if not self._ever_streamed:
            if reason not in self._reasons:
                self._reasons.add(reason)
                log.warning("%s; retrying every %gs (--retry-initial)", reason, self.retry_interval)
            return self.retry_interval
        now = self.clock()
        if self._up_since is not None:  # a streaming session ended: an outage starts
            self._up_since = None
            self._down_since = now
            self._failures = 0
            self._reasons = {reason}
            log.warning("streaming stopped: %s; retrying", reason)
        elif reason not in self._reasons:
            self._reasons.add(reason)
            log.info("still retrying: %s", reason)
        self._failures += 1
        return self._backoff.failed()
