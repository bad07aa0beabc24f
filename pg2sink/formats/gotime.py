"""What the Go seed tools' values look like: Go's JSON of a time.Time, and a stable
message id where they drew a random UUID."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from pg2sink.changelog.records import Modification

__all__ = ["go_time", "message_uuid"]

#: the namespace of message_uuid's name-based UUIDs (uuid5 of pg2sink's URL)
_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/pg2sink/changes")


def go_time(t: datetime) -> str:
    """`t` as Go's time.Time MarshalJSON writes it (RFC 3339 with nanoseconds, trailing
    zeros of the fraction dropped), in UTC: '2024-05-01T10:00:00.1234Z'."""
    t = t.astimezone(UTC) if t.tzinfo is not None else t
    text = t.strftime("%Y-%m-%dT%H:%M:%S")
    if t.microsecond:
        text += f".{t.microsecond:06d}".rstrip("0")
    return text + "Z"


def message_uuid(m: Modification) -> str:
    """A UUID naming the change (its LSN, position and table): the seed tools drew a
    random one per message; this one is the same when a replay sends the change again,
    so a consumer can drop the repeat."""
    return str(uuid.uuid5(_NAMESPACE, f"{m.lsn}/{m.sequence}/{m.namespace}.{m.name}"))
