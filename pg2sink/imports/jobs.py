"""The import-job store: rows of `<internal schema>.import_jobs` and `import_partitions`.

A job is created when a table joins the publication (in the same transaction as the
ALTER PUBLICATION, so a crash cannot leave a joined table without its job) or on
request (`pg2sink import --table`, which expires the table's live job first).

Claiming: `claim()` picks the due live jobs with FOR UPDATE SKIP LOCKED (instances never
wait on each other) and takes a session advisory lock on the first it can. The row lock
ends with the short claim transaction; the advisory lock lasts while the engine runs the
job and vanishes with its session, so a `running` job whose lock is free belongs to a
process that died and is resumed by the next claim. Executors update the partitions
(mark_partition_done) without ever waiting for the engine's locks.

States: pending -> running -> done; running -> failed (error recorded, retried at
next_attempt_at with exponential backoff) -> running; pending/running/failed -> expired.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.errors import ImportFailed

if TYPE_CHECKING:
    from pg2sink.imports.snapshot import ExportedSnapshot

log = logging.getLogger(__name__)

#: States in which a job still has work to do.
LIVE_STATES = ("pending", "running", "failed")


@dataclass(frozen=True)
class Backoff:
    """Delay before retrying a failed job: base * factor^(failures - 1), at most `max`."""

    base: float = 10.0
    factor: float = 2.0
    max: float = 600.0

    def delay(self, failures: int) -> float:
        return float(min(self.max, self.base * self.factor ** max(0, failures - 1)))


@dataclass(frozen=True)
class Job:
    """One import job as stored."""

    id: int
    publication: str
    schema: str
    table: str
    reason: str
    state: str
    attempts: int
    rows_processed: int
    rows_estimated: int | None
    error: str | None
    error_count: int
    last_error_at: datetime | None
    next_attempt_at: datetime
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    expired_at: datetime | None
    snapshot: str | None
    snapshot_lsn: str | None
    partitions: int
    partitions_done: int

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.isoformat() if isinstance(value, datetime) else value
        return out


@dataclass(frozen=True)
class Partition:
    number: int
    predicate: str
    done: bool
    rows: int | None


_JOB_COLUMNS = sql.SQL(
    "j.id, j.publication, j.schema_name, j.table_name, j.reason, j.state, j.attempts, "
    "j.rows_processed, j.rows_estimated, j.error, j.error_count, j.last_error_at, "
    "j.next_attempt_at, j.created_at, j.updated_at, j.completed_at, j.expired_at, "
    "j.snapshot::text, j.snapshot_lsn::text, "
    "(SELECT count(*) FROM {parts} p WHERE p.job_id = j.id), "
    "(SELECT count(*) FROM {parts} p WHERE p.job_id = j.id AND p.done)"
)


def _t(schema: str, table: str) -> sql.Identifier:
    return sql.Identifier(schema, table)


def _job(row: TupleRow) -> Job:
    return Job(*row)


def _columns(internal_schema: str) -> sql.Composable:
    return _JOB_COLUMNS.format(parts=_t(internal_schema, "import_partitions"))


def create_jobs(
    conn: psycopg.Connection[Any],
    internal_schema: str,
    publication: str,
    tables: Iterable[tuple[str, str]],
    reason: str = "join",
) -> list[int]:
    """A pending job per (schema, table) that has no live one; ids of those created.

    Runs in the caller's transaction (the publication manager's reconcile)."""
    query = sql.SQL(
        "INSERT INTO {} (publication, schema_name, table_name, reason) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (publication, schema_name, table_name) "
        "WHERE state IN ('pending', 'running', 'failed') DO NOTHING RETURNING id"
    ).format(_t(internal_schema, "import_jobs"))
    ids = []
    for schema, table in tables:
        row = conn.execute(query, (publication, schema, table, reason)).fetchone()
        if row is not None:
            ids.append(int(row[0]))
            log.info("import job %d created for %s.%s (%s)", row[0], schema, table, reason)
    return ids


def expire_jobs(
    conn: psycopg.Connection[Any],
    internal_schema: str,
    publication: str,
    tables: Iterable[tuple[str, str]],
    *,
    done_too: bool = False,
) -> int:
    """Expire the live jobs of these tables (and the done ones with `done_too`); how many."""
    states = ("pending", "running", "failed", "done") if done_too else LIVE_STATES
    query = sql.SQL(
        "UPDATE {} SET state = 'expired', expired_at = now(), updated_at = now() "
        "WHERE publication = %s AND schema_name = %s AND table_name = %s "
        "AND state = ANY(%s)"
    ).format(_t(internal_schema, "import_jobs"))
    n = 0
    for schema, table in tables:
        n += conn.execute(query, (publication, schema, table, list(states))).rowcount
    return n


def request_import(
    conn: psycopg.Connection[Any], internal_schema: str, publication: str, schema: str, table: str
) -> int:
    """`pg2sink import --table`: expire the table's jobs and create a new one."""
    with conn.transaction():
        expire_jobs(conn, internal_schema, publication, [(schema, table)], done_too=True)
        ids = create_jobs(conn, internal_schema, publication, [(schema, table)], "request")
    return ids[0]


