"""`pg2sink status` and `pg2sink import`: the slot, the publication and the import jobs.

Everything comes from the server's catalog and statistics views and the internal
schema, so it works whether or not a pg2sink is running (and from another host): a
readable summary by default, `--json` for scripts.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from pg2sink import options
from pg2sink.catalog.server import connect
from pg2sink.commands.configs import source_config
from pg2sink.config import SourceConfig
from pg2sink.errors import ConfigError
from pg2sink.imports import jobs
from pg2sink.logical.lsn import format_lsn
from pg2sink.observability.position import invalidated_message, slot_health
from pg2sink.publication.manager import PublicationManager
from pg2sink.publication.patterns import TableFilter, parse_table_name, quote_table_name
from pg2sink.publication.published import (
    ACTIONS,
    left_out_warning,
    publication_info,
    publication_members,
)
from pg2sink.routing.check import unmatched_rules
from pg2sink.routing.config import RoutingConfig
from pg2sink.routing.rules import Rules

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
    """reserved, extended, unreserved, or lost (WAL the slot needs was removed)."""
    safe_wal_size: int | None = None
    """Bytes of WAL before the slot risks 'lost'; None when unlimited."""
    inactive_since: str | None = None
    """ISO time since no walsender streams from it (PostgreSQL 17+)."""
    invalidation_reason: str | None = None
    """Why the server invalidated it (observability/position.py); None: valid."""
    conflicting: bool | None = None
    """PostgreSQL 16+: invalidated by a recovery conflict (a slot on a standby)."""
    failover: bool | None = None
    """PostgreSQL 17+: synchronised to standbys."""
    synced: bool | None = None
    """PostgreSQL 17+: a standby's copy of a primary's failover slot."""


@dataclass
class Status:
    slot: SlotStatus
    publication: str
    publication_exists: bool
    tables: list[str] = field(default_factory=list)
    publication_kind: str | None = None
    """FOR TABLE, FOR ALL TABLES or FOR TABLES IN SCHEMA."""
    publication_managed: bool | None = None
    """Whether pg2sink stream keeps its tables (--publication-mode); else uses it as it is."""
    publication_left_out: list[str] = field(default_factory=list)
    """The actions it does not publish (INSERT, UPDATE, DELETE, TRUNCATE)."""
    imports: list[dict[str, Any]] = field(default_factory=list)
    """The publication's import jobs (not expired), oldest first (jobs.Job.as_json)."""
    role: dict[str, Any] = field(default_factory=dict)
    """The connecting role: name, superuser, replication, and `needs_more`, the features
    it cannot have (event triggers need a superuser, as on managed services)."""
    warnings: list[str] = field(default_factory=list)
    """What is likely a mistake: -t/-T patterns that select no table."""


def slot_status(conn: psycopg.Connection[TupleRow], name: str) -> SlotStatus:
    row = conn.execute(_SLOT, (name,)).fetchone()
    if row is None:
        return SlotStatus(name=name, exists=False)
    active, pid, confirmed, _restart, lag, retained, _wal_status = row
    health = slot_health(conn, name)
    if health is None:  # dropped between the two queries
        return SlotStatus(name=name, exists=False)
    return SlotStatus(
        name=name,
        exists=True,
        active=bool(active),
        active_pid=pid,
        confirmed_lsn=format_lsn(int(confirmed)) if confirmed is not None else None,
        lag_bytes=int(lag) if lag is not None else None,
        wal_retained_bytes=int(retained) if retained is not None else None,
        wal_status=health.wal_status,
        safe_wal_size=health.safe_wal_size,
        inactive_since=health.inactive_since.isoformat() if health.inactive_since else None,
        invalidation_reason=health.invalidation_reason,
        conflicting=health.conflicting,
        failover=health.failover,
        synced=health.synced,
    )


def collect(src: SourceConfig, rules: Rules | None = None) -> Status:
    """The status of `src`'s slot, publication, role and imports; `rules` (the stream's
    routing options) adds a warning per rule that matches no published table or column."""
    conn = connect(src.dsn, application_name="pg2sink status")
    try:
        manager = PublicationManager(
            conn,
            src.publication,
            src.schemas,
            TableFilter.from_patterns(src.tables, src.exclude_tables),
            src.internal_schema,
            mode=src.publication_mode,
        )
        info = publication_info(conn, src.publication)
        members = (
            publication_members(conn, src.publication, src.internal_schema)
            if info is not None
            else []
        )
        warnings = _pattern_warnings(manager)
        if rules is not None:
            warnings += unmatched_rules(conn, rules, [t.oid for t in members], strict=False)
        status = Status(
            slot=slot_status(conn, src.slot),
            publication=src.publication,
            publication_exists=info is not None,
            tables=[t.qualified for t in members],
            imports=[
                j.as_json() for j in jobs.list_jobs(conn, src.internal_schema, src.publication)
            ],
            warnings=warnings,
        )
        if info is not None:
            status.publication_kind = info.kind
            try:
                status.publication_managed = manager.manages(info)
            except ConfigError as e:  # --publication-mode manage of a FOR ALL TABLES one
                warnings.append(str(e))
            status.publication_left_out = list(info.left_out)
            line = left_out_warning(src.publication, info)
            if line is not None:
                warnings.append(line)
        status.role = role_status(conn, src.internal_schema)
        warnings += status.role["needs_more"]
        if status.slot.invalidation_reason is not None:
            warnings.append(invalidated_message(src.slot, status.slot.invalidation_reason))
        return status
    finally:
        conn.close()


