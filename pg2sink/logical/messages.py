"""The pgoutput messages as frozen dataclasses: what the decoder returns, nothing more.

Field names follow the PostgreSQL documentation
(https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html). LSNs are
ints (see `lsn.format_lsn`), timestamps are raw PG-epoch microseconds (see
`lsn.pg_timestamp_to_datetime`): converting them is left to whoever needs it, since most
changes never have their timestamps looked at.

Inside a stream block (protocol version 2+, between Stream Start and Stream Stop) the data
messages carry the id of the (sub)transaction they belong to; it is the trailing `xid` field,
None outside streaming.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final, TypeAlias

__all__ = [
    "UNCHANGED_TOAST",
    "Begin",
    "BinaryValue",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgOutputMessage",
    "Relation",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleValue",
    "Type",
    "UnchangedToast",
    "Update",
]


class UnchangedToast:
    """An unchanged TOASTed value that the server did not send (tuple kind 'u').

    A singleton: `UnchangedToast()` always returns `UNCHANGED_TOAST`. Deliberately not a
    dataclass, so JSON encoders (orjson) hand it to their fallback instead of writing
    it as an empty object.
    """

    __slots__ = ()
    _instance: ClassVar[UnchangedToast | None] = None

    def __new__(cls) -> UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        # pickle and copy resolve the module-level name, so the singleton stays one
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = UnchangedToast()


@dataclass(frozen=True, slots=True)
class BinaryValue:
    """A value in the type's binary send format (tuple kind 'b', option binary 'true')."""

    data: bytes


#: One column of a tuple: the UTF-8 bytes of the text output (kind 't'), None for NULL
#: (kind 'n'), UNCHANGED_TOAST (kind 'u') or a BinaryValue (kind 'b').
TupleValue: TypeAlias = bytes | UnchangedToast | BinaryValue | None


@dataclass(frozen=True, slots=True)
class Begin:
    """Start of a transaction ('B'); its changes follow, then a Commit."""

    final_lsn: int
    """LSN of the commit record of this transaction."""
    commit_time: int
    """Commit timestamp, PG-epoch microseconds."""
    xid: int
    """Transaction id."""


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a transaction ('C')."""

    flags: int
    """Currently unused by PostgreSQL (always 0)."""
    commit_lsn: int
    """LSN of the commit record."""
    end_lsn: int
    """End LSN of the transaction: the position to confirm once it is durable."""
    commit_time: int
    """Commit timestamp, PG-epoch microseconds."""


@dataclass(frozen=True, slots=True)
class Origin:
    """The replication origin a transaction came from ('O'), sent after Begin."""

    commit_lsn: int
    """LSN of the commit on the origin server."""
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a Relation message."""

    flags: int
    """Bit 1: the column is part of the replica identity key."""
    name: str
    type_oid: int
    type_modifier: int
    """atttypmod, -1 when the type has none."""

    @property
    def is_key(self) -> bool:
        """Whether the column is part of the replica identity (the 'K' old tuple)."""
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Relation:
    """Describes a table ('R'); sent before its first change and after each schema change."""

    relation_id: int
    namespace: str
    """Schema name; the empty string stands for pg_catalog."""
    name: str
    replica_identity: str
    """relreplident: 'd' default, 'n' nothing, 'f' full, 'i' index."""
    columns: tuple[Column, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Type:
    """Describes a non-built-in data type ('Y') used by a following Relation."""

    type_oid: int
    namespace: str
    """Schema name; the empty string stands for pg_catalog."""
    name: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Insert:
    """A row inserted ('I')."""

    relation_id: int
    new: tuple[TupleValue, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """A row updated ('U')."""

    relation_id: int
    old: tuple[TupleValue, ...] | None
    """The old key ('K') or full old row ('O'); None when the key did not change and the
    replica identity is not FULL."""
    old_is_key: bool
    """True when `old` holds only the replica identity columns (the others are None)."""
    new: tuple[TupleValue, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """A row deleted ('D')."""

    relation_id: int
    old: tuple[TupleValue, ...]
    old_is_key: bool
    """True when `old` holds only the replica identity columns (the others are None)."""
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    """One TRUNCATE statement over one or more tables ('T')."""

    relation_ids: tuple[int, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """A logical decoding message from pg_logical_emit_message() ('M')."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    """Start of a block of changes of an in-progress transaction ('S', protocol v2+)."""

    xid: int
    first_segment: bool
    """True for the first block of this transaction."""


@dataclass(frozen=True, slots=True)
class StreamStop:
    """End of a stream block ('E', protocol v2+)."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """Commit of a streamed transaction ('c', protocol v2+)."""

    xid: int
    flags: int
    """Currently unused by PostgreSQL (always 0)."""
    commit_lsn: int
    end_lsn: int
    commit_time: int
    """PG-epoch microseconds."""


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """Abort of a streamed transaction or subtransaction ('A', protocol v2+).

    xid == subxid when the top-level transaction itself aborted.
    """

    xid: int
    subxid: int


PgOutputMessage: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | Message
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)
