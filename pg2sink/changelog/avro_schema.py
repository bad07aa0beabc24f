"""The Avro schemas the Kafka sink registers for a table: the envelope and the key.

The Kafka sink writes a Modification as an Avro record, the *envelope*, whose `before`
and `after` fields hold the table's row record (exactly the schema its Schema record
carries, see changelog.typemap.avro_row_schema):

    record <ns>.<table>.Modification
      timestamp        long, timestamp-micros   commit time
      sequence, lsn, xid  long
      operation, namespace, name  string
      before, after    ["null", <ns>.<table>.value]
      unchanged_toast  array of string, default []
      truncate         ["null", TruncateOptions {cascade, restart_identity: boolean}],
                       default null; set on TRUNCATE only (docs/changes.md)

`unchanged_toast` lists the fields of `after` (Avro field names) whose value is an
unchanged TOASTed value PostgreSQL did not send: they are null in `after`, and this list is
how an Avro consumer tells them from a real NULL. The key of a message is the record
`<ns>.<table>.key` of the primary-key (or replica-identity) columns, in key order, with the
same fields as the row record.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["envelope_schema", "key_schema"]

#: Fields of the envelope before `before`/`after`, in the order of schemas/modification.avsc.
_ENVELOPE_HEAD: tuple[dict[str, Any], ...] = (
    {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "sequence", "type": "long"},
    {"name": "lsn", "type": "long"},
    {"name": "xid", "type": "long"},
    {"name": "operation", "type": "string"},
    {"name": "namespace", "type": "string"},
    {"name": "name", "type": "string"},
)

#: The options of a TRUNCATE (records.Truncation), the envelope's last field.
_TRUNCATE_OPTIONS: dict[str, Any] = {
    "type": "record",
    "name": "TruncateOptions",
    "fields": [
        {"name": "cascade", "type": "boolean"},
        {"name": "restart_identity", "type": "boolean"},
    ],
}


def envelope_schema(row: Mapping[str, Any]) -> dict[str, Any]:
    """The Modification envelope (value schema) of the table whose row record is `row`."""
    row_name = f"{row['namespace']}.{row['name']}"
    return {
        "type": "record",
        "name": "Modification",
        "namespace": row["namespace"],
        "fields": [
            *copy.deepcopy(_ENVELOPE_HEAD),
            {"name": "before", "type": ["null", copy.deepcopy(dict(row))], "default": None},
            # A named type is defined once and referenced by its full name afterwards.
            {"name": "after", "type": ["null", row_name], "default": None},
            {
                "name": "unchanged_toast",
                "type": {"type": "array", "items": "string"},
                "default": [],
            },
            # Last, with a default: added without breaking BACKWARD/FORWARD compatibility.
            {
                "name": "truncate",
                "type": ["null", copy.deepcopy(_TRUNCATE_OPTIONS)],
                "default": None,
            },
        ],
        "pg.namespace": row.get("pg.namespace"),
        "pg.table": row.get("pg.table"),
    }


def key_schema(
    row: Mapping[str, Any], key_columns: Sequence[str] | None = None
) -> dict[str, Any] | None:
    """The key record of the table (its key columns' fields, in key order), or None.

    This is what `typemap.avro_row_schema(..., name="key")` gives for the key columns,
    taken from the row record so that the key's field names are those of the value.
    `key_columns` gives the key order (Schema.primary_key, also the row record's
    "pg.primary_key" when the changelog built it).
    """
    if not key_columns:
        key_columns = row.get("pg.primary_key") or []
    if not key_columns:
        return None
    by_column = {f["pg.column"]: f for f in row["fields"]}
    return {
        "type": "record",
        "name": "key",
        "namespace": row["namespace"],
        "fields": [copy.deepcopy(by_column[c]) for c in key_columns],
        "pg.namespace": row.get("pg.namespace"),
        "pg.table": row.get("pg.table"),
        "pg.primary_key": list(key_columns),
    }
