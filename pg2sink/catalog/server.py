"""Connecting to PostgreSQL and checking that it can do logical replication.

Every check turns a server-side problem into one actionable line (a
ServerConfigError) before streaming starts, instead of an obscure failure
later in the replication protocol.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.errors import ConnectError, ServerConfigError
from pg2sink.sensitive import SecretDsn

log = logging.getLogger(__name__)

#: Oldest supported server: 13 is out of the PostgreSQL community's support, and 14 is the
#: oldest pg2sink is tested on (streaming of in-progress transactions, pgoutput protocol 2,
#: pg_replication_slots.wal_status; what differs from 14 to 18 is asked of the server
#: where it matters, docs/postgresql.md).
MIN_SERVER_VERSION = 140000

#: Settings of the replication session. pgoutput renders column values with
#: the walsender's output functions, so these GUCs fix the text forms the
#: value decoders parse: ISO dates, UTC offsets, round-trip floats, hex bytea.
#: https://www.postgresql.org/docs/current/runtime-config-client.html
REPLICATION_SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}


def _session_options() -> str:
    return " ".join(f"-c {k}={v}" for k, v in REPLICATION_SESSION_SETTINGS.items())


def connect(
    dsn: SecretDsn, *, replication: bool = False, application_name: str = "pg2sink"
) -> psycopg.Connection[TupleRow]:
    """Open an autocommit connection; ConnectError with a redacted, one-line reason."""
    kwargs: dict[str, Any] = {"autocommit": True, "application_name": application_name}
    if replication:
        kwargs["replication"] = "database"
        kwargs["options"] = _session_options()
    try:
        return psycopg.connect(dsn.reveal(), **kwargs)
    except psycopg.OperationalError as e:
        reason = " ".join(str(e).split())
        pw = dsn.password
        if pw:
            reason = reason.replace(pw, "***")
        raise ConnectError(
            f"cannot connect to PostgreSQL ({dsn.redacted()}): {reason}. "
            "Check --source / PG2SINK_SOURCE or the PGHOST, PGPORT, PGUSER, PGDATABASE variables."
        ) from None


def check_server(conn: psycopg.Connection[TupleRow]) -> None:
    """Refuse servers that cannot stream: old versions, wal_level, role privileges."""
    version = conn.info.server_version
    if version < MIN_SERVER_VERSION:
        raise ServerConfigError(
            f"PostgreSQL {version // 10000} is out of support: pg2sink needs PostgreSQL 14 "
            "or newer (14 to 18 are tested)"
        )
    row = conn.execute(
        "SELECT current_setting('wal_level'), r.rolreplication, r.rolsuper, current_user,"
        " current_setting('max_replication_slots')::int"
        " FROM pg_roles r WHERE r.rolname = current_user"
    ).fetchone()
    assert row is not None
    wal_level, can_replicate, is_super, user, max_slots = row
    if wal_level != "logical":
        raise ServerConfigError(
            f"wal_level is '{wal_level}' but logical replication needs 'logical': "
            "set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) "
            "and restart PostgreSQL"
        )
    if not (can_replicate or is_super):
        raise ServerConfigError(
            f"role {user!r} may not use replication: run ALTER ROLE {user} REPLICATION "
            "as a superuser (and grant it ownership of the published tables)"
        )
    if max_slots == 0:
        raise ServerConfigError(
            "max_replication_slots is 0: set it to at least 1 in postgresql.conf and restart"
        )


def primary_key_columns(conn: psycopg.Connection[TupleRow], relid: int) -> tuple[str, ...]:
    """Names of the primary-key columns of a table, in key order (empty when none)."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i"
        " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
        " WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord",
        (relid,),
    ).fetchall()
    return tuple(r[0] for r in rows)


#: The first version that keeps a non-volatile ADD COLUMN default as the column's missing
#: value instead of rewriting the table (pg_attribute.atthasmissing).
MISSING_VALUES_VERSION = 110000


def missing_values(conn: psycopg.Connection[TupleRow], relid: int) -> dict[str, str]:
    """Per column of the table that has one, its missing value's text output: what rows
    stored before `ALTER TABLE ... ADD COLUMN ... DEFAULT` read in that column, as no
    change of them is logged (pg_attribute.attmissingval; cleared when the table is
    rewritten, which writes the value into the rows).

    The text is rendered under the replication session's settings, so the value decoders
    read it as they read pgoutput's. attmissingval is a one-element array of the column's
    type; array_to_string gives that element's own text (an array column's element is
    the whole array).
    https://www.postgresql.org/docs/current/catalog-pg-attribute.html
    """
    if conn.info.server_version < MISSING_VALUES_VERSION:
        return {}
    # most tables have none: one round trip tells, where the settings and the rendering
    # below take eight (a stream that meets 10,000 tables asks this 10,000 times:
    # `make bench-tables`)
    has = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_attribute"
        " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND atthasmissing)",
        (relid,),
    ).fetchone()
    if has is None or not has[0]:
        return {}
    with conn.transaction():
        for name, value in REPLICATION_SESSION_SETTINGS.items():
            conn.execute(
                sql.SQL("SET LOCAL {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )
        rows = conn.execute(
            "SELECT attname, array_to_string(attmissingval, '') FROM pg_attribute"
            " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND atthasmissing",
            (relid,),
        ).fetchall()
    return {name: text for name, text in rows if text is not None}
