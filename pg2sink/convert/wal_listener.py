"""wal-listener's config.yml (github.com/ihippik/wal-listener at 261cd6e, the version
the seed's README describes: config/config.go, cmd/wal-listener, listener/) as one
pg2sink configuration: `pg2sink stream --sink nats --format wal-listener`.

- listener: the slot is `<slotName>_<database.name>` (NewWalListener), so pg2sink goes
  on from wal-listener's position; heartbeatInterval is the standby status interval.
- database: host, port, name and user make the source's DSN (the password is not
  copied); filter.tables (table name -> actions; a table it does not name is not sent
  at all) becomes `table` patterns (a name without a schema, as wal-listener matched it)
  and `only` rules. wal-listener created a publication FOR ALL TABLES and filtered in
  the process; pg2sink publishes only those tables, in its own publication.
- nats: address is the URL, topicPrefix the subject prefix (subjects
  `<topicPrefix><schema>_<table>`); clusterID and clientID were NATS Streaming's.
- logger: level and humanReadable are pg2sink's log level and format.
"""

from __future__ import annotations

from typing import Any

from psycopg import conninfo

from pg2sink.convert.model import Conversion, Document, Section, go_duration, notes_for, strings
from pg2sink.errors import ConfigError
from pg2sink.options import format_duration

__all__ = ["convert"]

TOOL = "wal-listener"

#: the actions of wal-listener's events (ActionKind), in its filter's lower case
_ACTIONS = ("insert", "update", "delete")
#: wal-listener's log levels (initLogger): anything else is debug
_LEVELS = {"warning": "warning", "error": "error", "fatal": "error", "info": "info"}


def convert(data: dict[str, Any], path: str) -> Conversion:
    """The configuration of wal-listener's file `path`, read as `data`."""
    top = Section(data, "", path)
    doc = Document(
        "wal-listener", "PostgreSQL into NATS JetStream (wal-listener's: NATS Streaming)"
    )
    doc.set("sink", "nats", "wal-listener published to NATS")
    doc.set("format", "wal-listener", "wal-listener's event and subjects")
    database = Section(top.get("database") or {}, "database", path)
    _database(doc, database)
    _listener(doc, Section(top.get("listener") or {}, "listener", path), database)
    _nats(doc, Section(top.get("nats") or {}, "nats", path))
    _logger(doc, Section(top.get("logger") or {}, "logger", path))
    doc.set("no_imports", True, "wal-listener streamed changes only, never a table's rows")
    doc.notes += notes_for(top, TOOL)
    return Conversion(TOOL, path, [doc])


def _database(doc: Document, db: Section) -> None:
    params = {
        key: str(value)
        for key, name in (("host", "host"), ("port", "port"), ("dbname", "name"), ("user", "user"))
        if (value := db.get(name)) is not None
    }
    origin = ", ".join(db.origin(k) for k in ("host", "port", "name", "user"))
    doc.set("source", conninfo.make_conninfo("", **params), origin)
    doc.note(db, "password", 'not copied: give it with password_file = "FILE" or PGPASSWORD')
    doc.note(db, "debug", "not a setting wal-listener reads; left out")
    filters = Section(db.get("filter") or {}, db.origin("filter"), db.path)
    tables = Section(filters.get("tables") or {}, filters.origin("tables"), db.path)
    if not tables.names():
        doc.notes.append(
            f"{tables.where} names no table: wal-listener sent no event at all; pg2sink "
            "streams every table of the schema public"
        )
    only: list[str] = []
    names: list[str] = []
    for table in tables.names():
        listed = [a.lower() for a in strings(tables.get(table) or [], tables.at(table))]
        actions = [a for a in _ACTIONS if a in listed]
        if len(actions) < len(set(listed)):
            doc.notes.append(
                f"{tables.origin(table)}: wal-listener matched insert, update and delete "
                "only; the other actions listed sent nothing and are left out"
            )
        if actions:
            names.append(table)
            only.append(f"{table}={','.join(actions)}")
    if only:
        doc.set("table", names, tables.where)
        doc.set("only", only, tables.where)
        doc.notes.append(
            f"{tables.where}: wal-listener matched a table's name in any schema, "
            "from a publication FOR ALL TABLES; pg2sink publishes the tables of that name in "
            "the schema public (add others with schema = [...]) and sends only the actions "
            "listed (never TRUNCATE, which wal-listener did not send)"
        )
    doc.notes += notes_for(tables, TOOL) + notes_for(filters, TOOL) + notes_for(db, TOOL)


def _listener(doc: Document, listener: Section, db: Section) -> None:
    slot, name = listener.get("slotName"), db.get("name")
    if slot is not None and name is not None:
        origin = f"{listener.origin('slotName')} + '_' + {db.origin('name')}, as wal-listener"
        doc.set("slot", f"{slot}_{name}", origin)
    if (heartbeat := listener.get("heartbeatInterval")) is not None:
        seconds = go_duration(heartbeat, listener.at("heartbeatInterval"))
        if seconds > 0:
            doc.set(
                "heartbeat_interval",
                format_duration(seconds),
                listener.origin("heartbeatInterval"),
            )
    doc.note(
        listener,
        "refreshConnection",
        "pg2sink sees a lost connection as it happens and connects again by itself",
    )
    doc.note(
        listener,
        "ackTimeout",
        "read by no wal-listener code; pg2sink's nats_ack_timeout is the wait for "
        "JetStream's acknowledgements",
    )
    doc.notes += notes_for(listener, TOOL)


def _nats(doc: Document, nats: Section) -> None:
    address = nats.get("address")
    if address is not None:
        urls = [a.strip() for a in str(address).split(",")]
        url = ",".join(u if "://" in u else f"nats://{u}" for u in urls)
        doc.set("nats_url", url, nats.origin("address"))
    prefix = nats.get("topicPrefix")
    if prefix is not None:
        doc.set("nats_subject_prefix", str(prefix), nats.origin("topicPrefix"))
    for key in ("clusterID", "clientID"):
        doc.note(
            nats,
            key,
            "NATS Streaming's (end of life 2023); JetStream has streams instead: pg2sink's "
            "is nats_stream",
        )
    doc.notes += notes_for(nats, TOOL)


def _logger(doc: Document, logger: Section) -> None:
    level = logger.get("level")
    if level is not None:
        doc.set("log_level", _LEVELS.get(str(level), "debug"), logger.origin("level"))
    human = logger.get("humanReadable")
    if human is not None:
        if not isinstance(human, bool):
            raise ConfigError(f"{logger.at('humanReadable')}: expected true or false")
        doc.set("log_format", "text" if human else "json", logger.origin("humanReadable"))
    doc.note(logger, "caller", "pg2sink's log lines name their module, not the calling line")
    doc.notes += notes_for(logger, TOOL)
