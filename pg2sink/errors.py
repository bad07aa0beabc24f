"""The error tree of pg2sink: one root, transient vs terminal markers.

    Pg2SinkError                  root; str(e) is the one line the user sees
    ├── ConfigError        (T)    bad flags, bad DSN, unknown sink ...
    ├── SourceError               PostgreSQL-side problems
    │   ├── ConnectError   (R)    server unreachable, authentication failed
    │   ├── ServerConfigError (T) wal_level is not logical, missing privileges
    │   └── SlotBusyError  (R)    the slot is active in another process
    ├── DecodeError        (T)    a pgoutput message we cannot parse
    ├── SinkError                 the sink refused or failed to write
    │   └── SinkUnavailableError (R) the sink is down for now; retry later
    └── ImportFailed       (R)    an import job's attempt failed (retried with backoff)

(T) = Terminal: retrying cannot help, stop with exit code 2.
(R) = Retryable: the loop may wait and try again.
"""

from __future__ import annotations


class Pg2SinkError(Exception):
    """Root of every error pg2sink raises on purpose."""

    #: whether waiting and trying again can make the problem go away
    retryable: bool = False


class ConfigError(Pg2SinkError):
    """The configuration (flags, environment, DSN) is invalid."""


class SourceError(Pg2SinkError):
    """A problem on the PostgreSQL side."""


class ConnectError(SourceError):
    """PostgreSQL cannot be reached or refused the login."""

    retryable = True


class ServerConfigError(SourceError):
    """The server is reachable but not set up for logical replication."""


class SlotBusyError(SourceError):
    """The replication slot is in use by another process."""

    retryable = True


class DecodeError(Pg2SinkError):
    """A replication message does not follow the pgoutput protocol."""


class SinkError(Pg2SinkError):
    """The sink failed to accept records."""


class SinkUnavailableError(SinkError):
    """The sink is temporarily unavailable; the records may be retried."""

    retryable = True


class ImportFailed(Pg2SinkError):  # noqa: N818 (the name the contract gives it)
    """One attempt of a snapshot import failed; the job records it and retries later."""

    retryable = True
