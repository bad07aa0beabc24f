"""The fixed workload of the golden tests: which tables, which changes, in which order.

`SCHEMA` is created before pg2sink (or the capture) streams; `CHANGES` run afterwards,
each string one transaction (autocommit), so the records come in this order:

1. fidelity (the type zoo of tests/test_type_fidelity.py: a column per built-in type
   and one per array of it, REPLICA IDENTITY DEFAULT): its seven rows in one INSERT
   transaction (every column NULL where the zoo has no value for the row), after a
   rolled-back savepoint large enough to be streamed (--streaming); an UPDATE
   that changes the key (old key tuple 'K'); a DELETE (old key); then, under REPLICA
   IDENTITY FULL (a Relation again, the same Schema), an UPDATE with whole before images.
2. native: the types the C Avro encoder writes (changelog/_avro_native.c), with values
   it writes and values it declines (infinity, BC, NaN, several dimensions); an UPDATE
   without old tuple (the C path), a DELETE; a transactional logical message.
3. toasty (REPLICA IDENTITY DEFAULT, `big` stored out of line uncompressed): INSERT,
   an UPDATE leaving the TOASTed value unchanged (the marker), DDL (ADD COLUMN: a new
   Schema record) and an UPDATE of the new shape.
4. nokey (no primary key, REPLICA IDENTITY FULL): INSERT, UPDATE (the unchanged TOAST
   value filled from the old row), DELETE; a non-transactional logical message.
5. TRUNCATE of two tables with both options.

No value depends on the clock or the server (no now(), no OIDs): only the LSNs, xids
and commit times of the records differ between runs (normalize.py).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from tests.test_type_fidelity import SETUP, create_fidelity_table, insert_fidelity_rows

#: the prefix of the workload's logical decoding messages (pg2sink --messages)
MESSAGE_PREFIX = "golden"
#: the prefix of the non-transactional message that ends the capture (not in the output)
END_PREFIX = "golden-end"

# A value that PostgreSQL keeps out of line: over TOAST_TUPLE_THRESHOLD (~2 kB) and, with
# STORAGE EXTERNAL, not compressed into the row. Deterministic, and small enough for the
# golden files.
_BIG = "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 80) i)"

_NATIVE_COLUMNS = (
    "id int8 PRIMARY KEY, name text, amount numeric(12,2), at timestamptz, flag bool,"
    " doc jsonb, day date, t time, ts timestamp, f4 float4, f8 float8, raw bytea, u uuid,"
    " n numeric, ints int4[], days date[], mood mood"
)
_NATIVE_ROWS = [
    "1, 'plain', 12.50, '2024-05-01 10:00:00.000001+00', true, '{\"a\": [1, 2.50]}',"
    " '2024-02-29', '12:34:56.5', '2024-05-01 10:00:00', 1.5, 0.1, '\\x00ff',"
    " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 0.00000001, '{1,NULL,-3}', '{2024-01-01}', 'ok'",
    "2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL",
    # values the C encoder declines: the Python path writes them (same bytes either way)
    "3, E'quote\" back\\\\slash', 'NaN', 'infinity', false, 'null', '0044-03-15 BC',"
    " '24:00:00', '-infinity', 'NaN', '-0', '', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',"
    " 'Infinity', '{{1,2},{3,4}}', '{infinity}', 'with space'",
]

SCHEMA: list[str] = [
    *SETUP,  # citext, enum mood, domains, composite types, and the table toasty
    "ALTER TABLE toasty ALTER big SET STORAGE EXTERNAL",
    f"CREATE TABLE native ({_NATIVE_COLUMNS})",
    "CREATE TABLE nokey (label text, big text, n int)",
    "ALTER TABLE nokey ALTER big SET STORAGE EXTERNAL",
    "ALTER TABLE nokey REPLICA IDENTITY FULL",
    # never published: its rows only make the first transaction large (STREAMED_SIZE)
    "CREATE TABLE scratch (n int)",
]

CHANGES: list[str] = [
    # 1. fidelity: its INSERTs come first (insert_fidelity_rows)
    "UPDATE fidelity SET id = 100 WHERE id = 0",
    "DELETE FROM fidelity WHERE id = 1",
    "ALTER TABLE fidelity REPLICA IDENTITY FULL",
    "UPDATE fidelity SET c_text = 'changed' WHERE id = 2",
    # 2. native
    "BEGIN; "
    + " ".join(f"INSERT INTO native VALUES ({row});" for row in _NATIVE_ROWS)
    + f" SELECT pg_logical_emit_message(true, '{MESSAGE_PREFIX}', 'in a transaction');"
    " COMMIT",
    "UPDATE native SET name = 'renamed', ints = '{7}' WHERE id IN (1, 3)",
    "DELETE FROM native WHERE id = 2",
    # 3. toasty
    f"INSERT INTO toasty VALUES (1, {_BIG}, 1)",
    "UPDATE toasty SET n = 2 WHERE id = 1",
    "ALTER TABLE toasty ADD COLUMN note varchar(10)",
    "UPDATE toasty SET note = 'new shape' WHERE id = 1",
    # 4. nokey
    f"INSERT INTO nokey VALUES ('a', {_BIG}, 1), (NULL, NULL, NULL)",
    "UPDATE nokey SET n = 2 WHERE label = 'a'",
    "DELETE FROM nokey WHERE label IS NULL",
    f"SELECT pg_logical_emit_message(false, '{MESSAGE_PREFIX}', '\\x00ff'::bytea)",
    # 5. TRUNCATE
    "TRUNCATE toasty, nokey RESTART IDENTITY CASCADE",
]

#: the tables pg2sink streams (all of the workload's but scratch)
TABLES = ("fidelity", "native", "toasty", "nokey")
#: the table that is not published (pg2sink: -T)
UNPUBLISHED = "public.scratch"
#: logical_decoding_work_mem under which the first transaction is streamed (the minimum)
STREAMED_SIZE = "64kB"


def create_schema(conn: psycopg.Connection[Any]) -> None:
    """Types and tables, before streaming starts."""
    for statement in SCHEMA:
        conn.execute(sql.SQL(statement))
    create_fidelity_table(conn)


def run_changes(conn: psycopg.Connection[Any], end_marker: bool = False) -> None:
    """Every change of the workload, in order; with `end_marker`, then a message that
    tells a capture the workload is over."""
    with conn.transaction():
        # a subtransaction that outgrows logical_decoding_work_mem (STREAMED_SIZE), so a
        # server asked to stream (--streaming) sends it while it runs, then aborts it
        conn.execute("SAVEPOINT streamed")
        conn.execute("INSERT INTO fidelity (id) VALUES (99)")
        conn.execute("INSERT INTO scratch SELECT generate_series(1, 1000)")
        conn.execute("ROLLBACK TO SAVEPOINT streamed")
        insert_fidelity_rows(conn)
    for statement in CHANGES:
        conn.execute(sql.SQL(statement))
    if end_marker:
        conn.execute("SELECT pg_logical_emit_message(false, %s, '')", (END_PREFIX,))
