"""pg_kinesis's record (--format pg-kinesis), as it put it to Kinesis.

Derived from pg_kinesis's code (github.com/nickelser/pg_kinesis, pg_kinesis.go
marshalWALToJSON and marshalColumnValue): `json.Marshal` of a struct whose fields are,
in order, time, lsn, table, operation, columns; columns is a Go map (json.Marshal sorts
its keys) of column -> {"new": V, "old": V}, each V a map {"q", "t", "v"}:

    {"time":"2024-05-01T10:00:00Z","lsn":"0/16B3748","table":"public.users",
     "operation":"UPDATE","columns":{"id":{"new":{"q":"false","t":"integer","v":"1"}},
     "name":{"new":{"q":"true","t":"text","v":"Bo"},"old":{"q":"true","t":"text","v":"Ann"}}}}

- time: `time.RFC3339` (whole seconds; pg_kinesis took its clock at receipt, pg2sink the
  commit time, in UTC); lsn: `pgx.FormatLSN` (%X/%X) of the change's WAL position;
  table: schema.table as test_decoding names it (quote_identifier'd where needed);
  operation: test_decoding's word, INSERT, UPDATE, DELETE (and TRUNCATE).
- columns: for INSERT and UPDATE every column of the new row under "new", plus "old"
  where an old value is known and differs; for DELETE the old image's columns (the key,
  or all with REPLICA IDENTITY FULL) under "old".
- V (parselogical.ColumnValue of test_decoding's output): t is the type as
  format_type_be writes it ("integer", "character varying", "timestamp without time
  zone"), v the value's text ("null" for NULL, "unchanged-toast-datum" for an unchanged
  TOASTed value), q "false" where test_decoding writes the value unquoted (numbers,
  booleans, null, unchanged TOAST) and "true" else: all strings, as pg_kinesis wrote them.

Where pg2sink differs (docs/formats.md): the Kinesis sink's partition key is the row's
key (pg_kinesis put the table's name, `PartitionKey: pr.Relation`); time is the commit
time; v is base.pg_text's (PostgreSQL's own text for numbers, text, dates, timestamps,
bytea; pg2sink's JSON for arrays, ISO 8601 for intervals); imported rows are INSERTs;
TRUNCATE has no columns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC

from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.formats.base import TableEncoder, columns_of, key_columns, key_of, pg_text
from pg2sink.formats.jsonenc import dumps
from pg2sink.logical.messages import UnchangedToast

__all__ = ["PgKinesisEncoder", "format_lsn", "qualified", "type_name"]

#: pg2sink's type names (pg.type, without modifiers) -> format_type_be's
_TYPE_NAMES = {
    "bool": "boolean",
    "int2": "smallint",
    "int4": "integer",
    "int8": "bigint",
    "float4": "real",
    "float8": "double precision",
    "varchar": "character varying",
    "bpchar": "character",
    "bit": "bit",
    "varbit": "bit varying",
    "time": "time without time zone",
    "timetz": "time with time zone",
    "timestamp": "timestamp without time zone",
    "timestamptz": "timestamp with time zone",
}
#: the types test_decoding's print_literal writes unquoted (besides NULL)
_UNQUOTED = frozenset(("int2", "int4", "int8", "oid", "float4", "float8", "numeric", "bool"))
_MODIFIERS = re.compile(r"\(.*?\)")
_PLAIN_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_$]*$")


def format_lsn(lsn: int) -> str:
    """An LSN as pgx.FormatLSN writes it: '16/B374D848'."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def type_name(pg_type: str) -> tuple[str, bool]:
    """format_type_be's name of a pg2sink type name, and whether test_decoding quotes
    its values."""
    base = _MODIFIERS.sub("", pg_type)
    array = base.endswith("[]")
    element = base.removesuffix("[]")
    name = _TYPE_NAMES.get(element, element)
    return (name + "[]" if array else name), array or element not in _UNQUOTED


def _identifier(name: str) -> str:
    """quote_identifier's rule, without its keyword list: quoted unless plain."""
    return name if _PLAIN_IDENTIFIER.match(name) else '"' + name.replace('"', '""') + '"'


def qualified(schema: str, table: str) -> str:
    """schema.table as test_decoding writes it (quote_qualified_identifier)."""
    return f"{_identifier(schema)}.{_identifier(table)}"


class _PgKinesisTable:
    __slots__ = ("_keys", "_table", "_types")

    def __init__(self, schema: Schema) -> None:
        self._keys = key_columns(schema)
        self._table = qualified(schema.namespace, schema.name)
        self._types = {c.name: (*type_name(c.pg_type), c.kind) for c in columns_of(schema)}

    def key(self, row: Mapping[str, object]) -> bytes | None:
        return key_of(self._keys, row)

    def _value(self, name: str, value: object) -> dict[str, str]:
        """marshalColumnValue: {"q", "t", "v"}, keys in json.Marshal's sorted order."""
        t, quoted, kind = self._types.get(name, ("text", True, None))
        if value is None:
            return {"q": "false", "t": t, "v": "null"}
        if isinstance(value, UnchangedToast):
            return {"q": "false", "t": t, "v": "unchanged-toast-datum"}
        return {"q": "true" if quoted else "false", "t": t, "v": pg_text(value, kind) or ""}

    def value(self, m: Modification) -> bytes:
        columns: dict[str, dict[str, dict[str, str]]] = {}
        if m.operation is Operation.DELETE:
            for name, old in (m.before or {}).items():
                columns[name] = {"old": self._value(name, old)}
        elif m.after is not None:
            before = m.before or {}
            for name, new in m.after.items():
                pair = {"new": self._value(name, new)}
                if name in before:
                    old = self._value(name, before[name])
                    if old["v"] != pair["new"]["v"]:
                        pair["old"] = old
                columns[name] = pair
        operation = "INSERT" if m.operation is Operation.IMPORT else str(m.operation)
        return dumps(
            {
                "time": m.timestamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "lsn": format_lsn(m.lsn),
                "table": self._table,
                "operation": operation,
                "columns": dict(sorted(columns.items())),
            }
        )


class PgKinesisEncoder:
    """--format pg-kinesis."""

    def table(self, schema: Schema) -> TableEncoder:
        return _PgKinesisTable(schema)
