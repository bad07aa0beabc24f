"""What a warehouse sink's imports stage, shared by the DuckDB sink (Parquet files next to
the database) and the BigQuery sink (staging tables): the staged rows' layout and the
table's Schema record as JSON, kept beside them (a Parquet file's metadata, a staging
table's column).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from pg2sink.changelog.records import Schema
from pg2sink.sinks.warehouse.layout import Layout, evolve, new_layout

__all__ = ["LAYOUT_KEY", "SCHEMA_KEY", "schema_json", "schema_of", "staging_layout"]

#: the Parquet metadata keys of a staged file
SCHEMA_KEY, LAYOUT_KEY = b"pg2sink.schema", b"pg2sink.layout"


def staging_layout(schema: Schema) -> Layout:
    """The raw columns a staged file has: the table's layout in a database of its own
    (the loader maps them to the sink's layout by source column name)."""
    layout, _ = new_layout(schema, set())
    layout, _ = evolve(layout, schema)
    return layout


def schema_json(schema: Schema) -> bytes:
    """The Schema record as JSON (a staged file's metadata, a staging table's column)."""
    return orjson.dumps(
        {
            "timestamp": schema.timestamp.isoformat(),
            "lsn": schema.lsn,
            "namespace": schema.namespace,
            "name": schema.name,
            "schema": schema.schema,
            "relation_id": schema.relation_id,
            "primary_key": list(schema.primary_key),
        }
    )


def schema_of(metadata: dict[bytes, bytes]) -> tuple[Schema, Layout]:
    """The Schema record and staging layout a staged file's metadata holds."""
    data: dict[str, Any] = orjson.loads(metadata[SCHEMA_KEY])
    schema = Schema(
        datetime.fromisoformat(data["timestamp"]),
        data["lsn"],
        data["namespace"],
        data["name"],
        data["schema"],
        data["relation_id"],
        tuple(data["primary_key"]),
    )
    return schema, Layout.from_json(orjson.loads(metadata[LAYOUT_KEY]))
