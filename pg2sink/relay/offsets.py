"""--relay-exactly-once: the consumed offsets kept in the DuckDB file, in the same DuckDB
transaction as the changes they cover.

The relay writes, before each checkpoint, one row per partition consumed since the last
one into the table `pg2sink_relay.offsets` of the sink (group_id, topic, partition,
next_offset; keyed by the first three), as ordinary records: the DuckDB sink commits a
checkpoint's records and its state row together (sinks/duckdb/sink.py), so the file
holds a source transaction's changes exactly when it holds the offsets past them. At
start the relay reads the view `pg2sink_relay_offsets` (before the sink opens the file)
and starts each partition it is given at the offset stored there, whatever the consumer
group committed: a crash between DuckDB's commit and the group's commit no longer
repeats a batch. The group's offsets are still committed, after the sink acknowledged
(lag monitoring, and the start of a partition the file has no row for).

The raw table `pg2sink_relay_offsets_raw` grows by one row per partition and checkpoint
(a warehouse keeps its history); the view holds the latest per partition.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pg2sink.catalog.types import PgType
from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.changelog.typemap import RowColumn, avro_row_schema, codec_for

__all__ = ["NAME", "NAMESPACE", "OffsetRows", "stored_offsets"]

NAMESPACE = "pg2sink_relay"
NAME = "offsets"
_INT4 = PgType(oid=23, name="int4", namespace="pg_catalog", kind="b", category="N")
_INT8 = PgType(oid=20, name="int8", namespace="pg_catalog", kind="b", category="N")
_TEXT = PgType(oid=25, name="text", namespace="pg_catalog", kind="b", category="S")
_COLUMNS = (
    RowColumn("group_id", codec_for(_TEXT, -1), True),
    RowColumn("topic", codec_for(_TEXT, -1), True),
    RowColumn("partition", codec_for(_INT4, -1), True),
    RowColumn("next_offset", codec_for(_INT8, -1), False),
)
_KEY = ("group_id", "topic", "partition")


class OffsetRows:
    """The records of one group's offsets: the table's Schema record once, then a
    change per partition and checkpoint."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._schema_written = False

    def records(
        self, offsets: dict[tuple[str, int], int], after: int
    ) -> list[Schema | Modification]:
        """The records storing `offsets` ((topic, partition) -> next offset), numbered
        after sequence `after`, the last change's (the DuckDB sink takes a sequence that
        does not grow for a transaction sent again, and drops what it held of it)."""
        if not offsets:
            return []
        now = datetime.now(UTC)
        out: list[Schema | Modification] = []
        if not self._schema_written:
            row = avro_row_schema(NAMESPACE, NAME, _COLUMNS, primary_key=_KEY)
            out.append(Schema(now, 0, NAMESPACE, NAME, row, primary_key=_KEY))
            self._schema_written = True
        for i, ((topic, partition), offset) in enumerate(sorted(offsets.items())):
            row_values: dict[str, object] = {
                "group_id": self.group,
                "topic": topic,
                "partition": partition,
                "next_offset": offset,
            }
            out.append(
                Modification(
                    now, after + 1 + i, 0, 0, Operation.INSERT, NAMESPACE, NAME, None, row_values
                )
            )
        return out


def stored_offsets(path: Path, group: str) -> dict[tuple[str, int], int]:
    """The offsets the DuckDB file at `path` holds for `group` (none for a new file)."""
    if not path.exists():
        return {}
    import duckdb  # the duckdb extra: only with --sink duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        view = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
            [f"{NAMESPACE}_{NAME}"],
        ).fetchone()
        if not view or not view[0]:
            return {}
        rows = con.execute(
            f'SELECT topic, "partition", next_offset FROM {NAMESPACE}_{NAME} WHERE group_id = ?',
            [group],
        ).fetchall()
    finally:
        con.close()
    return {(str(t), int(p)): int(o) for t, p, o in rows}
