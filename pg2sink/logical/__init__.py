"""Logical replication, sans I/O: the pgoutput decoder and the replication-protocol framing.

    lsn          LSN text form and PG-epoch timestamps
    messages     the frozen dataclasses the decoder returns
    decoder      decode(bytes) -> message, with the wire layouts documented
    replication  CopyData framing: XLogData, keepalive, standby status update
    render       one-line text form for --decode-only

Nothing here imports psycopg or touches a socket; tests feed it golden bytes.
"""

from pg2sink.logical.copydata import (
    PrimaryKeepalive,
    XLogData,
    parse_copy_data,
    standby_status_update,
)
from pg2sink.logical.decoder import MessageTag, TupleKind, decode
from pg2sink.logical.lsn import (
    PG_EPOCH_OFFSET_US,
    datetime_to_pg_timestamp,
    format_lsn,
    now_pg_timestamp,
    parse_lsn,
    pg_timestamp_to_datetime,
)
from pg2sink.logical.messages import (
    UNCHANGED_TOAST,
    Begin,
    BinaryValue,
    Column,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleValue,
    Type,
    UnchangedToast,
    Update,
)
from pg2sink.logical.render import render

__all__ = [
    "PG_EPOCH_OFFSET_US",
    "UNCHANGED_TOAST",
    "Begin",
    "BinaryValue",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "MessageTag",
    "Origin",
    "PgOutputMessage",
    "PrimaryKeepalive",
    "Relation",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleKind",
    "TupleValue",
    "Type",
    "UnchangedToast",
    "Update",
    "XLogData",
    "datetime_to_pg_timestamp",
    "decode",
    "format_lsn",
    "now_pg_timestamp",
    "parse_copy_data",
    "parse_lsn",
    "pg_timestamp_to_datetime",
    "render",
    "standby_status_update",
]
