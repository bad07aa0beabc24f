"""psql-streamer's TOML (github.com/blind-oracle/psql-streamer, psql-streamer.toml and
the code reading it: config.go, source/postgres, source/kafka, sink/kafka, mux/mux.go)
as pg2sink configurations: one per source a sink reads (`[sink.NAME]`'s `sources`).

A postgres source into a kafka sink is `pg2sink stream --sink kafka --format
psql-streamer` (the passthrough handler's event); a stub sink is `--sink null`. A kafka
source (psql-streamer reading another's events) is `pg2sink relay`, written commented
out: relay reads pg2sink's records, not psql-streamer's events, yet (issue #29, item 5).
"""

from __future__ import annotations

import math
import re
from typing import Any

from psycopg import conninfo

from pg2sink.convert.model import (
    Conversion,
    Document,
    Section,
    go_duration,
    integer,
    notes_for,
    strings,
)
from pg2sink.errors import ConfigError
from pg2sink.options import format_duration

__all__ = ["convert"]

TOOL = "psql-streamer"


def convert(data: dict[str, Any], path: str) -> Conversion:
    """The configurations of psql-streamer's file `path`, read as `data`."""
    top = Section(data, "", path)
    sources = Section(top.get("source") or {}, "source", path)
    sinks = Section(top.get("sink") or {}, "sink", path)
    out = Conversion(TOOL, path)
    fed: set[str] = set()
    for sink_name in sinks.names():
        sink = Section(sinks.get(sink_name), f"sink.{sink_name}", path)
        for source_name in strings(sink.get("sources") or [], sink.at("sources")):
            if sources.get(source_name) is None:
                raise ConfigError(
                    f"{sink.at('sources')}: no [source.{source_name}] "
                    "(psql-streamer refused to start)"
                )
            doc = Document(
                f"{source_name}-{sink_name}",
                f"source.{source_name} into sink.{sink_name} ({sink.origin('sources')})",
            )
            # each document reads the sections afresh: their notes are its own
            _source(doc, Section(sources.get(source_name), f"source.{source_name}", path))
            _sink(doc, Section(sinks.get(sink_name), sink.where, path))
            _top(doc, Section(data, "", path), first=not out.documents)
            if source_name in fed:
                _own_slot(doc, sink_name)
            fed.add(source_name)
            out.documents.append(doc)
    for name in sources.names():
        if name not in fed:
            out.notes.append(f"source.{name} is read by no sink: not converted")
    return out


def _own_slot(doc: Document, sink_name: str) -> None:
    """A source's second sink: a process of its own, so a slot of its own."""
    slot = doc.value("slot")
    if slot is None:
        return
    doc.set("slot", f"{slot}_{sink_name}", f"{slot}, one slot per configuration")
    doc.notes.append(
        f"psql-streamer fed several sinks from slot {slot}; each pg2sink configuration "
        f"streams from a slot of its own, so this one's starts where it is created"
    )


def _top(doc: Document, top: Section, first: bool) -> None:
    """The file's top-level settings."""
    top.mark("source", "sink")  # converted into documents
    http = top.get("http")
    if http is not None:
        if first:
            doc.set("metrics_address", str(http), top.origin("http"))
        else:  # each document is a process of its own: one listener each
            host = str(http).rpartition(":")[0]
            doc.set("metrics_address", f"{host}:0", f"{top.origin('http')}, any free port")
    doc.note(
        top,
        "tickerInterval",
        "pg2sink logs no periodic statistics line; its counters are at GET /stats and /metrics",
    )
    doc.note(
        top,
        "boltdb",
        "pg2sink keeps its position in the replication slot alone (its confirmed LSN), no file",
    )
    doc.notes += notes_for(top, TOOL)


def _source(doc: Document, src: Section) -> None:
    kind = src.get("type")
    if kind == "postgres":
        _postgres(doc, src)
    elif kind == "kafka":
        _kafka_source(doc, src)
    else:
        raise ConfigError(f"{src.at('type')}: expected postgres or kafka")
    _logging(doc, src)
    doc.note(src, "sendRetryInterval", "pg2sink retries a failing sink with one backoff policy")
    doc.notes += notes_for(src, TOOL)


