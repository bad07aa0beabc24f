"""Whether Kafka is reachable: changed only on evidence, one log line per change.

librdkafka reports connection trouble through error_cb, often several times a second
while it lasts (each reconnect attempt), and never reports a recovery. Nor is an empty
producer queue a sign of recovery: with nothing to send it is empty while every broker
is down. So the state changes only on evidence, with hysteresis:

    reachable ──trouble──▶ suspect ──two metadata probes fail──▶ unreachable
        ▲                     │                                      │
        └── a probe answers ──┘                                      │
        └─────────── a delivery, or a metadata response ─────────────┘

- trouble: error_cb's "all brokers down", a failed connection, name resolution,
  authentication or TLS handshake. A broker that closed an idle connection is
  trouble too, until the probe (which reconnects) answers: then nothing is logged.
- probe: one metadata request (`Producer.list_topics`), at most every PROBE_INTERVAL
  seconds and waiting at most PROBE_WAIT, made from the sink's flush calls while
  suspect or unreachable. FAILED_PROBES in a row are needed: a first one may only have
  been slower than PROBE_WAIT to reconnect (TLS and SASL over a long link).
- Entering and leaving "unreachable" each log one line and set the sink's outage in
  StreamStats, so GET /status answers 500 for the whole outage (pg2sink_sink_healthy 0):
  the delivery engine's Outages, as every sink's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pg2sink.observability.stats import StreamStats
from pg2sink.sinks.delivery import Outages

__all__ = ["FAILED_PROBES", "PROBE_INTERVAL", "PROBE_WAIT", "BrokerHealth"]

log = logging.getLogger(__name__)

#: Seconds between two metadata probes while Kafka is suspect or unreachable.
PROBE_INTERVAL = 2.0
#: Longest wait of one probe, in seconds: it blocks the replication loop (which keeps
#: answering PostgreSQL between probes); a slow first connection goes on meanwhile.
PROBE_WAIT = 0.25
#: Failed probes in a row that make Kafka unreachable (so at least PROBE_INTERVAL).
FAILED_PROBES = 2


class BrokerHealth:
    """The reachability state machine of the module docstring."""

    def __init__(self, servers: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.servers = servers
        self.clock = clock
        #: declared unreachable (logged; StreamStats told)
        self.outages = Outages(f"Kafka at {servers} is unreachable", clock)
        #: trouble seen since the last evidence that Kafka answers
        self.suspect = False
        #: what the first trouble of this outage said
        self.reason = ""
        self._next_probe = 0.0
        self._failed_probes = 0

    @property
    def down(self) -> bool:
        """Declared unreachable."""
        return self.outages.down

    def report_to(self, stats: StreamStats) -> None:
        """Keep `stats` told of outages (the sink's health in GET /status)."""
        self.outages.report_to(stats.sink_outage)

    def trouble(self, reason: str) -> None:
        """librdkafka reported a connection problem: look (probe) before concluding."""
        if self.down or self.suspect:
            return
        self.suspect = True
        self.reason = reason
        self._failed_probes = 0
        self._next_probe = self.clock()

    def probe_due(self) -> bool:
        return (self.suspect or self.down) and self.clock() >= self._next_probe

    def probe_failed(self, reason: str) -> None:
        """A metadata request got no answer: after FAILED_PROBES in a row, Kafka is
        unreachable (logged once)."""
        self._next_probe = self.clock() + PROBE_INTERVAL
        self._failed_probes += 1
        if self.down or self._failed_probes < FAILED_PROBES:
            return
        self.suspect = False
        self.reason = self.reason or reason
        self.outages.trouble(self.reason)
        log.warning(
            "Kafka at %s is unreachable (%s); messages wait in the producer queue for up "
            "to message.timeout.ms",
            self.servers,
            self.reason,
        )

    def reached(self) -> None:
        """A delivery or a metadata response: Kafka answers (logged once after an outage)."""
        self.suspect = False
        self._failed_probes = 0
        self.reason = ""
        if self.outages.recovered() is not None:
            log.info("Kafka is reachable again; deliveries resumed")
