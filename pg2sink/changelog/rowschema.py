"""The Avro record of a table's rows: field names, nullable unions, pg.* properties.

In a row record, a column's union is `nullable(avro)`: ["null", T], or ["null", T, "string"]
when T is narrower than the PostgreSQL type (date, time, timestamps, decimal, array: the
kinds codecs.KINDS marks narrower), so such a value goes in the "string" branch as
PostgreSQL's text: the same string the JSON encoder writes for it (a PgText), and a
consumer detects it by its type. docs/types.md lists every case.

Every Avro type carries a "pg.type" property with the PostgreSQL type (schema-qualified
when not built in, with its modifier: 'numeric(10,2)', 'varchar(20)[]', 'public.mood'), so
a consumer always sees what the column was.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pg2sink.changelog.codecs import KINDS, RowColumn, kind_of

__all__ = ["avro_name", "avro_row_schema", "nullable"]


def nullable(avro: Mapping[str, Any]) -> list[Any]:
    """The union a column (or array item) of Avro type `avro` has: null first, then the
    type, then "string" for the PostgreSQL text of values the type cannot hold."""
    if KINDS[kind_of(avro)].narrower:
        return ["null", avro, "string"]
    return ["null", avro]


_NOT_IN_AVRO_NAME = re.compile(r"[^A-Za-z0-9_]")


def avro_name(identifier: str) -> str:
    """A PostgreSQL identifier as an Avro name ([A-Za-z_][A-Za-z0-9_]*).

    Every character outside [A-Za-z0-9_] becomes '_' (one per code point), and a leading
    digit (or an empty name) gets a '_' in front: 'order id' → 'order_id', '1st' → '_1st',
    'größe' → 'gr__e'. Not injective: `avro_row_schema` makes field names unique.
    """
    name = _NOT_IN_AVRO_NAME.sub("_", identifier)
    if not name or name[0].isdigit():
        name = "_" + name
    return name


def avro_row_schema(
    namespace: str,
    table: str,
    columns: Sequence[RowColumn],
    *,
    name: str = "value",
    primary_key: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The Avro record of a row of `namespace`.`table`, one nullable field per column.

    Field names are the sanitised column names (`avro_name`); when two columns sanitise to
    the same name the later one gets '_2' (or '_3' ...), so a name depends only on the
    columns before it and new columns (which PostgreSQL adds at the end) never rename
    existing fields. The original names stay in "pg.column", "pg.namespace", "pg.table"
    and "pg.primary_key". The same input always gives an equal dict, so comparing two
    schemas tells whether the table changed. `name` is the record name: 'value' for the
    row, e.g. 'key' for a record of just the key columns. `primary_key` gives the key
    columns in key order for "pg.primary_key" (a composite key's order matters to
    consumers); without it, the key columns are listed in table order.
    """
    used: set[str] = set()
    fields: list[dict[str, Any]] = []
    for column in columns:
        base = avro_name(column.name)
        field_name, suffix = base, 2
        while field_name in used:
            field_name, suffix = f"{base}_{suffix}", suffix + 1
        used.add(field_name)
        fields.append(
            {
                "name": field_name,
                # copied so that the schema shares no mutable state with the codec
                "type": nullable(copy.deepcopy(column.codec.avro)),
                "default": None,
                "pg.column": column.name,
                "pg.key": column.is_key,
            }
        )
    return {
        "type": "record",
        "name": name,
        "namespace": avro_name(namespace) + "." + avro_name(table),
        "fields": fields,
        "pg.namespace": namespace,
        "pg.table": table,
        "pg.primary_key": (
            list(primary_key)
            if primary_key is not None
            else [column.name for column in columns if column.is_key]
        ),
    }
