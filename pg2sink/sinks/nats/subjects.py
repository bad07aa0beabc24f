"""Subjects and message ids: where each record goes, and how JetStream spots a repeat.

Subjects (as wal-listener: the prefix, then the schema and the table):

    <prefix>.<schema>.<table>          a table's changes (INSERT, UPDATE, DELETE, TRUNCATE,
                                       IMPORT)
    <prefix>.<schema>.<table>.schema   the table's Schema records
    <prefix>.messages                  logical decoding messages (--messages)

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

import re

__all__ = ["MESSAGES", "escape", "table_subject"]

#: the messages subject's last token
MESSAGES = "messages"

#: bytes a subject token cannot hold as they are, and the escape character itself
_ESCAPED = re.compile(r"[%.*>\s\x00-\x1f\x7f]")


def _hex(match: re.Match[str]) -> str:
    return "".join(f"%{b:02X}" for b in match.group().encode())


def escape(name: str) -> str:
    """A schema or table name as one subject token (see the module docstring)."""
    return _ESCAPED.sub(_hex, name)


def table_subject(prefix: str, namespace: str, name: str) -> str:
    """`<prefix>.<schema>.<table>`, the names escaped."""
    return f"{prefix}.{escape(namespace)}.{escape(name)}"
