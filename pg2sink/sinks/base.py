"""The Sink protocol: how records leave pg2sink, and how durability comes back.

Lifecycle: `open()`, then any number of `write(record)` and
`checkpoint(lsn)` calls, `flush()` whenever the stream wants durability,
`close()` at the end.

`checkpoint(lsn)` says "every record written so far belongs to WAL below
`lsn`" (the end of a committed transaction, or a keepalive position while
no transaction is open). `flush()` makes everything written durable and
returns the highest checkpoint that is now durably accepted; `acknowledged()`
returns it without waiting. The subscription confirms to PostgreSQL only
LSNs a sink has returned from these two, never more.
"""

from __future__ import annotations

from typing import Protocol

from pg2sink.changelog.records import Record


class Sink(Protocol):
    #: True when the sink writes JSON (jsonenc): row values may then be decoded
    #: straight to their JSON form (ValueCodec.to_json) instead of Python values.
    json_values: bool

    def open(self) -> None: ...

    def write(self, record: Record) -> None: ...

    def checkpoint(self, lsn: int) -> None: ...

    def flush(self) -> int | None: ...

    def acknowledged(self) -> int | None: ...

    def close(self) -> None: ...
