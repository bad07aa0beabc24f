"""A real primary and a hot standby of it, for the high-availability tests.

Both are scripts/services.py clusters of one PostgreSQL major. The standby is made as a
user would without pg_basebackup (the npm server builds have none, and Debian's 15
cannot back up a newer major): the primary's physical slot for it, then the low-level
backup API (pg_backup_start, a copy of the data directory, pg_backup_stop and its
backup_label), standby.signal, and primary_conninfo / primary_slot_name.
https://www.postgresql.org/docs/current/continuous-archiving.html#BACKUP-LOWLEVEL-BASE-BACKUP
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import services

#: The standby's physical slot on the primary.
PHYSICAL_SLOT = "standby_1"
#: What the copy of the primary's data directory leaves out: the server's own runtime
#: files, its WAL (the standby streams it through the slot) and its slots.
_NOT_COPIED = ("postmaster.pid", "postmaster.opts", "pg_wal", "pg_replslot", "pg_stat_tmp")


@dataclass
class Pair:
    primary: services.Postgres
    standby: services.Postgres

    def dsn(self, which: services.Postgres, dbname: str) -> str:
        return which.dsn(dbname)

    def both(self, dbname: str) -> str:
        """A multi-host DSN: whichever of the two accepts writes."""
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} "
            f"user=postgres dbname={dbname} target_session_attrs=read-write"
        )

    def create_database(self, name: str) -> None:
        """A database made on the primary, once the standby has it too."""
        with psycopg.connect(self.primary.dsn("postgres"), autocommit=True) as c:
            c.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        self.wait_replayed()

    def wait_replayed(self, timeout: float = 60.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with psycopg.connect(self.primary.dsn("postgres"), autocommit=True) as c:
            row = c.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
        assert row is not None
        target = int(row[0])
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.standby.dsn("postgres"), autocommit=True) as s:
            while True:
                row = s.execute("SELECT pg_last_wal_replay_lsn() - '0/0'").fetchone()
                if row is not None and row[0] is not None and int(row[0]) >= target:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError("the standby did not replay the primary's WAL")
                time.sleep(0.05)


def _copy(src: str, dst: str) -> None:
    """shutil.copy2, except for a file the running primary removed meanwhile."""
    with contextlib.suppress(FileNotFoundError):
        shutil.copy2(src, dst)


def base_backup(primary: services.Postgres, dest: Path) -> None:
    """A copy of the running primary's data directory in `dest` that starts as a
    consistent standby (its backup_label says from where)."""
    with psycopg.connect(primary.dsn("postgres"), autocommit=True) as c:
        c.execute("SELECT pg_backup_start('pg2sink-test', true)")
        try:
            shutil.copytree(
                primary.data,
                dest,
                ignore=lambda d, names: (
                    [n for n in names if n in _NOT_COPIED] if Path(d) == primary.data else []
                ),
                copy_function=_copy,
            )
        finally:
            row = c.execute("SELECT labelfile FROM pg_backup_stop(false)").fetchone()
    assert row is not None
    (dest / "backup_label").write_text(row[0])
    for empty in ("pg_wal/archive_status", "pg_wal/summaries", "pg_replslot", "pg_stat_tmp"):
        (dest / empty).mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def standby_pair(
    version: int,
    *,
    primary_settings: dict[str, str] | None = None,
    standby_settings: dict[str, str] | None = None,
) -> Iterator[Pair]:
    """A primary and its hot standby (hot_standby_feedback on, through its physical slot),
    both of `version`; removed at the end."""
    root = Path(tempfile.mkdtemp(prefix=f"pg2sink-ha{version}-"))
    root.chmod(0o755)  # the servers may run as the postgres user (see services.py)
    primary = services.Postgres(
        base=root / "primary",
        port=services.free_port(),
        version=version,
        settings=dict(primary_settings or {}),
    )
    standby: services.Postgres | None = None
    try:
        primary.start()
        with psycopg.connect(primary.dsn("postgres"), autocommit=True) as c:
            c.execute("SELECT pg_create_physical_replication_slot(%s, true)", (PHYSICAL_SLOT,))
        standby = services.Postgres(
            base=root / "standby",
            port=services.free_port(),
            version=version,
            settings={
                "hot_standby": "on",
                # a dbname: the slot sync worker (17+) connects to a database
                "primary_conninfo": f"{primary.dsn('postgres')} application_name=standby_1",
                "primary_slot_name": PHYSICAL_SLOT,
                **(standby_settings or {}),
            },
        )
        standby.base.mkdir(parents=True)
        base_backup(primary, standby.data)
        (standby.data / "standby.signal").touch()
        # in the configuration file, not on the command line: ALTER SYSTEM (a test
        # turning it off) overrides the file
        with open(standby.data / "postgresql.conf", "a") as conf:
            conf.write("\nhot_standby_feedback = on\n")
        standby.start()
        pair = Pair(primary, standby)
        pair.wait_replayed()
        yield pair
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()
        shutil.rmtree(root, ignore_errors=True)
