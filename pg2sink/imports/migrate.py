"""The internal schema: yoyo-migrations from migrations/, under a configurable schema name.

pg2sink creates the schema (`--internal-schema`, default `pg2sink`) itself, then runs
yoyo on a psycopg connection whose search_path is that schema only: the SQL files use
unqualified names and yoyo's bookkeeping tables land in the same schema, so two
internal schemas in one database (two pg2sink deployments) never mix. yoyo's own lock
(a row holding a pid) would outlive a `kill -9`; a session advisory lock replaces it,
released by PostgreSQL when the session ends however it ends.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.catalog.server import connect
from pg2sink.config import SecretDsn
from pg2sink.errors import ConfigError, ServerConfigError

log = logging.getLogger(__name__)
# yoyo logs every step at INFO; pg2sink logs one line per migration applied instead
logging.getLogger("yoyo").setLevel(logging.WARNING)

try:
    from yoyo import read_migrations  # type: ignore[import-untyped]
    from yoyo.backends.core.postgresql import (  # type: ignore[import-untyped]
        PostgresqlPsycopgBackend,
    )
    from yoyo.connections import parse_uri  # type: ignore[import-untyped]
except ImportError as e:  # pragma: no cover - yoyo-migrations is a main dependency
    raise ImportError(f"pg2sink needs yoyo-migrations (pip install yoyo-migrations): {e}") from e


def migrations_dir() -> Path:
    """The SQL migrations: the package pg2sink._migrations of a wheel (setup.py packages
    migrations/ under that name), else migrations/ of a checkout or an editable install."""
    package = Path(__file__).resolve().parent.parent
    candidates = (package / "_migrations", package.parent / "migrations")
    for path in candidates:
        if any(path.glob("*.sql")):
            return path
    # yoyo would apply nothing, and the stream would stop later on a missing table
    raise ConfigError(
        "pg2sink is installed without its SQL migrations (none in "
        + " or ".join(str(p) for p in candidates)
        + "): reinstall it from a wheel or a checkout"
    )


class _Backend(PostgresqlPsycopgBackend):  # type: ignore[misc]
    """yoyo's psycopg 3 backend on a connection pg2sink opens (libpq DSN, secrets kept)."""

    dsn: SecretDsn
    internal_schema: str

    def connect(self, dburi: Any) -> psycopg.Connection[TupleRow]:
        return connect(self.dsn, application_name="pg2sink migrate")

    def init_connection(self, connection: psycopg.Connection[TupleRow]) -> None:
        # session-level (autocommit): survives yoyo's COMMIT/ROLLBACK statements
        connection.execute(
            sql.SQL("SET search_path TO {}").format(sql.Identifier(self.internal_schema))
        )

    @contextmanager
    def lock(self, timeout: int = 10) -> Iterator[None]:
        key = f"pg2sink.migrate.{self.internal_schema}"
        conn = self.connection
        conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


def _backend(dsn: SecretDsn, internal_schema: str) -> Any:
    cls = type("_Backend", (_Backend,), {"dsn": dsn, "internal_schema": internal_schema})
    # yoyo keys a cache on the URI: give it one naming the schema and no secret
    backend = cls(parse_uri(f"postgresql+psycopg://pg2sink/{internal_schema}"), "_yoyo_migration")
    backend.init_database()
    return backend


def apply_migrations(dsn: SecretDsn, internal_schema: str) -> list[str]:
    """Create the internal schema if missing and apply pending migrations; their ids."""
    if not internal_schema:
        raise ConfigError("--internal-schema must not be empty")
    conn = connect(dsn, application_name="pg2sink migrate")
    try:
        conn.execute(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(internal_schema))
        )
    except psycopg.errors.InsufficientPrivilege as e:
        raise ServerConfigError(
            f"cannot create the internal schema {internal_schema!r}: "
            f"{e.diag.message_primary}; the role needs CREATE on the database"
        ) from None
    finally:
        conn.close()
    backend = _backend(dsn, internal_schema)
    try:
        migrations = read_migrations(str(migrations_dir()))
        with backend.lock():
            pending = backend.to_apply(migrations)
            backend.apply_migrations(pending)
        applied = [m.id for m in pending]
    finally:
        backend.connection.close()
    for mid in applied:
        log.info("applied migration %s to schema %s", mid, internal_schema)
    return applied