def _lock_key(internal_schema: str, job_id: int) -> str:
    return f"pg2sink.import.{internal_schema}.{job_id}"


def claim(conn: psycopg.Connection[Any], internal_schema: str, publication: str) -> Job | None:
    """The next due job, now `running` and locked by `conn`'s session; None if none.

    `conn` must be an autocommit connection that stays open while the job runs."""
    jobs = _t(internal_schema, "import_jobs")
    with conn.transaction():
        rows = conn.execute(
            sql.SQL(
                "SELECT id FROM {} WHERE publication = %s "
                "AND state IN ('pending', 'running', 'failed') AND next_attempt_at <= now() "
                "ORDER BY next_attempt_at, id FOR UPDATE SKIP LOCKED"
            ).format(jobs),
            (publication,),
        ).fetchall()
        for (job_id,) in rows:
            got = conn.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                (_lock_key(internal_schema, job_id),),
            ).fetchone()
            if not got or not got[0]:
                continue  # running in another live process
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = 'running', attempts = attempts + 1, "
                    "started_at = coalesce(started_at, now()), updated_at = now() WHERE id = %s"
                ).format(jobs),
                (job_id,),
            )
            return get_job(conn, internal_schema, job_id)
    return None


def release(conn: psycopg.Connection[Any], internal_schema: str, job_id: int) -> None:
    """Give up the claim's advisory lock (the job's state is left as it is)."""
    conn.execute(
        "SELECT pg_advisory_unlock(hashtextextended(%s, 0))",
        (_lock_key(internal_schema, job_id),),
    )


def get_job(conn: psycopg.Connection[Any], internal_schema: str, job_id: int) -> Job | None:
    row = conn.execute(
        sql.SQL("SELECT {} FROM {} j WHERE j.id = %s").format(
            _columns(internal_schema), _t(internal_schema, "import_jobs")
        ),
        (job_id,),
    ).fetchone()
    return _job(row) if row is not None else None


def list_jobs(
    conn: psycopg.Connection[Any],
    internal_schema: str,
    publication: str | None = None,
    *,
    include_expired: bool = False,
) -> list[Job]:
    """Jobs, oldest first; None when the internal schema does not exist yet."""
    exists = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL",
        (_t(internal_schema, "import_jobs").as_string(conn),),
    ).fetchone()
    if not exists or not exists[0]:
        return []
    where: sql.Composable = sql.SQL("true")
    params: list[Any] = []
    if publication is not None:
        where = sql.SQL("j.publication = %s")
        params.append(publication)
    if not include_expired:
        where = sql.SQL("{} AND j.state <> 'expired'").format(where)
    rows = conn.execute(
        sql.SQL("SELECT {} FROM {} j WHERE {} ORDER BY j.id").format(
            _columns(internal_schema), _t(internal_schema, "import_jobs"), where
        ),
        params,
    ).fetchall()
    return [_job(r) for r in rows]


def record_snapshot(
    conn: psycopg.Connection[Any],
    internal_schema: str,
    job_id: int,
    snap: ExportedSnapshot,
) -> None:
    """Store the job's exported snapshot: its name, visibility, WAL position and time
    (the runner stamps IMPORT records with the last two)."""
    conn.execute(
        sql.SQL(
            "UPDATE {} SET snapshot_name = %s, snapshot = %s::pg_snapshot, "
            "snapshot_lsn = '0/0'::pg_lsn + %s::numeric, snapshot_time = %s, updated_at = now() "
            "WHERE id = %s"
        ).format(_t(internal_schema, "import_jobs")),
        (snap.name, str(snap.visibility), snap.lsn, snap.time, job_id),
    )


