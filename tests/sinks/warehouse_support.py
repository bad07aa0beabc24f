"""Reading back what the warehouse sinks hold, for the tests of several modules: a DuckDB
file (read only) and a dataset of local-bigquery (`make services`' BigQuery API server)
through google-cloud-bigquery, values as both databases' Python drivers agree on them."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import duckdb

from pg2sink.sinks.bigquery.config import BigQueryConfig
from pg2sink.sinks.bigquery.warehouse import client

#: the project of every test dataset (local-bigquery takes any)
PROJECT = "pg2sink-tests"
#: tests load each batch as it comes (test_bigquery.py's
#: test_batches_are_spaced_by_the_load_interval keeps the default's spacing)
UNSPACED = ("--bigquery-load-interval", "0s")


def bigquery_args(endpoint: str, prefix: str) -> list[str]:
    """pg2sink's options for dataset `d_<prefix>` of local-bigquery at `endpoint`, each
    batch loaded as it comes (its tables: `PROJECT.d_<prefix>.<table>`)."""
    return [
        "--sink", "bigquery", "--bigquery-project", PROJECT,
        "--bigquery-dataset", f"d_{prefix}", "--bigquery-endpoint", endpoint, *UNSPACED,
    ]  # fmt: skip


def normal(value: Any) -> Any:
    """A value as both databases' Python drivers can agree on it."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [normal(v) for v in value]
    return value


def duck_query(path: Path, query: str) -> list[tuple[Any, ...]]:
    """The rows of `query` on the DuckDB file `path`, in UTC."""
    with duckdb.connect(str(path), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        return con.execute(query).fetchall()


def config(endpoint: str, dataset: str) -> BigQueryConfig:
    return BigQueryConfig(
        bigquery_project=PROJECT, bigquery_dataset=dataset, bigquery_endpoint=endpoint
    )


def bq_rows(endpoint: str, query: str) -> list[tuple[Any, ...]]:
    """The rows of `query` on the BigQuery API at `endpoint`, values normal()."""
    bq = client(config(endpoint, "unused"))
    try:
        return [tuple(normal(v) for v in row.values()) for row in bq.query(query).result()]
    finally:
        bq.close()  # type: ignore[no-untyped-call]
