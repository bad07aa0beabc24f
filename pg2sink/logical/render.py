"""One-line human-readable rendering of pgoutput messages, for `pg2sink --decode-only`.

The output is for people reading a terminal, not a format to parse: the record formats of
the sinks are the product's contract, this is not. It never raises on a decoded message, even
when the relation is unknown or its column list disagrees with the tuple.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pg2sink.logical.lsn import format_lsn, pg_timestamp_to_datetime
from pg2sink.logical.messages import (
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

__all__ = ["render"]

# Names of the common built-in types, to make RELATION lines readable; others print as oid=N.
# OIDs from https://github.com/postgres/postgres/blob/master/src/include/catalog/pg_type.dat
_BUILTIN_TYPES: Final[Mapping[int, str]] = {
    16: "bool",
    17: "bytea",
    18: "char",
    19: "name",
    20: "int8",
    21: "int2",
    23: "int4",
    25: "text",
    26: "oid",
    114: "json",
    142: "xml",
    700: "float4",
    701: "float8",
    1042: "bpchar",
    1043: "varchar",
    1082: "date",
    1083: "time",
    1114: "timestamp",
    1184: "timestamptz",
    1186: "interval",
    1266: "timetz",
    1700: "numeric",
    2950: "uuid",
    3802: "jsonb",
    3220: "pg_lsn",
    1000: "bool[]",
    1005: "int2[]",
    1007: "int4[]",
    1016: "int8[]",
    1009: "text[]",
}

# the data messages that carry the xid of their transaction inside a stream block
_STREAMABLE: Final = (Relation, Type, Insert, Update, Delete, Truncate, Message)


def render(msg: PgOutputMessage, relations: Mapping[int, Relation]) -> str:
    """Render one message on one line, using `relations` for table and column names."""
    match msg:
        case Begin():
            line = (
                f"BEGIN xid={msg.xid} final_lsn={_lsn(msg.final_lsn)} "
                f"commit_time={_time(msg.commit_time)}"
            )
        case Commit():
            line = (
                f"COMMIT lsn={_lsn(msg.commit_lsn)} end_lsn={_lsn(msg.end_lsn)} "
                f"commit_time={_time(msg.commit_time)}{_flags(msg.flags)}"
            )
        case Origin():
            line = f"ORIGIN {msg.name!r} commit_lsn={_lsn(msg.commit_lsn)}"
        case Relation():
            columns = ", ".join(_column(c) for c in msg.columns)
            line = (
                f"RELATION {msg.relation_id} {_qualified(msg.namespace, msg.name)} "
                f"replica_identity={msg.replica_identity} columns=[{columns}]"
            )
        case Type():
            line = f"TYPE {msg.type_oid} {_qualified(msg.namespace, msg.name)}"
        case Insert():
            relation = relations.get(msg.relation_id)
            line = f"INSERT {_table(msg.relation_id, relations)} new={_row(msg.new, relation)}"
        case Update():
            relation = relations.get(msg.relation_id)
            old = "" if msg.old is None else f" {_old(msg.old, msg.old_is_key, relation)}"
            line = f"UPDATE {_table(msg.relation_id, relations)}{old} new={_row(msg.new, relation)}"
        case Delete():
            relation = relations.get(msg.relation_id)
            line = (
                f"DELETE {_table(msg.relation_id, relations)} "
                f"{_old(msg.old, msg.old_is_key, relation)}"
            )
        case Truncate():
            tables = ", ".join(_table(r, relations) for r in msg.relation_ids)
            line = f"TRUNCATE {tables}"
            if msg.cascade:
                line += " cascade"
            if msg.restart_identity:
                line += " restart_identity"
        case Message():
            kind = "transactional" if msg.transactional else "non-transactional"
            line = (
                f"MESSAGE {kind} lsn={_lsn(msg.lsn)} prefix={msg.prefix!r} content={msg.content!r}"
            )
        case StreamStart():
            line = f"STREAM START xid={msg.xid}" + (" first_segment" if msg.first_segment else "")
        case StreamStop():
            line = "STREAM STOP"
        case StreamCommit():
            line = (
                f"STREAM COMMIT xid={msg.xid} lsn={_lsn(msg.commit_lsn)} "
                f"end_lsn={_lsn(msg.end_lsn)} commit_time={_time(msg.commit_time)}"
                f"{_flags(msg.flags)}"
            )
        case StreamAbort():
            line = f"STREAM ABORT xid={msg.xid} subxid={msg.subxid}"
        case _:
            line = repr(msg)  # unreachable for the union; kept so render never raises
    if isinstance(msg, _STREAMABLE) and msg.xid is not None:
        line += f" xid={msg.xid}"
    return line


def _lsn(lsn: int) -> str:
    try:
        return format_lsn(lsn)
    except ValueError:
        return str(lsn)


def _time(us: int) -> str:
    try:
        return pg_timestamp_to_datetime(us).isoformat()
    except OverflowError:
        return f"{us}us"  # e.g. 'infinity', outside what datetime can hold


def _flags(flags: int) -> str:
    return f" flags={flags}" if flags else ""


def _qualified(namespace: str, name: str) -> str:
    # pgoutput sends '' for pg_catalog
    return f"{namespace or 'pg_catalog'}.{name}"


def _table(relation_id: int, relations: Mapping[int, Relation]) -> str:
    relation = relations.get(relation_id)
    if relation is None:
        return f"relation#{relation_id}"
    return _qualified(relation.namespace, relation.name)


def _column(column: Column) -> str:
    type_name = _BUILTIN_TYPES.get(column.type_oid, f"oid={column.type_oid}")
    text = f"{column.name} {type_name}"
    if column.is_key:
        text += "(key)"
    if column.type_modifier != -1:
        text += f" typmod={column.type_modifier}"
    return text


def _value(value: TupleValue) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, UnchangedToast):
        return "<unchanged-toast>"
    if isinstance(value, BinaryValue):
        return f"<binary {value.data.hex()}>"
    return repr(value.decode(errors="replace"))


def _names(relation: Relation | None, count: int) -> list[str]:
    """Column names for a tuple of `count` values; $n where the relation does not say."""
    known = [] if relation is None else [c.name for c in relation.columns]
    return known[:count] + [f"${i + 1}" for i in range(len(known), count)]


def _row(values: tuple[TupleValue, ...], relation: Relation | None) -> str:
    names = _names(relation, len(values))
    return "(" + ", ".join(f"{n}={_value(v)}" for n, v in zip(names, values, strict=True)) + ")"


def _old(values: tuple[TupleValue, ...], is_key: bool, relation: Relation | None) -> str:
    if not is_key:
        return f"old[full]={_row(values, relation)}"
    # A key tuple has every column, the non-key ones NULL; show only the key columns.
    names = _names(relation, len(values))
    keys = [] if relation is None else [c.is_key for c in relation.columns]
    if len(keys) != len(values) or not any(keys):
        keys = [True] * len(values)
    pairs = ", ".join(f"{n}={_value(v)}" for n, v, k in zip(names, values, keys, strict=True) if k)
    return f"old[key]=({pairs})"
