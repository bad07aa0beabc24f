"""Generated columns in the publication: publish_generated_columns (PostgreSQL 18+).

Before 18 pgoutput never sends a generated column. From 18 a publication sends the
stored ones when its option publish_generated_columns is `stored`
(--publish-generated-columns), and pg_publication_tables.attnames then lists them, so the
imports (imports/plan.py) read exactly the columns the stream has. Virtual generated
columns (18's default kind) are never published.
https://www.postgresql.org/docs/18/logical-replication-gencols.html
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.errors import ServerConfigError

#: The first version whose publications can publish generated columns.
GENERATED_COLUMNS_VERSION = 180000


def check_generated_server(conn: psycopg.Connection[TupleRow]) -> None:
    """ServerConfigError when --publish-generated-columns is asked of a server before 18
    (at start, before pg2sink writes anything)."""
    version = conn.info.server_version
    if version < GENERATED_COLUMNS_VERSION:
        raise ServerConfigError(
            f"--publish-generated-columns needs PostgreSQL 18 or newer; the server is "
            f"{version // 10000}, whose publications never send generated columns: "
            "drop the flag"
        )


class GeneratedColumns:
    """The publication's publish_generated_columns, kept to what pg2sink was told."""

    def __init__(self, publication: str, stored: bool) -> None:
        self.publication = publication
        #: --publish-generated-columns
        self.stored = stored

    def _check(self, conn: psycopg.Connection[TupleRow]) -> bool:
        """Whether the server has the option; ServerConfigError when it is asked for on a
        server without it."""
        if self.stored:
            check_generated_server(conn)
        return conn.info.server_version >= GENERATED_COLUMNS_VERSION

    def create_option(self, conn: psycopg.Connection[TupleRow]) -> sql.Composable:
        """What CREATE PUBLICATION ... WITH (...) adds for the option (nothing before 18
        or without the flag)."""
        if not self._check(conn) or not self.stored:
            return sql.SQL("")
        return sql.SQL(", publish_generated_columns = stored")

    def align(self, conn: psycopg.Connection[TupleRow]) -> str | None:
        """Set the option of an existing publication to ours; what to log, or None."""
        if not self._check(conn):
            return None
        row = conn.execute(
            "SELECT pubgencols FROM pg_publication WHERE pubname = %s", (self.publication,)
        ).fetchone()
        if row is None or (row[0] == "s") == self.stored:
            return None
        value = sql.SQL("stored" if self.stored else "none")
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} SET (publish_generated_columns = {})").format(
                sql.Identifier(self.publication), value
            )
        )
        return (
            f"publication {self.publication}: publish_generated_columns set to "
            f"{'stored' if self.stored else 'none'}"
        )