#: Prefix of the logical decoding messages --capture-ddl emits.
DDL_PREFIX = "pg2sink.ddl"
#: Migration 0003's registry of the slots that use the --capture-ddl event trigger.
_DDL_USERS = "ddl_capture_users"


def set_capture_ddl(
    dsn: SecretDsn, internal_schema: str, slot: str, publication: str, enabled: bool
) -> bool:
    """Register `slot` as a user of the event trigger that emits each DDL statement as a
    `pg2sink.ddl` message (enabled), or unregister it; whether the trigger was created
    (for its first user) or dropped (after its last).

    Event triggers are per database and several pg2sink instances may share one, so the
    trigger exists while migration 0003's registry holds a slot (0002 has its function).
    A trigger nobody registered (made by hand, or by a pg2sink older than the registry)
    is left alone: whoever uses it is unknown.
    """
    conn = connect(dsn, application_name="pg2sink")
    try:
        with conn.transaction():
            if not _lock_ddl_users(conn, internal_schema):
                return False  # never migrated (a drop): nobody registered
            if enabled:
                return _register_ddl_user(conn, internal_schema, slot, publication)
            return _unregister_ddl_user(conn, internal_schema, slot)
    except psycopg.errors.InsufficientPrivilege as e:
        if not enabled:  # the transaction rolled back: the slot stays registered
            log.warning("DDL capture stays on: %s", e.diag.message_primary)
            return False
        raise ServerConfigError(
            f"--capture-ddl: {e.diag.message_primary}; event triggers need a superuser"
        ) from None
    finally:
        conn.close()


def _lock_ddl_users(conn: psycopg.Connection[TupleRow], internal_schema: str) -> bool:
    """Lock the registry until the transaction ends (a registration and the last
    unregistration never interleave); False when it does not exist."""
    found = conn.execute(
        "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = %s",
        (internal_schema, _DDL_USERS),
    ).fetchone()
    if found is None:
        return False
    conn.execute(
        sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(
            sql.Identifier(internal_schema, _DDL_USERS)
        )
    )
    return True


def _ddl_trigger_exists(conn: psycopg.Connection[TupleRow], internal_schema: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_event_trigger WHERE evtname = %s", (_ddl_trigger(internal_schema),)
    ).fetchone()
    return row is not None


def _ddl_trigger(internal_schema: str) -> str:
    return f"{internal_schema}_capture_ddl"


def _register_ddl_user(
    conn: psycopg.Connection[TupleRow], internal_schema: str, slot: str, publication: str
) -> bool:
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (slot_name, publication) VALUES (%s, %s)"
            " ON CONFLICT (slot_name) DO UPDATE SET publication = EXCLUDED.publication"
        ).format(sql.Identifier(internal_schema, _DDL_USERS)),
        (slot, publication),
    )
    if _ddl_trigger_exists(conn, internal_schema):
        return False
    conn.execute(
        sql.SQL("CREATE EVENT TRIGGER {} ON ddl_command_end EXECUTE FUNCTION {}()").format(
            sql.Identifier(_ddl_trigger(internal_schema)),
            sql.Identifier(internal_schema, "capture_ddl"),
        )
    )
    log.info("DDL capture on: each DDL statement is a %s message", DDL_PREFIX)
    return True


def _unregister_ddl_user(
    conn: psycopg.Connection[TupleRow], internal_schema: str, slot: str
) -> bool:
    users = sql.Identifier(internal_schema, _DDL_USERS)
    removed = conn.execute(
        sql.SQL("DELETE FROM {} WHERE slot_name = %s").format(users), (slot,)
    ).rowcount
    if not removed:
        return False  # not a user: someone else's trigger is not ours to stop
    others = [
        r[0] for r in conn.execute(sql.SQL("SELECT slot_name FROM {} ORDER BY 1").format(users))
    ]
    if others:
        log.info("DDL capture stays on for slot(s) %s", ", ".join(others))
        return False
    if not _ddl_trigger_exists(conn, internal_schema):
        return False
    conn.execute(
        sql.SQL("DROP EVENT TRIGGER {}").format(sql.Identifier(_ddl_trigger(internal_schema)))
    )
    log.info("DDL capture off (slot %s was its last user)", slot)
    return True