def _postgres(doc: Document, src: Section) -> None:
    dsn, origin = _dsn(doc, src)
    doc.set("source", dsn, origin)
    publication = src.get("publication")
    if publication is not None:
        doc.set("publication", str(publication), src.origin("publication"))
        doc.set("publication_mode", "use", "psql-streamer streamed a publication made by hand")
    slot = src.get("replicationSlot")
    if slot is not None:
        doc.set("slot", str(slot), src.origin("replicationSlot"))
    doc.set("no_imports", True, "psql-streamer streamed changes only, never a table's rows")
    doc.note(
        src, "batchSize", "pg2sink batches by time (flush_interval) and by the sink's own limits"
    )
    if (retry := src.get("startRetryInterval")) is not None:
        doc.set("retry_initial", True, src.origin("startRetryInterval"))
        doc.set(
            "retry_interval",
            _duration(retry, src, "startRetryInterval"),
            src.origin("startRetryInterval"),
        )
    if (flush := src.get("batchFlushInterval")) is not None:
        doc.set(
            "flush_interval",
            _duration(flush, src, "batchFlushInterval"),
            src.origin("batchFlushInterval"),
        )
    override = src.get("walPositionOverride")
    if override == 0:
        doc.same.append(f"{src.origin('walPositionOverride')} = 0 (the slot's position)")
    elif isinstance(override, int) and override > 0:
        lsn = f"{override >> 32:X}/{override & 0xFFFFFFFF:X}"
        doc.notes.append(
            f"{src.origin('walPositionOverride')} = {override}: pg2sink starts from the "
            f"slot's confirmed position; to write again from there, run `pg2sink replay "
            f"--since {lsn}` once"
        )
    retain = src.get("walRetain")
    if retain == 0:
        doc.same.append(f"{src.origin('walRetain')} = 0")
    elif isinstance(retain, int) and retain > 0:
        doc.notes.append(
            f"{src.origin('walRetain')} = {retain}: a number of WAL bytes; pg2sink's "
            "wal_retain keeps a span of commit time behind instead (docs/replay.md): set "
            'wal_retain = "10m" (say) to keep a window to replay'
        )


def _dsn(doc: Document, src: Section) -> tuple[str, str]:
    """The source's DSN and its origin: its password left out (a note says how to give
    it), psql-streamer's timeout as libpq's connect_timeout."""
    dsn = src.get("dsn")
    if not isinstance(dsn, str):
        raise ConfigError(f"{src.at('dsn')}: expected a connection string")
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except Exception:  # psycopg's message may quote the string: not shown
        raise ConfigError(f"{src.at('dsn')}: not a libpq connection string") from None
    if params.pop("password", None) is not None:
        doc.notes.append(
            f"{src.origin('dsn')}: its password is not copied: give it with password_file = "
            '"FILE" or PGPASSWORD'
        )
    origin = src.origin("dsn")
    timeout = src.get("timeout")
    if timeout is not None and "connect_timeout" not in params:
        # libpq's is whole seconds, and it takes less than 2 as 2
        params["connect_timeout"] = max(2, math.ceil(go_duration(timeout, src.at("timeout"))))
        origin += f", {src.origin('timeout')}"
    return conninfo.make_conninfo("", **params), origin


def _kafka_source(doc: Document, src: Section) -> None:
    doc.command, doc.runnable = "relay", False
    doc.notes.append(
        f"{src.where} (type kafka) read psql-streamer's events from Kafka: pg2sink relay "
        "reads the records pg2sink writes, not psql-streamer's events, yet (issue #29, "
        "item 5), so this configuration is written commented out"
    )
    hosts = src.get("hosts")
    if hosts is not None:
        servers = ",".join(strings(hosts, src.at("hosts")))
        doc.set("relay_bootstrap_servers", servers, src.origin("hosts"))
    topics = src.get("topics")
    if topics is not None:
        names = "|".join(re.escape(t) for t in strings(topics, src.at("topics")))
        doc.set("relay_topics", f"^({names})$", src.origin("topics"))
    group = src.get("groupID")
    if group is not None:
        doc.set("relay_group_id", str(group), src.origin("groupID"))
    if (batch := src.get("batchSize")) is not None:
        doc.set("relay_batch_size", integer(batch, src.at("batchSize")), src.origin("batchSize"))
    doc.note(src, "batchFlushInterval", "the relay commits after each batch the sink holds")


def _sink(doc: Document, snk: Section) -> None:
    snk.get("sources")  # made the documents
    kind = snk.get("type")
    if kind in ("stub_discard", "stub_log"):
        doc.set("sink", "null", snk.origin("type"))
        if kind == "stub_log":
            doc.notes.append(
                f"{snk.origin('type')} = stub_log: logged each batch's count; pg2sink's "
                "null sink counts in /stats and /metrics"
            )
    elif kind == "kafka":
        doc.set("sink", "kafka", snk.origin("type"))
        _kafka_sink(doc, snk)
    else:
        raise ConfigError(f"{snk.at('type')}: expected kafka, stub_log or stub_discard")
    _logging(doc, snk)
    doc.notes += notes_for(snk, TOOL)


