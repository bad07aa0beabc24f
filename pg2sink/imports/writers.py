"""What a Spark executor does with its partition of an import: write it, mark it done.

`write_partition` runs in the Python worker of each Spark task (through mapInArrow): it
receives the partition's rows as Arrow record batches of binary columns (each value
PostgreSQL's text output of the column in UTF-8, or null), checks them and hands them,
as string columns, to the sink's import
target (sinks/base.py `ImportTarget`; the file sink's in sinks/file/imports.py, Kafka's
in sinks/kafka/imports.py), which decodes them with the stream's codecs
(changelog/batches.py), writes IMPORT Modifications with the sink's own encoders and
returns once they are durable. Only then is the partition marked done in the job store,
and only if the JVM that fed it (and the Python daemon between) still runs: a JVM killed
mid-partition can end its Arrow stream at a batch boundary, which reads as a clean end.
Nothing is sent back to the driver but one (partition, rows) row.

Modification fields of an import row: timestamp = the snapshot's time, sequence =
the row's number within its partition, lsn = the WAL position when the snapshot was
taken, xid = 0, operation IMPORT, before null.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pg2sink.changelog.batches import ImportTable
from pg2sink.errors import SourceError
from pg2sink.sinks.base import ImportTarget

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["PartitionJob", "write_partition"]


@dataclass(frozen=True)
class PartitionJob:
    """Everything a task needs, sent to every executor (keep it small)."""

    job_id: int
    internal_schema: str
    source_dsn: str = dataclasses.field(repr=False)
    """Secret: never logged; used to mark partitions done."""
    table: ImportTable
    target: ImportTarget = dataclasses.field(repr=False)
    """The sink's import target, after `begin` (may hold secrets: never logged)."""
    partitions: tuple[int, ...]
    """Spark partition index -> the plan's partition number."""


def write_partition(
    job: PartitionJob, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The mapInArrow function of an import (see the module docstring)."""
    import psycopg
    import pyarrow as pa
    from pyspark import TaskContext

    from pg2sink.imports.jobs import mark_partition_done

    context = TaskContext.get()
    assert context is not None, "write_partition runs in a Spark task"
    number = job.partitions[context.partitionId()]
    ancestors = _ancestors()
    rows = job.target.write_rows(job.table, (_as_text(job.table, b) for b in batches))
    if not all(_alive(pid) for pid in ancestors):
        # the JVM that fed this task died: the batches may have ended early (an Arrow
        # stream cut at a batch boundary reads as a clean end), so never mark it done
        raise SourceError(f"the Spark JVM of partition {number} died while it was read")
    with psycopg.connect(
        job.source_dsn, autocommit=True, application_name="pg2sink import"
    ) as conn:
        mark_partition_done(conn, job.internal_schema, job.job_id, number, rows)
    yield pa.RecordBatch.from_pydict(
        {"partition": [number], "rows": [rows]},
        schema=pa.schema([("partition", pa.int32()), ("rows", pa.int64())]),
    )


def _ancestors() -> list[int]:
    """The worker's parent and grandparent: Spark's Python daemon and the JVM that
    forked it (or the JVM itself); the ones still to be alive when the task ends."""
    parent = os.getppid()
    out = [parent]
    try:
        stat = Path(f"/proc/{parent}/stat").read_text()
        out.append(int(stat.rsplit(")", 1)[1].split()[1]))
    except (OSError, ValueError, IndexError):  # not Linux: the parent alone
        pass
    return [pid for pid in out if pid > 1]


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (exists and is not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _as_text(table: ImportTable, batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with its binary columns as string columns (the same buffers): Spark
    reads PostgreSQL's text as bytes (reads.binary_schema). The bytes are checked to be
    UTF-8, as pgjdbc's decoding did (a SQL_ASCII database can hold anything)."""
    import pyarrow as pa

    columns = []
    for i, column in enumerate(batch.columns):
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            large = pa.types.is_large_binary(column.type)
            column = column.view(pa.large_string() if large else pa.string())
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                raise SourceError(
                    f"import of {table.schema.namespace}.{table.schema.name}: column "
                    f"{table.names[i]} holds text that is not valid UTF-8"
                ) from None
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)
