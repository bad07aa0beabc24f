"""The seed tools' message shapes (formats/pg_kinesis.py, wal_listener.py,
psql_streamer.py): the bytes of an INSERT, an UPDATE, a DELETE and a TRUNCATE of
tests/formats/sample.py, equal in both value forms, against examples derived by hand
from each tool's code (the derivation is next to each example)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from psycopg import sql

from pg2sink.changelog.codecs import Kind
from pg2sink.changelog.records import Modification
from pg2sink.formats.base import Origin, pg_array_text
from pg2sink.formats.gotime import go_time
from pg2sink.formats.jsonenc import loads
from pg2sink.formats.pg_kinesis import format_lsn, qualified, type_name
from pg2sink.formats.registry import encoder
from tests.formats.sample import (
    ANN,
    CHANGES,
    COMMIT,
    DELETE,
    IMPORT,
    INSERT,
    SCHEMA,
    TRUNCATE,
    UPDATE,
    json_form,
)

ORIGIN = Origin("db1", "app", "pg2sink")

# pg_kinesis.go marshalWALToJSON: json.Marshal of struct{Time, Lsn, Table, Operation,
# Columns} (keys in that order); Columns a map (sorted keys) of {"new"/"old": {"q","t","v"}}
# (marshalColumnValue, a map: sorted q, t, v; all strings). time: RFC3339, whole seconds;
# lsn: pgx.FormatLSN(0x16B3748) = "0/16B3748"; t: format_type_be (int4 "integer", int8
# "bigint", timestamptz "timestamp with time zone", numeric(10,2) "numeric"); q "false"
# for the types test_decoding prints unquoted (int*, numeric, bool), "true" else; v the
# text (timestamptz as PostgreSQL prints it in UTC). UPDATE: "old" only where the old
# value differs (name, score, active); DELETE: the old key under "old".
PG_KINESIS = {
    "insert": (
        '{"time":"2024-05-01T10:00:00Z","lsn":"0/16B3748","table":"public.users",'
        '"operation":"INSERT","columns":{'
        '"active":{"new":{"q":"false","t":"boolean","v":"true"}},'
        '"big":{"new":{"q":"false","t":"bigint","v":"9007199254740993"}},'
        '"born":{"new":{"q":"true","t":"date","v":"1990-02-28"}},'
        '"doc":{"new":{"q":"true","t":"jsonb","v":"{\\"k\\": 1}"}},'
        '"id":{"new":{"q":"false","t":"integer","v":"1"}},'
        '"name":{"new":{"q":"true","t":"text","v":"Ann"}},'
        '"score":{"new":{"q":"false","t":"numeric","v":"12.50"}},'
        '"seen":{"new":{"q":"true","t":"timestamp with time zone","v":"2024-05-01 09:30:00+00"}},'
        '"tags":{"new":{"q":"true","t":"text[]","v":"[\\"a\\",null]"}}}}'
    ),
    "update": (
        '{"time":"2024-05-01T10:00:00Z","lsn":"0/16B3770","table":"public.users",'
        '"operation":"UPDATE","columns":{'
        '"active":{"new":{"q":"false","t":"boolean","v":"false"},'
        '"old":{"q":"false","t":"boolean","v":"true"}},'
        '"big":{"new":{"q":"false","t":"bigint","v":"9007199254740993"}},'
        '"born":{"new":{"q":"true","t":"date","v":"1990-02-28"}},'
        '"doc":{"new":{"q":"true","t":"jsonb","v":"{\\"k\\": 1}"}},'
        '"id":{"new":{"q":"false","t":"integer","v":"1"}},'
        '"name":{"new":{"q":"true","t":"text","v":"Bo"},"old":{"q":"true","t":"text","v":"Ann"}},'
        '"score":{"new":{"q":"false","t":"numeric","v":"13.00"},'
        '"old":{"q":"false","t":"numeric","v":"12.50"}},'
        '"seen":{"new":{"q":"true","t":"timestamp with time zone","v":"2024-05-01 09:30:00+00"}},'
        '"tags":{"new":{"q":"true","t":"text[]","v":"[\\"a\\",null]"}}}}'
    ),
    "delete": (
        '{"time":"2024-05-01T10:00:00Z","lsn":"0/16B3798","table":"public.users",'
        '"operation":"DELETE","columns":{"id":{"old":{"q":"false","t":"integer","v":"1"}}}}'
    ),
    "truncate": (
        '{"time":"2024-05-01T10:00:00Z","lsn":"0/16B37C0","table":"public.users",'
        '"operation":"TRUNCATE","columns":{}}'
    ),
}

# wal-listener (af9ed41) nats_publisher.go Event, easyjson tags in order: id, schema,
# table, action (ActionKind: INSERT, UPDATE, DELETE), data (the new row; DELETE's old
# key), commitTime (Go's time.Time JSON: RFC3339Nano, trailing zeros dropped).
# AssertValue: bool -> JSON boolean, int4 -> JSON number, every other type its text
# (int8, numeric included: strings; an array PostgreSQL's text, {a,NULL}). id: pg2sink's
# uuid5 of the change (see below).
WAL_LISTENER = {
    "insert": (
        '{"id":"1a72356d-c6e5-535e-ba22-fcf4b208ed1c","schema":"public","table":"users",'
        '"action":"INSERT","data":{"id":1,"name":"Ann","score":"12.50","active":true,'
        '"seen":"2024-05-01 09:30:00+00","born":"1990-02-28","big":"9007199254740993",'
        '"tags":"{a,NULL}","doc":"{\\"k\\": 1}"},'
        '"commitTime":"2024-05-01T10:00:00.123456Z"}'
    ),
    "update": (
        '{"id":"76159dee-7ca3-5e86-a20e-443880bc669e","schema":"public","table":"users",'
        '"action":"UPDATE","data":{"id":1,"name":"Bo","score":"13.00","active":false,'
        '"seen":"2024-05-01 09:30:00+00","born":"1990-02-28","big":"9007199254740993",'
        '"tags":"{a,NULL}","doc":"{\\"k\\": 1}"},'
        '"commitTime":"2024-05-01T10:00:00.123456Z"}'
    ),
    "delete": (
        '{"id":"ccb15719-d84b-5e09-9b7f-1150332973a1","schema":"public","table":"users",'
        '"action":"DELETE","data":{"id":1},"commitTime":"2024-05-01T10:00:00.123456Z"}'
    ),
    "truncate": (
        '{"id":"1e1b33ed-4404-545b-8946-a269206a6512","schema":"public","table":"users",'
        '"action":"TRUNCATE","data":{},"commitTime":"2024-05-01T10:00:00.123456Z"}'
    ),
}

# psql-streamer passthrough.go: json.Marshal(event.Event) without tags: Host, Database,
# Table (the name only), Action (insert, update, delete), WALPosition (the LSN, a
# number), Timestamp (time.Time JSON), UUID, Columns (a map: sorted keys; a DELETE's every
# column of the relation, null but the key's). generateEvent's
# values by pgx: numbers and booleans as such, a date as its midnight UTC time.Time, a
# timestamptz as time.Time; the types it skipped (numeric, arrays...) are kept.
PSQL_STREAMER = {
    "insert": (
        '{"Host":"db1","Database":"app","Table":"users","Action":"insert",'
        '"WALPosition":23803720,"Timestamp":"2024-05-01T10:00:00.123456Z",'
        '"UUID":"1a72356d-c6e5-535e-ba22-fcf4b208ed1c","Columns":{"active":true,'
        '"big":9007199254740993,"born":"1990-02-28T00:00:00Z","doc":"{\\"k\\": 1}","id":1,'
        '"name":"Ann","score":12.50,"seen":"2024-05-01T09:30:00Z","tags":["a",null]}}'
    ),
    "update": (
        '{"Host":"db1","Database":"app","Table":"users","Action":"update",'
        '"WALPosition":23803760,"Timestamp":"2024-05-01T10:00:00.123456Z",'
        '"UUID":"76159dee-7ca3-5e86-a20e-443880bc669e","Columns":{"active":false,'
        '"big":9007199254740993,"born":"1990-02-28T00:00:00Z","doc":"{\\"k\\": 1}","id":1,'
        '"name":"Bo","score":13.00,"seen":"2024-05-01T09:30:00Z","tags":["a",null]}}'
    ),
    "delete": (
        '{"Host":"db1","Database":"app","Table":"users","Action":"delete",'
        '"WALPosition":23803800,"Timestamp":"2024-05-01T10:00:00.123456Z",'
        '"UUID":"ccb15719-d84b-5e09-9b7f-1150332973a1","Columns":{"active":null,"big":null,'
        '"born":null,"doc":null,"id":1,"name":null,"score":null,"seen":null,"tags":null}}'
    ),
    "truncate": (
        '{"Host":"db1","Database":"app","Table":"users","Action":"truncate",'
        '"WALPosition":23803840,"Timestamp":"2024-05-01T10:00:00.123456Z",'
        '"UUID":"1e1b33ed-4404-545b-8946-a269206a6512","Columns":{}}'
    ),
}

EXPECTED = {"pg-kinesis": PG_KINESIS, "wal-listener": WAL_LISTENER, "psql-streamer": PSQL_STREAMER}


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_bytes_of_each_change(fmt: str, change: str) -> None:
    table = encoder(fmt, ORIGIN).table(SCHEMA)
    m = CHANGES[change]
    assert table.value(m).decode() == EXPECTED[fmt][change]
    assert table.value(json_form(m)) == table.value(m)  # the JSON form gives the same bytes
    json.loads(table.value(m))  # one valid JSON document


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
def test_keys_and_imported_rows(fmt: str) -> None:
    """The key is pg2sink's JSON key; an imported row is written as its INSERT."""
    table = encoder(fmt, ORIGIN).table(SCHEMA)
    assert table.key(ANN) == b'{"id":1}'
    assert table.value(IMPORT) == table.value(INSERT)