def _kafka_sink(doc: Document, snk: Section) -> None:
    hosts = snk.get("hosts")
    if hosts is not None:
        servers = ",".join(strings(hosts, snk.at("hosts")))
        doc.set("kafka_bootstrap_servers", servers, snk.origin("hosts"))
    handlers = strings(snk.get("handlers") or [], snk.at("handlers"))
    if doc.command == "stream" and handlers == ["passthrough"]:
        doc.set("format", "psql-streamer", f"{snk.origin('handlers')}: passthrough's event")
    elif handlers:
        doc.notes.append(
            f"{snk.origin('handlers')}: "
            + (
                "the relay writes pg2sink's records"
                if doc.command == "relay"
                else "only passthrough is psql-streamer's event (--format psql-streamer)"
            )
        )
    _topics(doc, snk)
    settings, origins = _producer_settings(doc, snk)
    if settings:
        doc.set("kafka_config", settings, ", ".join(origins))


def _topics(doc: Document, snk: Section) -> None:
    mapping = snk.get("tableTopicMapping") or {}
    if not isinstance(mapping, dict):
        raise ConfigError(f"{snk.at('tableTopicMapping')}: expected a table")
    if mapping:
        pairs = [f"public.{table}={topic}" for table, topic in mapping.items()]
        doc.set("topic_map", pairs, snk.origin("tableTopicMapping"))
        doc.notes.append(
            f"{snk.origin('tableTopicMapping')}: psql-streamer matched the table's name in "
            "any schema; pg2sink's topic_map names schema.table: public is assumed"
        )
    fallback = snk.get("topicFallback")
    if fallback:
        doc.set("fallback_topic", str(fallback), snk.origin("topicFallback"))
    elif mapping:
        doc.notes.append(
            f"{snk.where} has no topicFallback: psql-streamer dropped the events of tables "
            "with no mapping, pg2sink stops on them: publish only the mapped tables, or set "
            "fallback_topic"
        )


#: sink settings that are librdkafka producer settings: (librdkafka's name, in ms)
_PRODUCER = {
    "batchSize": ("batch.num.messages", False),
    "batchTimeout": ("linger.ms", True),
    "rebalanceInterval": ("topic.metadata.refresh.interval.ms", True),
}


def _producer_settings(doc: Document, snk: Section) -> tuple[list[str], list[str]]:
    """The kafka sink's settings librdkafka has (kafka_config), and their origins; notes
    on the others."""
    settings: list[str] = []
    origins: list[str] = []
    for key, (name, ms) in _PRODUCER.items():
        value = snk.get(key)
        if value is not None:
            where = snk.at(key)
            number = round(go_duration(value, where) * 1000) if ms else integer(value, where)
            settings.append(f"{name}={number}")
            origins.append(snk.origin(key))
    limits = [snk.origin(k) for k in ("timeout", "maxAttempts") if snk.get(k) is not None]
    if limits:
        doc.notes.append(
            f"{', '.join(limits)}: pg2sink waits for Kafka's acknowledgement and, after a "
            "failure, sends again from the last confirmed position, with no limit "
            "(librdkafka's own timeouts: kafka_config)"
        )
    acks = snk.get("requiredAcks")
    if acks == -1:
        doc.same.append(f"{snk.origin('requiredAcks')} = -1 (acks=all)")
    elif acks is not None:
        doc.notes.append(
            f"{snk.origin('requiredAcks')} = {acks}: pg2sink always asks for acks=all, so "
            "that an LSN is confirmed only once every in-sync replica holds the change"
        )
    if (asynchronous := snk.get("async")) is False:
        doc.same.append(f"{snk.origin('async')} = false")
    elif asynchronous is True:
        doc.notes.append(
            f"{snk.origin('async')} = true: pg2sink never confirms a change Kafka has not "
            "acknowledged; psql-streamer's async mode, which could lose events, has no "
            "equivalent"
        )
    doc.note(snk, "domain", "psql-streamer's gRPC Domain API client")
    return settings, origins


def _logging(doc: Document, sec: Section) -> None:
    """A source's or sink's verbose and debug switches (pg2sink's level is the process's)."""
    for key in ("debug", "verbose"):
        if sec.get(key) is False:
            doc.same.append(f"{sec.origin(key)} = false")
    if sec.get("debug") is True:
        doc.set("log_level", "debug", sec.origin("debug"))
    if sec.get("verbose") is True:
        doc.notes.append(
            f"{sec.origin('verbose')} = true: psql-streamer logged a line per event; "
            "pg2sink counts them (GET /stats, /metrics) instead"
        )


def _duration(value: object, sec: Section, key: str) -> str:
    """A positive Go duration as pg2sink's text."""
    seconds = go_duration(value, sec.at(key))
    if seconds <= 0:
        raise ConfigError(f"{sec.at(key)}: must be greater than zero")
    return format_duration(seconds)