#: the event triggers pg2sink may create, by name suffix after the internal schema's
#: name: what each gives (migrate.set_capture_ddl, publication/columns.py)
_EVENT_TRIGGERS = (
    ("_capture_ddl", "--capture-ddl (DDL statements as messages) is off"),
    (
        "_column_lists",
        "--exclude-column cannot use publication column lists: excluded values reach "
        "pg2sink, which drops them before any sink",
    ),
)


def role_status(conn: psycopg.Connection[TupleRow], internal_schema: str) -> dict[str, Any]:
    """The role's rights, and a line per feature that needs more than it has: an event
    trigger a superuser has not created (pg2sink makes them only as one)."""
    row = conn.execute(
        "SELECT current_user, rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    assert row is not None
    user, superuser, replication = row
    needs_more: list[str] = []
    if not superuser:
        have = {
            r[0]
            for r in conn.execute(
                "SELECT evtname FROM pg_event_trigger WHERE evtname = ANY(%s)",
                ([internal_schema + suffix for suffix, _ in _EVENT_TRIGGERS],),
            )
        }
        needs_more = [
            f"role {user} is not a superuser, who alone creates event triggers: {what}"
            for suffix, what in _EVENT_TRIGGERS
            if internal_schema + suffix not in have
        ]
    return {
        "name": user,
        "superuser": bool(superuser),
        "replication": bool(replication),
        "needs_more": needs_more,
    }


def _pattern_warnings(manager: PublicationManager) -> list[str]:
    table_filter = manager.filter
    if not table_filter.has_patterns() or manager.selected():
        return []
    return [f"{table_filter.describe()} select no table in schema(s) {', '.join(manager.schemas)}"]


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
    if s.exists:
        lines.append("  health: " + _health(s))
    if s.exists and s.confirmed_lsn is not None:
        # the WAL after the confirmed position is what the slot can send again: with
        # --wal-retain, the retained window (docs/replay.md)
        lines.append(
            f"  replay window: from {s.confirmed_lsn}, {_size(s.lag_bytes)} of WAL "
            "(pg2sink replay --since LSN|DURATION)"
        )
    if status.publication_exists:
        how = {True: "kept by pg2sink", False: "used as it is", None: "refused"}
        left_out = status.publication_left_out
        lines.append(
            f"publication {status.publication} ({status.publication_kind}, "
            f"{how[status.publication_managed]}): {len(status.tables)} tables; publishes "
            + (", ".join(a.upper() for a in ACTIONS if a.upper() not in left_out) or "nothing")
            + (f" (not {', '.join(left_out)})" if left_out else "")
        )
        lines += [f"  {t}" for t in status.tables]
    else:
        lines.append(f"publication {status.publication}: does not exist")
    role = status.role
    if role:
        rights = "superuser" if role["superuser"] else "not superuser"
        rights += ", replication" if role["replication"] else ", no replication"
        lines.append(f"role {role['name']}: {rights}")
    lines += [f"warning: {w}" for w in status.warnings]
    lines += _job_lines(status.imports)
    return "\n".join(lines)


def _health(s: SlotStatus) -> str:
    """The slot's health in one line: valid or why not, WAL status and margin."""
    parts = [f"invalidated ({s.invalidation_reason})" if s.invalidation_reason else "valid"]
    if s.wal_status:
        parts.append(f"wal_status {s.wal_status}")
    parts.append(
        f"safe_wal_size {_size(s.safe_wal_size)}"
        if s.safe_wal_size is not None
        else "safe_wal_size unlimited"
    )
    if s.inactive_since:
        parts.append(f"inactive since {s.inactive_since}")
    if s.conflicting:
        parts.append("conflicting")
    if s.failover is not None:
        parts.append(f"failover {'on' if s.failover else 'off'}" + (", synced" if s.synced else ""))
    return ", ".join(parts)


def as_json(status: Status) -> dict[str, Any]:
    return asdict(status)


def run_status(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> None:
    """`pg2sink status`: as text, or one JSON object with --json."""
    rules = options.build(RoutingConfig, args).rules()
    result = collect(source_config(args), rules)
    if args.json:
        print(json.dumps(as_json(result), indent=2))
    else:
        print(render(result))


def run_import(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> None:
    """`pg2sink import`: the tables' imports requested again, or the jobs listed."""
    src = source_config(args)
    if args.list or not args.import_tables:
        if not args.list:
            raise ConfigError("pg2sink import needs --table SCHEMA.TABLE or --list")
        found = import_jobs(src, include_expired=args.all)
        if args.json:
            print(json.dumps([j.as_json() for j in found], indent=2))
        else:
            print("\n".join(render_jobs(found)))
        return
    for line in request_imports(src, args.import_tables):
        print(line)
