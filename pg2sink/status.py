"""`pg2sink status` and `pg2sink import`: the slot, the publication and the import jobs.

Everything comes from the server's catalog and statistics views and the internal
schema, so it works whether or not a pg2sink is running (and from another host): a
readable summary by default, `--json` for scripts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from pg2sink.catalog.server import connect
from pg2sink.config import SourceConfig
from pg2sink.errors import ConfigError
from pg2sink.imports import jobs
from pg2sink.logical.lsn import format_lsn
from pg2sink.publication.manager import (
    PublicationManager,
    publication_exists,
    publication_members,
)
from pg2sink.publication.patterns import TableFilter, parse_table_name, quote_table_name

_SLOT = """
SELECT active, active_pid, confirmed_flush_lsn - '0/0', restart_lsn - '0/0',
       pg_current_wal_lsn() - confirmed_flush_lsn, pg_current_wal_lsn() - restart_lsn,
       wal_status
FROM pg_replication_slots WHERE slot_name = %s
"""


@dataclass
class SlotStatus:
    name: str
    exists: bool
    active: bool = False
    active_pid: int | None = None
    confirmed_lsn: str | None = None
    lag_bytes: int | None = None
    """Server WAL position minus the confirmed position: what pg2sink has yet to confirm."""
    wal_retained_bytes: int | None = None
    """Server WAL position minus restart_lsn: WAL the slot keeps on the server's disk."""
    wal_status: str | None = None


@dataclass
class Status:
    slot: SlotStatus
    publication: str
    publication_exists: bool
    tables: list[str] = field(default_factory=list)
    imports: list[dict[str, Any]] = field(default_factory=list)
    """The publication's import jobs (not expired), oldest first (jobs.Job.as_json)."""
    warnings: list[str] = field(default_factory=list)
    """What is likely a mistake: -t/-T patterns that select no table."""


def slot_status(conn: psycopg.Connection[TupleRow], name: str) -> SlotStatus:
    row = conn.execute(_SLOT, (name,)).fetchone()
    if row is None:
        return SlotStatus(name=name, exists=False)
    active, pid, confirmed, _restart, lag, retained, wal_status = row
    return SlotStatus(
        name=name,
        exists=True,
        active=bool(active),
        active_pid=pid,
        confirmed_lsn=format_lsn(int(confirmed)) if confirmed is not None else None,
        lag_bytes=int(lag) if lag is not None else None,
        wal_retained_bytes=int(retained) if retained is not None else None,
        wal_status=wal_status,
    )


def collect(src: SourceConfig) -> Status:
    conn = connect(src.dsn, application_name="pg2sink status")
    try:
        exists = publication_exists(conn, src.publication)
        tables = [t.qualified for t in publication_members(conn, src.publication)] if exists else []
        return Status(
            slot=slot_status(conn, src.slot),
            publication=src.publication,
            publication_exists=exists,
            tables=tables,
            imports=[
                j.as_json() for j in jobs.list_jobs(conn, src.internal_schema, src.publication)
            ],
            warnings=_pattern_warnings(conn, src),
        )
    finally:
        conn.close()


def _pattern_warnings(conn: psycopg.Connection[TupleRow], src: SourceConfig) -> list[str]:
    table_filter = TableFilter.from_patterns(src.tables, src.exclude_tables)
    if not table_filter.has_patterns():
        return []
    manager = PublicationManager(
        conn, src.publication, src.schemas, table_filter, src.internal_schema
    )
    if manager.selected():
        return []
    return [f"{table_filter.describe()} select no table in schema(s) {', '.join(src.schemas)}"]


def import_jobs(src: SourceConfig, *, include_expired: bool = False) -> list[jobs.Job]:
    """`pg2sink import --list`: the publication's jobs."""
    conn = connect(src.dsn, application_name="pg2sink import")
    try:
        return jobs.list_jobs(
            conn, src.internal_schema, src.publication, include_expired=include_expired
        )
    finally:
        conn.close()


def request_imports(src: SourceConfig, tables: list[str]) -> list[str]:
    """`pg2sink import --table S.T`: a new job per table (its live job expired)."""
    from pg2sink.imports.migrate import apply_migrations

    targets = [parse_table_name(name) for name in tables]
    conn = connect(src.dsn, application_name="pg2sink import")
    try:
        published = {(t.schema, t.name) for t in publication_members(conn, src.publication)}
        for schema, table in targets:
            if (schema, table) not in published:
                raise ConfigError(
                    f"table {quote_table_name(schema, table)} is not in publication "
                    f"{src.publication}: pg2sink imports published tables only"
                    + _spelling_hint(schema, table, published)
                )
        apply_migrations(src.dsn, src.internal_schema)
        out = []
        for schema, table in targets:
            job_id = jobs.request_import(conn, src.internal_schema, src.publication, schema, table)
            out.append(f"import job {job_id} created for {quote_table_name(schema, table)}")
        return out
    finally:
        conn.close()


def _spelling_hint(schema: str, table: str, published: set[tuple[str, str]]) -> str:
    """Unquoted names fold to lower case: name the published table differing in case."""
    same = [p for p in published if (p[0].lower(), p[1].lower()) == (schema, table)]
    return f" (did you mean {quote_table_name(*same[0])}?)" if same else ""


def render_jobs(found: list[jobs.Job]) -> list[str]:
    """One line per job: id, table, state, rows, partitions, error and next attempt."""
    return _job_lines([j.as_json() for j in found])


def _job_lines(found: list[dict[str, Any]]) -> list[str]:
    if not found:
        return ["imports: none"]
    lines = [f"imports: {len(found)} jobs"]
    for j in found:
        line = (
            f"  #{j['id']} {j['schema']}.{j['table']}: {j['state']}, {j['rows_processed']} rows"
            + (f" of ~{j['rows_estimated']}" if j["rows_estimated"] is not None else "")
            + (f", {j['partitions_done']}/{j['partitions']} partitions" if j["partitions"] else "")
            + f", attempts {j['attempts']}"
        )
        if j["state"] == "failed":
            line += (
                f", {j['error_count']} errors, next attempt {j['next_attempt_at']}"
                f"; last error: {j['error']}"
            )
        lines.append(line)
    return lines


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def render(status: Status) -> str:
    """The readable form: one line per fact, tables indented."""
    s = status.slot
    if not s.exists:
        slot = f"slot {s.name}: does not exist (pg2sink stream creates it)"
    else:
        state = f"active (pid {s.active_pid})" if s.active else "inactive"
        slot = (
            f"slot {s.name}: {state}, confirmed {s.confirmed_lsn}, "
            f"lag {_size(s.lag_bytes)}, WAL retained {_size(s.wal_retained_bytes)}"
            + (f" ({s.wal_status})" if s.wal_status else "")
        )
    lines = [slot]
    if s.exists and s.confirmed_lsn is not None:
        # the WAL after the confirmed position is what the slot can send again: with
        # --wal-retain, the retained window (docs/replay.md)
        lines.append(
            f"  replay window: from {s.confirmed_lsn}, {_size(s.lag_bytes)} of WAL "
            "(pg2sink replay --since LSN|DURATION)"
        )
    if status.publication_exists:
        lines.append(f"publication {status.publication}: {len(status.tables)} tables")
        lines += [f"  {t}" for t in status.tables]
    else:
        lines.append(f"publication {status.publication}: does not exist")
    lines += [f"warning: {w}" for w in status.warnings]
    lines += _job_lines(status.imports)
    return "\n".join(lines)


def as_json(status: Status) -> dict[str, Any]:
    return asdict(status)
