"""The public records: Schema, Modification and Message (DESIGN.md §2, README "Records").

These classes are the product's contract with consumers (docs/changes.md); every sink
encodes them (JSON lines in the file sink, Avro on Kafka) without changing
their meaning. Values inside `before`/`after` are typed Python values
produced by changelog.typemap (int, Decimal, datetime, ...).

The classes are slotted but not frozen: a frozen dataclass costs five times
as much to construct (object.__setattr__ per field), and one Modification
is built per change on the hot path. Treat them as immutable all the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class Operation(StrEnum):
    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    TRUNCATE = "TRUNCATE"
    IMPORT = "IMPORT"


@dataclass(slots=True)
class Schema:
    """The Avro record schema of a table's rows, emitted when it is first seen or changes."""

    timestamp: datetime
    """Commit time of the transaction in which the shape was seen."""
    lsn: int
    namespace: str
    name: str
    schema: dict[str, Any]
    """Avro record schema (fastavro/JSON form), see changelog.typemap.avro_row_schema."""
    relation_id: int = 0
    """The table's OID (internal; not part of the encoded record)."""
    primary_key: tuple[str, ...] = ()
    """Primary-key column names, in key order (also in schema['pg.primary_key'])."""
    missing: dict[str, object] = field(default_factory=dict)
    """Per column added with `ADD COLUMN ... DEFAULT`, the value rows stored before it read
    (pg_attribute.attmissingval, as the stream decodes values; no change of those rows is
    logged). For sinks that keep a table's state (internal; not part of the encoded
    record); empty when the catalog has none or cannot tell."""


@dataclass(slots=True)
class Modification:
    """One row change, as committed."""

    timestamp: datetime
    """Commit time of the transaction."""
    sequence: int
    """0-based position of this change within its transaction."""
    lsn: int
    """WAL position of the change (XLogData start of its pgoutput message)."""
    xid: int
    operation: Operation
    namespace: str
    name: str
    before: dict[str, object] | None
    """Old row (REPLICA IDENTITY FULL) or old key (DEFAULT/INDEX: DELETE, key change)."""
    after: dict[str, object] | None
    """New row for INSERT, UPDATE and IMPORT; None for DELETE and TRUNCATE."""


@dataclass(slots=True)
class Truncation(Modification):
    """A TRUNCATE Modification of one table, with the statement's options.

    A subclass rather than two more Modification fields: INSERT/UPDATE/DELETE records
    (the hot path) stay exactly as they were, and sinks reach this class only through
    their not-a-plain-Modification branch. Encoded as `"truncate": {"cascade": ...,
    "restart_identity": ...}` in JSON and the nullable `truncate` field in Avro.
    """

    cascade: bool = False
    """TRUNCATE ... CASCADE: tables referencing this one were truncated too."""
    restart_identity: bool = False
    """TRUNCATE ... RESTART IDENTITY: the table's owned sequences were reset."""


@dataclass(slots=True)
class Message:
    """A logical decoding message (pg_logical_emit_message), forwarded with --messages."""

    timestamp: datetime | None
    """Commit time of the transaction (transactional); None for a non-transactional one."""
    lsn: int
    """WAL position of the message."""
    xid: int | None
    """Transaction id (transactional); None for a non-transactional message."""
    transactional: bool
    prefix: str
    content: bytes
    """The raw bytes of the message (base64 in JSON, docs/changes.md)."""


Record = Schema | Modification | Message