def test_message_ids_name_the_change() -> None:
    """uuid5 of (lsn, sequence, table): stable across a replay, distinct per change."""
    ids = {
        json.loads(encoder("wal-listener", ORIGIN).table(SCHEMA).value(m))["id"]
        for m in CHANGES.values()
    }
    assert len(ids) == 4
    name = f"{UPDATE.lsn}/1/public.users"
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/pg2sink/changes")
    assert str(uuid.uuid5(namespace, name)) == "76159dee-7ca3-5e86-a20e-443880bc669e"


def test_go_time_and_lsn_notation() -> None:
    """Go's RFC3339Nano drops the fraction's trailing zeros, and a zero fraction."""
    assert go_time(COMMIT) == "2024-05-01T10:00:00.123456Z"
    assert go_time(COMMIT.replace(microsecond=120000)) == "2024-05-01T10:00:00.12Z"
    assert go_time(COMMIT.replace(microsecond=0)) == "2024-05-01T10:00:00Z"
    assert format_lsn(0x16_B374D848) == "16/B374D848"
    assert qualified("public", "Users") == 'public."Users"'
    assert type_name("varchar(20)") == ("character varying", True)
    assert type_name("int8[]") == ("bigint[]", True)  # an array literal is quoted


def test_nulls_and_unchanged_toast() -> None:
    """NULL: pg_kinesis's "null" unquoted, null elsewhere; an unchanged TOASTed value:
    test_decoding's unchanged-toast-datum, left out of wal-listener's and psql-streamer's."""
    from pg2sink.logical.messages import UNCHANGED_TOAST

    row = {**ANN, "name": None, "doc": UNCHANGED_TOAST}
    m = Modification(COMMIT, 0, 1, 2, UPDATE.operation, "public", "users", None, row)
    kinesis = json.loads(encoder("pg-kinesis", ORIGIN).table(SCHEMA).value(m))["columns"]
    assert kinesis["name"]["new"] == {"q": "false", "t": "text", "v": "null"}
    assert kinesis["doc"]["new"] == {"q": "false", "t": "jsonb", "v": "unchanged-toast-datum"}
    wal = json.loads(encoder("wal-listener", ORIGIN).table(SCHEMA).value(m))["data"]
    assert wal["name"] is None and "doc" not in wal
    psql = json.loads(encoder("psql-streamer", ORIGIN).table(SCHEMA).value(m))["Columns"]
    assert psql["name"] is None and "doc" not in psql


