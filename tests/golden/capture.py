"""Capture the golden input from a real PostgreSQL, and write the golden output from it.

    .venv/bin/python -m tests.golden.capture

starts a throwaway PostgreSQL (scripts/services.py, as the test session does), creates
the workload's schema (workload.py), a publication of its tables and two pgoutput slots,
runs the workload, and reads each slot over a replication connection opened the way
pg2sink opens one (its session settings, --messages' option) until the workload's end
marker: one as pg2sink reads by default, one with --streaming's options (protocol 2,
the database's logical_decoding_work_mem at its minimum, so the first transaction is
streamed while it runs). Then it replays the frames once against the live catalog to
record its answers, and writes data/frames*.bin, data/catalog.json and the output files
(files.py).

Only for a change of the workload or of what the server sends (a new PostgreSQL major
version): the golden output must then be reviewed as new. A change of pg2sink's record
bytes regenerates the output alone (files.py).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

import tests.conftest  # noqa: F401 (puts scripts/ on the path, for services)
from pg2sink.catalog.catalog import Catalog
from pg2sink.catalog.server import connect
from pg2sink.config import SecretDsn
from pg2sink.logical.decoder import MessageTag, decode
from pg2sink.logical.lsn import now_pg_timestamp
from pg2sink.logical.messages import Message
from pg2sink.logical.replication import (
    XLOG_DATA_HEADER,
    PrimaryKeepalive,
    parse_copy_data,
    standby_status_update,
)
from pg2sink.subscription.replication import ReplicationStream
from tests.golden import workload
from tests.golden.files import (
    CATALOG,
    DATA,
    FRAMES,
    FRAMES_STREAMED,
    RecordedCatalog,
    write_catalog,
    write_frames,
)
from tests.golden.pipeline import OUTPUTS, STREAMED, Input, file_output

PUBLICATION = "golden"
#: the slot read as pg2sink reads it by default, and the one read with --streaming
SLOTS = {False: "golden", True: "golden_streamed"}
#: how long the workload may take to arrive, in seconds
READ_WAIT = 60.0


def read_slot(dsn: str, streamed: bool) -> list[bytes]:
    """The XLogData frames of a slot up to the workload's end marker (left out)."""
    stream = ReplicationStream(connect(SecretDsn(dsn), replication=True))
    stream.start(
        SLOTS[streamed], PUBLICATION, extra_options=[("messages", "true")], streaming=streamed
    )
    frames: list[bytes] = []
    in_block = False  # inside Stream Start ... Stream Stop data messages carry an xid
    deadline = time.monotonic() + READ_WAIT
    try:
        while time.monotonic() < deadline:
            buf = stream.read()
            if buf is None:
                stream.wait(1.0)
                continue
            frame = bytes(buf)
            parsed = parse_copy_data(frame)
            if isinstance(parsed, PrimaryKeepalive):
                if parsed.reply_requested:
                    stream.send(standby_status_update(parsed.wal_end, 0, 0, now_pg_timestamp()))
                continue
            payload = frame[XLOG_DATA_HEADER.size :]
            if payload[0] in (MessageTag.STREAM_START, MessageTag.STREAM_STOP):
                in_block = payload[0] == MessageTag.STREAM_START
            msg = decode(payload, in_block)
            if isinstance(msg, Message) and msg.prefix == workload.END_PREFIX:
                return frames
            frames.append(frame)
        raise RuntimeError(f"the workload's end marker did not arrive in {READ_WAIT} s")
    finally:
        stream.close()


def capture(dsn: str) -> tuple[list[bytes], list[bytes], RecordedCatalog]:
    """Run the workload on the server at `dsn`: its frames, read as pg2sink reads them and
    with --streaming, and the catalog's answers."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        # the walsender of the streaming slot takes it from the database's settings
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = {}").format(
                sql.Identifier(conn.info.dbname), sql.Literal(workload.STREAMED_SIZE)
            )
        )
        workload.create_schema(conn)
        tables = sql.SQL(", ").join(sql.Identifier(t) for t in workload.TABLES)
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(PUBLICATION), tables
            )
        )
        for slot in SLOTS.values():
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        workload.run_changes(conn, end_marker=True)
        frames, streamed = read_slot(dsn, False), read_slot(dsn, True)
        # the catalog as it is after the workload: types and keys did not change in it
        catalog = RecordedCatalog(Catalog(conn))
        file_output(Input(frames, catalog))  # asks every question a replay asks
        catalog.live = None
    return frames, streamed, catalog


def main() -> int:
    import services

    with tempfile.TemporaryDirectory(prefix="pg2sink-golden-") as tmp:
        Path(tmp).chmod(0o755)  # the server may run as the postgres user (services.py)
        server = services.Postgres(base=Path(tmp) / "pg", port=services.free_port())
        server.start()
        try:
            frames, streamed, catalog = capture(server.dsn())
        finally:
            server.destroy()
    tags = {f[XLOG_DATA_HEADER.size] for f in streamed}
    if not {MessageTag.STREAM_START, MessageTag.STREAM_ABORT, MessageTag.STREAM_COMMIT} <= tags:
        raise RuntimeError(f"nothing was streamed (message tags {sorted(map(chr, tags))})")
    DATA.mkdir(exist_ok=True)
    write_frames(FRAMES, frames)
    write_frames(FRAMES_STREAMED, streamed)
    write_catalog(CATALOG, catalog)
    for name, make in OUTPUTS.items():
        (DATA / name).write_bytes(make(Input(frames, catalog)))
    for name, streamed_name in STREAMED.items():
        (DATA / streamed_name).write_bytes(OUTPUTS[name](Input(streamed, catalog, True)))
    print(
        f"{len(frames)} frames ({len(streamed)} streamed) captured; {DATA} rewritten: "
        "review `git diff` before committing"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
