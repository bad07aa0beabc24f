"""render(): the one-line form printed by `pg2sink --decode-only`."""

from __future__ import annotations

import pytest

from pg2sink.logical import (
    UNCHANGED_TOAST,
    Begin,
    BinaryValue,
    Column,
    Commit,
    Delete,
    Insert,
    Relation,
    Update,
    decode,
    render,
)
from tests.logical import golden as g


def _relation(buf: bytes) -> Relation:
    msg = decode(buf)
    assert isinstance(msg, Relation)
    return msg


RELATIONS = {
    r.relation_id: r
    for r in map(
        _relation,
        [g.RELATION_USERS, g.RELATION_FULL_T, g.RELATION_A, g.RELATION_B, g.RELATION_SIX],
    )
}


@pytest.mark.parametrize(
    ("buf", "expected"),
    [
        (
            g.BEGIN,
            "BEGIN xid=734 final_lsn=0/1544C38 commit_time=2026-11-21T02:30:30.232448+00:00",
        ),
        (
            g.COMMIT,
            "COMMIT lsn=0/1544C38 end_lsn=0/1544C68 commit_time=2026-11-21T02:30:30.232448+00:00",
        ),
        (
            g.BEGIN_WITH_ORIGIN,
            "BEGIN xid=746 final_lsn=0/1546768 commit_time=2024-05-01T10:00:00+00:00",
        ),
        (g.ORIGIN, "ORIGIN 'upstream' commit_lsn=0/ABCDEF01"),
        (
            g.RELATION_USERS,
            "RELATION 16391 public.users replica_identity=d columns=[id int4(key), name text, "
            "bio text, m oid=16385, big text]",
        ),
        (
            g.RELATION_FULL_T,
            "RELATION 16398 public.full_t replica_identity=f "
            "columns=[id int4(key), v varchar(key) typmod=14]",
        ),
        (g.TYPE_MOOD, "TYPE 16385 public.mood"),
        (
            g.INSERT_SIX,
            "INSERT public.six new=(c1='alpha', c2='bravo', c3='charlie', c4='delta', "
            "c5='echo', c6='foxtrot')",
        ),
        (
            g.UPDATE_NO_OLD,
            "UPDATE public.users new=(id='1', name='Zoe', bio=NULL, m='happy', "
            "big=<unchanged-toast>)",
        ),
        (
            g.UPDATE_KEY,
            "UPDATE public.users old[key]=(id='1') new=(id='2', name='Zoe', bio=NULL, m='happy', "
            "big=<unchanged-toast>)",
        ),
        (
            g.UPDATE_OLD,
            "UPDATE public.full_t old[full]=(id='1', v='a') new=(id='1', v='b')",
        ),
        (g.DELETE_KEY, "DELETE public.users old[key]=(id='2')"),
        (g.DELETE_OLD, "DELETE public.full_t old[full]=(id='1', v='b')"),
        (g.TRUNCATE_CASCADE_RESTART, "TRUNCATE public.a, public.b cascade restart_identity"),
        (g.TRUNCATE_PLAIN, "TRUNCATE public.full_t"),
        (
            g.MESSAGE_TRANSACTIONAL,
            "MESSAGE transactional lsn=0/15463C8 prefix='x' content=b'hello'",
        ),
        (
            g.MESSAGE_NON_TRANSACTIONAL,
            "MESSAGE non-transactional lsn=0/1546430 prefix='nt' content=b'\\x00\\xff'",
        ),
        (
            g.INSERT_FULL_T_BINARY,
            "INSERT public.full_t new=(id=<binary 00000001>, v=<binary 61>)",
        ),
        (g.STREAM_START_FIRST, "STREAM START xid=747 first_segment"),
        (g.STREAM_START_NEXT, "STREAM START xid=747"),
        (g.STREAM_STOP, "STREAM STOP"),
        (
            g.STREAM_COMMIT,
            "STREAM COMMIT xid=747 lsn=0/156DAB0 end_lsn=0/156DAE0 "
            "commit_time=2026-11-21T02:30:34.287795+00:00",
        ),
        (g.STREAM_ABORT_SUBXACT, "STREAM ABORT xid=749 subxid=750"),
    ],
)
def test_render(buf: bytes, expected: str) -> None:
    assert render(decode(buf), RELATIONS) == expected


def test_render_utf8_text() -> None:
    assert render(decode(g.INSERT_USERS), RELATIONS).startswith(
        "INSERT public.users new=(id='1', name='Zoë', bio=NULL, m='happy', big='xxx"
    )


def test_render_streamed_messages_show_xid() -> None:
    assert (
        render(decode(g.STREAM_TRUNCATE, in_stream=True), RELATIONS)
        == "TRUNCATE public.six xid=752"
    )
    assert (
        render(decode(g.STREAM_DELETE_OLD, in_stream=True), RELATIONS)
        == "DELETE public.full_t old[full]=(id='3', v='x') xid=753"
    )
    assert render(decode(g.STREAM_INSERT_BIG, in_stream=True), {}) == (
        f"INSERT relation#{g.BIG_OID} new=($1='1', $2='{'p' * 100}') xid=747"
    )


def test_render_unknown_relation() -> None:
    assert render(decode(g.DELETE_KEY), {}) == (
        "DELETE relation#16391 old[key]=($1='2', $2=NULL, $3=NULL, $4=NULL, $5=NULL)"
    )
    assert render(decode(g.TRUNCATE_CASCADE_RESTART), {}) == (
        "TRUNCATE relation#16402, relation#16408 cascade restart_identity"
    )


def test_render_relation_out_of_step_with_tuple() -> None:
    # a stale relation map: fewer columns than the tuple, or more
    one = {1: Relation(1, "s", "t", "d", (Column(1, "id", 23, -1),))}
    assert render(Insert(1, (b"1", None)), one) == "INSERT s.t new=(id='1', $2=NULL)"
    assert render(Insert(1, ()), one) == "INSERT s.t new=()"
    assert render(Delete(1, (b"1", b"x"), True), one) == "DELETE s.t old[key]=(id='1', $2='x')"


def test_render_odd_values() -> None:
    relations = {1: Relation(1, "", "pg_t", "n", ())}
    msg = Update(1, None, False, (b"\xff", UNCHANGED_TOAST, BinaryValue(b"")))
    assert render(msg, relations) == (
        "UPDATE pg_catalog.pg_t new=($1='\ufffd', $2=<unchanged-toast>, $3=<binary >)"
    )


def test_render_values_outside_datetime_and_lsn_range() -> None:
    assert render(Begin(0, 2**63 - 1, 1), {}) == (
        "BEGIN xid=1 final_lsn=0/0 commit_time=9223372036854775807us"
    )
    assert render(
        Commit(
            0,
            -1,
            0,
            0,
        ),
        {},
    ).startswith("COMMIT lsn=-1 end_lsn=0/0")


def test_render_never_raises_on_any_golden_message() -> None:
    for buf, in_stream in g.PGOUTPUT_MESSAGES.values():
        msg = decode(buf, in_stream=in_stream)
        assert render(msg, RELATIONS)
        assert render(msg, {})