def test_an_empty_host_is_unknown() -> None:
    """generateEvent: `if ev.Host == "" { ev.Host = "unknown" }`."""
    value = encoder("psql-streamer", Origin("", "app")).table(SCHEMA).value(DELETE)
    assert json.loads(value)["Host"] == "unknown"
    assert (
        json.loads(encoder("psql-streamer", ORIGIN).table(SCHEMA).value(TRUNCATE))["Host"] == "db1"
    )


@pytest.mark.parametrize(
    ("literal", "kind"),
    [
        ("ARRAY['a', NULL, '', 'NULL', 'a b', 'x\"y', 'back\\slash', '{}', 'c,d']", Kind.TEXT),
        ("ARRAY[[1, 2], [3, NULL]]::int4[]", Kind.INT),
        ("ARRAY[true, false, NULL]", Kind.BOOLEAN),
        ("ARRAY[1.50, -2]::numeric[]", Kind.DECIMAL),
        ("'{}'::text[]", Kind.TEXT),
    ],
)
def test_array_text_is_what_postgresql_writes(pg_conn: Any, literal: str, kind: Kind) -> None:
    """wal-listener sent arrays as PostgreSQL's text: pg2sink's from their JSON form."""
    expression = sql.SQL(literal)
    query = sql.SQL("SELECT ({0})::text, to_json({0})::text").format(expression)
    text, as_json = pg_conn.execute(query).fetchone()
    assert pg_array_text(loads(as_json.encode(), exact_numbers=True), kind) == text