def save_partitions(
    conn: psycopg.Connection[Any],
    internal_schema: str,
    job_id: int,
    predicates: Iterable[str],
    rows_estimated: int,
) -> None:
    """Fix the job's partitions (first planning only: a resumed job keeps its own)."""
    parts = _t(internal_schema, "import_partitions")
    with conn.transaction():
        for number, predicate in enumerate(predicates):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (job_id, partition, predicate) VALUES (%s, %s, %s) "
                    "ON CONFLICT DO NOTHING"
                ).format(parts),
                (job_id, number, predicate),
            )
        conn.execute(
            sql.SQL("UPDATE {} SET rows_estimated = %s, updated_at = now() WHERE id = %s").format(
                _t(internal_schema, "import_jobs")
            ),
            (rows_estimated, job_id),
        )


def load_partitions(
    conn: psycopg.Connection[Any], internal_schema: str, job_id: int
) -> list[Partition]:
    rows = conn.execute(
        sql.SQL(
            "SELECT partition, predicate, done, rows FROM {} WHERE job_id = %s ORDER BY partition"
        ).format(_t(internal_schema, "import_partitions")),
        (job_id,),
    ).fetchall()
    return [Partition(int(r[0]), r[1], bool(r[2]), r[3]) for r in rows]


def mark_partition_done(
    conn: psycopg.Connection[Any], internal_schema: str, job_id: int, partition: int, rows: int
) -> None:
    """Partition `partition` of job `job_id` is durable in the sink with `rows` rows.

    Called by the runner's executors after their flush; commits. Marking twice is
    harmless (the second call changes nothing). A `running` job whose engine is gone (its
    advisory lock is free: the process was killed, and this executor outlived it) is not
    marked: ImportFailed. The partition is then read again by the resumed job, whose
    rows follow these in the sink, so the orphan's late rows cannot have the last word.
    """
    with conn.transaction():
        orphan = conn.execute(
            sql.SQL(
                "SELECT j.state = 'running' AND NOT EXISTS (SELECT 1 FROM pg_locks l"
                " WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted"
                " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended(%s, 0))"
                " FROM {} j WHERE j.id = %s"
            ).format(_t(internal_schema, "import_jobs")),
            (_lock_key(internal_schema, job_id), job_id),
        ).fetchone()
        if orphan is not None and orphan[0]:
            raise ImportFailed(
                f"import job {job_id} is no longer run by a live pg2sink: "
                f"partition {partition} not marked done"
            )
        row = conn.execute(
            sql.SQL(
                "UPDATE {} p SET done = true, rows = %s, done_at = now(), attempt = j.attempts "
                "FROM {} j WHERE j.id = p.job_id AND p.job_id = %s AND p.partition = %s "
                "AND NOT p.done RETURNING p.partition"
            ).format(_t(internal_schema, "import_partitions"), _t(internal_schema, "import_jobs")),
            (rows, job_id, partition),
        ).fetchone()
        if row is not None:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET rows_processed = rows_processed + %s, updated_at = now() "
                    "WHERE id = %s"
                ).format(_t(internal_schema, "import_jobs")),
                (rows, job_id),
            )
    if not conn.autocommit:
        conn.commit()


def finish(conn: psycopg.Connection[Any], internal_schema: str, job_id: int) -> None:
    """The job is done (unless it was expired meanwhile: expiry wins)."""
    conn.execute(
        sql.SQL(
            "UPDATE {} SET state = 'done', completed_at = now(), updated_at = now(), "
            "next_attempt_at = now() WHERE id = %s AND state = 'running'"
        ).format(_t(internal_schema, "import_jobs")),
        (job_id,),
    )


def fail(
    conn: psycopg.Connection[Any],
    internal_schema: str,
    job_id: int,
    error: str,
    backoff: Backoff,
) -> float:
    """Record the attempt's error and schedule the next one; the delay in seconds."""
    row = conn.execute(
        sql.SQL("SELECT error_count FROM {} WHERE id = %s").format(
            _t(internal_schema, "import_jobs")
        ),
        (job_id,),
    ).fetchone()
    failures = (int(row[0]) if row else 0) + 1
    delay = backoff.delay(failures)
    conn.execute(
        sql.SQL(
            "UPDATE {} SET state = 'failed', error = %s, error_count = error_count + 1, "
            "last_error_at = now(), updated_at = now(), "
            "next_attempt_at = now() + make_interval(secs => %s) "
            "WHERE id = %s AND state = 'running'"
        ).format(_t(internal_schema, "import_jobs")),
        (error, delay, job_id),
    )
    return delay
