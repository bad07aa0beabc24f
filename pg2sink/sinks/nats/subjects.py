"""Subjects and message ids: where each record goes, and how JetStream spots a repeat.

Subjects (the prefix, then the schema and the table; the format's rule,
formats/nats.py):

    <prefix>.<schema>.<table>          a table's changes (INSERT, UPDATE, DELETE, TRUNCATE,
                                       IMPORT)
    <prefix>.<schema>.<table>.schema   the table's Schema records
    <prefix>.messages                  logical decoding messages (--messages)
    <prefix><schema>_<table>           --format wal-listener: a table's events, as
                                       wal-listener named them (no Schema records)

The stream pg2sink creates holds `<prefix>.>` (`ensure_stream`); a table subject outside
it (wal-listener's with a prefix not ending in '.') is added to the stream's subjects
before the table's first message (`add_subject`, from client.py's `cover`).

A subject's tokens are separated by '.', and '*' and '>' are wildcards, so a name
holding them (or whitespace, which ends a subject in the protocol) is escaped: each such
byte, '%' itself and every control character becomes '%XX', the hex of its UTF-8
bytes (`my.table` -> `my%2Etable`, `a b` -> `a%20b`). Since '%' is escaped too,
different names give different tokens, and a token reads back by percent-decoding
(urllib.parse.unquote). The three kinds of subjects differ in their number of tokens,
so no table's subject is another's schema subject or the messages subject.

Message ids (the Nats-Msg-Id header; JetStream stores a message whose id it saw within
the stream's duplicate window once, and acknowledges the repeat as a duplicate): the
record's WAL position and its subject, so that pg2sinks publishing under different
prefixes into one stream never share an id:

    <lsn>:<sequence>:<subject>            a change (the subject tells apart the tables of
                                          a TRUNCATE, one WAL record)
    <lsn>:<subject>                       a Schema record (subject ...<table>.schema) or a
                                          message (subject <prefix>.messages)
    import:<lsn>:<subject>:<key JSON>     an imported row of a table with a primary key
                                          (the snapshot's position, the row's key)

A replay after a crash or an outage sends the same changes with the same ids, so within
the window JetStream keeps one copy of each. A Schema record comes again with the first
change of its table after a restart, at that change's position: a new id, so it may be
stored twice (the same content). Imported rows of a table without a primary key have no
id: nothing tells two equal rows apart, so a retried import partition may repeat them
(at-least-once).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig

from pg2sink.formats.nats import Payload
from pg2sink.sinks.nats.config import NatsConfig

log = logging.getLogger(__name__)

__all__ = ["MESSAGES", "add_subject", "covers", "ensure_stream", "escape", "table_subject"]

#: the messages subject's last token
MESSAGES = "messages"

#: bytes a subject token cannot hold as they are, and the escape character itself
_ESCAPED = re.compile(r"[%.*>\s\x00-\x1f\x7f]")


def _hex(match: re.Match[str]) -> str:
    return "".join(f"%{b:02X}" for b in match.group().encode())


def escape(name: str) -> str:
    """A schema or table name as one subject token (see the module docstring)."""
    return _ESCAPED.sub(_hex, name)


def table_subject(payload: Payload, prefix: str, namespace: str, name: str) -> str:
    """The subject of a table's changes in `payload`'s format, the names escaped."""
    return payload.subject(prefix, escape(namespace), escape(name))


def covers(filters: Iterable[str], subject: str) -> bool:
    """Whether one of the subject filters (`*` one token, `>` one or more at the end)
    matches `subject`."""
    tokens = subject.split(".")
    for f in filters:
        parts = f.split(".")
        if parts[-1] == ">":  # the tokens before it, and at least one more
            parts.pop()
            if len(tokens) <= len(parts):
                continue
        elif len(parts) != len(tokens):
            continue
        if all(p in ("*", t) for p, t in zip(parts, tokens, strict=False)):
            return True
    return False


async def ensure_stream(
    js: JetStreamContext, cfg: NatsConfig, subjects: list[str]
) -> tuple[str, ...]:
    """The subjects of the stream cfg.stream, which is created with `subjects` (file
    storage, --nats-duplicate-window) unless a stream of its name exists."""
    try:
        info = await js.stream_info(cfg.stream)
    except nats.js.errors.NotFoundError:
        pass
    else:
        held = tuple(info.config.subjects or ())
        log.debug("JetStream stream %s holds %s", cfg.stream, ", ".join(held))
        return held
    await js.add_stream(
        StreamConfig(
            name=cfg.stream,
            subjects=list(subjects),
            storage=StorageType.FILE,
            duplicate_window=cfg.nats_duplicate_window,
        )
    )
    log.info(
        "created JetStream stream %s for %s (duplicate window %gs)",
        cfg.stream,
        ", ".join(subjects),
        cfg.nats_duplicate_window,
    )
    return tuple(subjects)


async def add_subject(js: JetStreamContext, stream: str, subject: str) -> tuple[str, ...]:
    """The stream's subjects, read again, with `subject` added unless one holds it."""
    config = (await js.stream_info(stream)).config
    subjects = list(config.subjects or ())
    if not covers(subjects, subject):
        config.subjects = [*subjects, subject]
        await js.update_stream(config)
        log.info("JetStream stream %s now holds subject %s", stream, subject)
    return tuple(config.subjects or ())
