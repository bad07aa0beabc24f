"""The routing rules (pg2sink/routing/rules.py, masking.py) and the stage's rewriting of
pgoutput bytes (stage.py), without a replication stream; the masks' SQL against a real
PostgreSQL."""

from __future__ import annotations

import hashlib
import hmac
import struct

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from pg2sink.errors import ConfigError, DecodeError
from pg2sink.logical.decoder import decode
from pg2sink.logical.messages import UNCHANGED_TOAST, Relation, Truncate, Update
from pg2sink.routing.config import split_rules
from pg2sink.routing.masking import Mask
from pg2sink.routing.outbox import compile_outbox
from pg2sink.routing.rules import compile_rules
from pg2sink.routing.stage import RoutingStage


def test_rules_that_match_nothing_published_are_named() -> None:
    rules = compile_rules(
        only=["public.users=update,insert", "public.user=delete"],
        exclude_columns=["users.password", "users.pasword"],
        mask_columns=["public.users.emial=redact", "*.email=redact"],
        outbox=compile_outbox(["public.outbox", "public.events"], "topic", "payload", None),
    ).without_schema("pg2sink")  # pg2sink's own rule is never reported
    published = [
        ("public", "users", ["id", "email", "password"]),
        ("public", "outbox", ["id", "topic", "payload"]),
    ]
    assert rules.unmatched(published) == [
        "--only public.user=delete matches no published table",
        "--exclude-column users.pasword matches no column of a published table",
        "--mask-column public.users.emial matches no column of a published table",
        "--outbox public.events matches no published table",
    ]
    assert compile_rules(only=["public.users=insert"]).unmatched([]) == [
        "--only public.users=insert matches no published table"
    ]


def test_only_rules_union_and_default() -> None:
    rules = compile_rules(only=["public.users=insert", "user*=UPDATE", "other.x=delete"])
    assert rules.route("public", "users", ["id"]).actions == {"insert", "update"}
    assert rules.route("app", "users2", ["id"]).actions == {"update"}
    assert rules.route("public", "x", ["id"]).passes_everything  # no rule: everything
    assert split_rules("public.a=insert,update, b=delete") == ["public.a=insert,update", "b=delete"]


def test_column_patterns_quotes_dots_and_precedence() -> None:
    rules = compile_rules(
        exclude_columns=['"my.schema"."T".secret*'],
        mask_columns=['"my.schema"."T".secret_2=redact', "t.email", "*.*.e?=truncate:2"],
        mask_key="k",
    )
    route = rules.route("my.schema", "T", ["id", "secret_1", "secret_2", "email"])
    assert route.excluded == {"secret_1", "secret_2"}  # excluded wins over masked
    assert route.masks == ()  # "t.email" folds to lower case: not table "T"
    route = rules.route("public", "t", ["email", "ex", "eyes"])
    assert [(c, m.spec) for c, m in route.masks] == [("email", "hash"), ("ex", "truncate:2")]
    with pytest.raises(ConfigError, match=r"\[SCHEMA.\]TABLE.COLUMN"):
        compile_rules(exclude_columns=['"a.b"'])


def test_key_columns_cannot_be_excluded_or_masked_but_by_hash() -> None:
    rules = compile_rules(exclude_columns=["t.id"], mask_columns=["t.k=redact"])
    with pytest.raises(ConfigError, match=r"id is a key column of public\.t"):
        rules.route("public", "t", ["id", "k"]).check_key("public.t", ("id",))
    with pytest.raises(ConfigError, match="only the hash mask keeps distinct keys distinct"):
        rules.route("public", "t", ["id", "k"]).check_key("public.t", ("k",))
    hashed = compile_rules(mask_columns=["t.k"], mask_key="x").route("public", "t", ["k"])
    hashed.check_key("public.t", ("k",))  # allowed


@pytest.mark.parametrize("key", ["k", "ключ", "x" * 100])  # > 64 bytes: hashed first (RFC 2104)
def test_the_masks_sql_gives_what_python_gives(
    pg_conn: psycopg.Connection[TupleRow], key: str
) -> None:
    values = ["ann@example.com", "", "naïve ☃ text", "42"]
    for mask in [Mask("hash", key=key.encode()), Mask("redact"), Mask("truncate", 3)]:
        for value in [*values, None]:
            expr = mask.sql(sql.Literal(value))
            row = pg_conn.execute(sql.SQL("SELECT {}::text").format(expr)).fetchone()
            assert row is not None
            expected = None if value is None else mask.apply(value.encode()).decode()
            assert row[0] == expected, (mask.spec, value)
    digest = hmac.new(key.encode(), b"42", hashlib.sha256).hexdigest()
    assert Mask("hash", key=key.encode()).apply(b"42").decode() == digest


# -- the stage, on pgoutput bytes (layouts in logical/decoder.py) -------------------------


class _Catalog:
    def primary_key(self, relid: int) -> tuple[str, ...]:
        return ("id",)


def _relation(oid: int, name: str, columns: list[str]) -> bytes:
    out = b"R" + struct.pack(">I", oid) + b"public\0" + name.encode() + b"\0f"
    out += struct.pack(">H", len(columns))
    for i, c in enumerate(columns):
        out += bytes([1]) + c.encode() + b"\0" + struct.pack(">Ii", 23 if i == 0 else 1043, -1)
    return out


def _tuple(values: list[bytes | str | None]) -> bytes:
    out = struct.pack(">H", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "u":
            out += b"u"
        else:
            assert isinstance(v, bytes)
            out += b"t" + struct.pack(">I", len(v)) + v
    return out


def _stage(**rules: object) -> tuple[RoutingStage, list[bytes]]:
    fed: list[bytes] = []

    def feed(payload: bytes | memoryview, lsn: int) -> int:
        fed.append(bytes(payload))
        return 0

    stage = RoutingStage(compile_rules(**rules), _Catalog(), lambda: feed)  # type: ignore[arg-type]
    return stage, fed


def test_the_stage_rewrites_relations_and_both_tuples_of_an_update() -> None:
    stage, fed = _stage(exclude_columns=["t.pw"], mask_columns=["t.email=truncate:3"])
    stage.feed(_relation(7, "t", ["id", "email", "pw", "big"]), 0)
    rel = decode(fed[-1])
    assert isinstance(rel, Relation)
    assert [(c.name, c.type_oid, c.type_modifier) for c in rel.columns] == [
        ("id", 23, -1),
        ("email", 25, -1),  # masked: text
        ("big", 1043, -1),
    ]
    old = _tuple([b"1", b"ann@x", b"secret", b"v"])
    new = _tuple([b"1", None, b"secret2", "u"])  # NULL and unchanged TOAST stay as they are
    stage.feed(b"U" + struct.pack(">I", 7) + b"O" + old + b"N" + new, 5)
    update = decode(fed[-1])
    assert isinstance(update, Update)
    assert update.old == (b"1", b"ann", b"v") and update.new == (b"1", None, UNCHANGED_TOAST)


def test_the_stage_leaves_out_filtered_truncates_and_checks_tuples() -> None:
    stage, fed = _stage(only=["a=insert", "b=truncate"])
    for oid, name in [(1, "a"), (2, "b"), (3, "c")]:
        stage.feed(_relation(oid, name, ["id"]), 0)
    truncate = b"T" + struct.pack(">IB", 3, 1) + struct.pack(">III", 1, 2, 3)
    stage.feed(truncate, 9)
    message = decode(fed[-1])
    assert isinstance(message, Truncate)
    assert message.relation_ids == (2, 3) and message.cascade
    fed.clear()
    stage.feed(b"T" + struct.pack(">IB", 1, 0) + struct.pack(">I", 1), 10)
    assert fed == []  # a truncate of none that passes: left out
    stage.feed(b"U" + struct.pack(">I", 1) + b"N" + _tuple([b"1"]), 11)
    assert fed == []
    assert stage.tag_counts[ord("T")] == 1 and stage.tag_counts[ord("U")] == 1  # received
    stage, fed = _stage(exclude_columns=["a.x"])
    stage.feed(_relation(1, "a", ["id", "x"]), 0)
    with pytest.raises(DecodeError, match="tuple of 1 columns for a relation announced with 2"):
        stage.feed(b"I" + struct.pack(">I", 1) + b"N" + _tuple([b"1"]), 0)
