"""decode() against bytes captured from PostgreSQL 15 (see golden.py), plus malformed input."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from pg2sink.errors import DecodeError
from pg2sink.logical import (
    UNCHANGED_TOAST,
    Begin,
    BinaryValue,
    Column,
    Commit,
    Delete,
    Insert,
    Message,
    MessageTag,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    UnchangedToast,
    Update,
    decode,
    parse_lsn,
)
from tests.logical import golden as g

TIME_1 = 0x000303BEE9BC4980  # commit time of the first transaction of the capture


def test_begin() -> None:
    assert decode(g.BEGIN) == Begin(final_lsn=parse_lsn("0/1544C38"), commit_time=TIME_1, xid=734)


def test_commit() -> None:
    assert decode(g.COMMIT) == Commit(
        flags=0,
        commit_lsn=parse_lsn("0/1544C38"),
        end_lsn=parse_lsn("0/1544C68"),
        commit_time=TIME_1,
    )


def test_origin_transaction() -> None:
    # pg_replication_origin_xact_setup('0/ABCDEF01', '2024-05-01 10:00:00+00') sets both the
    # origin LSN and the commit timestamp.
    commit_time = 767_872_800_000_000
    assert decode(g.BEGIN_WITH_ORIGIN) == Begin(parse_lsn("0/1546768"), commit_time, 746)
    assert decode(g.ORIGIN) == Origin(commit_lsn=parse_lsn("0/ABCDEF01"), name="upstream")
    assert decode(g.COMMIT_WITH_ORIGIN) == Commit(
        0, parse_lsn("0/1546768"), parse_lsn("0/15467B0"), commit_time
    )


def test_relation() -> None:
    assert decode(g.RELATION_USERS) == Relation(
        relation_id=g.USERS_OID,
        namespace="public",
        name="users",
        replica_identity="d",
        columns=(
            Column(flags=1, name="id", type_oid=23, type_modifier=-1),
            Column(0, "name", 25, -1),
            Column(0, "bio", 25, -1),
            Column(0, "m", g.MOOD_OID, -1),
            Column(0, "big", 25, -1),
        ),
    )


def test_relation_replica_identity_full_and_typmod() -> None:
    relation = decode(g.RELATION_FULL_T)
    assert isinstance(relation, Relation)
    assert relation.replica_identity == "f"
    # with REPLICA IDENTITY FULL every column is part of the key; varchar(10) is typmod 14
    assert relation.columns == (Column(1, "id", 23, -1), Column(1, "v", 1043, 14))
    assert [c.is_key for c in relation.columns] == [True, True]


def test_relation_is_key() -> None:
    relation = decode(g.RELATION_B)
    assert isinstance(relation, Relation)
    assert [c.is_key for c in relation.columns] == [True, False]


def test_type() -> None:
    assert decode(g.TYPE_MOOD) == Type(type_oid=g.MOOD_OID, namespace="public", name="mood")


def test_insert_text_and_null() -> None:
    assert decode(g.INSERT_USERS) == Insert(
        relation_id=g.USERS_OID,
        new=(b"1", "Zoë".encode(), None, b"happy", b"x" * 3000),
    )


def test_insert_six_text_columns() -> None:
    assert decode(g.INSERT_SIX) == Insert(
        g.SIX_OID, (b"alpha", b"bravo", b"charlie", b"delta", b"echo", b"foxtrot")
    )


def test_update_without_old_tuple_and_unchanged_toast() -> None:
    msg = decode(g.UPDATE_NO_OLD)
    assert msg == Update(
        relation_id=g.USERS_OID,
        old=None,
        old_is_key=False,
        new=(b"1", b"Zoe", None, b"happy", UNCHANGED_TOAST),
    )
    assert isinstance(msg, Update)
    assert msg.new[4] is UNCHANGED_TOAST


def test_update_old_key() -> None:
    assert decode(g.UPDATE_KEY) == Update(
        g.USERS_OID,
        old=(b"1", None, None, None, None),
        old_is_key=True,
        new=(b"2", b"Zoe", None, b"happy", UNCHANGED_TOAST),
    )


def test_update_old_full_row() -> None:
    assert decode(g.UPDATE_OLD) == Update(
        g.FULL_T_OID, old=(b"1", b"a"), old_is_key=False, new=(b"1", b"b")
    )


def test_delete_old_key() -> None:
    assert decode(g.DELETE_KEY) == Delete(
        g.USERS_OID, old=(b"2", None, None, None, None), old_is_key=True
    )


def test_delete_old_full_row() -> None:
    assert decode(g.DELETE_OLD) == Delete(g.FULL_T_OID, old=(b"1", b"b"), old_is_key=False)


def test_truncate_with_options() -> None:
    assert decode(g.TRUNCATE_CASCADE_RESTART) == Truncate(
        relation_ids=(g.A_OID, g.B_OID), cascade=True, restart_identity=True
    )


def test_truncate_without_options() -> None:
    assert decode(g.TRUNCATE_PLAIN) == Truncate((g.FULL_T_OID,), False, False)


def test_truncate_option_bits_separately() -> None:
    # hand-built from TRUNCATE_PLAIN: option byte 1 = CASCADE only, 2 = RESTART IDENTITY only
    cascade = bytearray(g.TRUNCATE_PLAIN)
    cascade[5] = 1
    restart = bytearray(g.TRUNCATE_PLAIN)
    restart[5] = 2
    assert decode(memoryview(cascade)) == Truncate((g.FULL_T_OID,), True, False)
    assert decode(memoryview(restart)) == Truncate((g.FULL_T_OID,), False, True)


def test_message_transactional() -> None:
    assert decode(g.MESSAGE_TRANSACTIONAL) == Message(
        transactional=True, lsn=parse_lsn("0/15463C8"), prefix="x", content=b"hello"
    )


def test_message_non_transactional() -> None:
    assert decode(g.MESSAGE_NON_TRANSACTIONAL) == Message(
        False, parse_lsn("0/1546430"), "nt", b"\x00\xff"
    )


def test_binary_values() -> None:
    assert decode(g.INSERT_FULL_T_BINARY) == Insert(
        g.FULL_T_OID, (BinaryValue(b"\x00\x00\x00\x01"), BinaryValue(b"a"))
    )


def test_all_tuple_kinds_in_one_message() -> None:
    # kinds 'b', 'n' (old key tuple) and 'u' (unchanged TOAST) together
    assert decode(g.UPDATE_KEY_BINARY) == Update(
        g.USERS_OID,
        old=(BinaryValue(b"\x00\x00\x00\x01"), None, None, None, None),
        old_is_key=True,
        new=(
            BinaryValue(b"\x00\x00\x00\x02"),
            BinaryValue(b"Zoe"),
            None,
            BinaryValue(b"happy"),
            UNCHANGED_TOAST,
        ),
    )


def test_memoryview_input() -> None:
    expected = decode(g.INSERT_USERS)
    framed = b"w" + bytes(24) + g.INSERT_USERS
    assert decode(memoryview(framed)[25:]) == expected
    msg = decode(memoryview(g.INSERT_SIX))
    assert isinstance(msg, Insert)
    assert all(type(v) is bytes for v in msg.new)


# -- streaming (protocol version 2) --------------------------------------------------------


def test_stream_start() -> None:
    assert decode(g.STREAM_START_FIRST) == StreamStart(xid=747, first_segment=True)
    assert decode(g.STREAM_START_NEXT) == StreamStart(xid=747, first_segment=False)


def test_stream_stop() -> None:
    assert decode(g.STREAM_STOP) == StreamStop()


def test_stream_commit() -> None:
    assert decode(g.STREAM_COMMIT) == StreamCommit(
        xid=747,
        flags=0,
        commit_lsn=parse_lsn("0/156DAB0"),
        end_lsn=parse_lsn("0/156DAE0"),
        commit_time=0x000303BEE9FA2AB3,
    )


def test_stream_abort() -> None:
    assert decode(g.STREAM_ABORT_TOP) == StreamAbort(xid=748, subxid=748)
    assert decode(g.STREAM_ABORT_SUBXACT) == StreamAbort(xid=749, subxid=750)


def test_stream_abort_with_protocol_v4_fields() -> None:
    # hand-built: PostgreSQL 16+ appends abort LSN and time with streaming 'parallel'
    assert decode(g.STREAM_ABORT_TOP + bytes(16)) == StreamAbort(748, 748)


def test_streamed_insert_carries_xid() -> None:
    assert decode(g.STREAM_INSERT_BIG, in_stream=True) == Insert(
        g.BIG_OID, (b"1", b"p" * 100), xid=747
    )
    # changes made in a subtransaction carry the subtransaction's xid
    assert decode(g.STREAM_INSERT_SUBXACT, in_stream=True) == Insert(
        g.BIG_OID, (b"282", b"r" * 100), xid=750
    )


def test_streamed_relation_and_type() -> None:
    assert decode(g.STREAM_RELATION_BIG, in_stream=True) == Relation(
        g.BIG_OID,
        "public",
        "big",
        "d",
        (Column(0, "id", 23, -1), Column(0, "payload", 25, -1)),
        747,
    )
    assert decode(g.STREAM_TYPE_MOOD, in_stream=True) == Type(g.MOOD_OID, "public", "mood", 752)


def test_streamed_update_delete_truncate_message() -> None:
    assert decode(g.STREAM_UPDATE_OLD, in_stream=True) == Update(
        g.FULL_T_OID, (b"2", b"x"), False, (b"2", b"y"), xid=753
    )
    assert decode(g.STREAM_DELETE_OLD, in_stream=True) == Delete(
        g.FULL_T_OID, (b"3", b"x"), False, xid=753
    )
    assert decode(g.STREAM_TRUNCATE, in_stream=True) == Truncate((g.SIX_OID,), False, False, 752)
    assert decode(g.STREAM_MESSAGE, in_stream=True) == Message(
        True, parse_lsn("0/15D1788"), "st", b"in-stream", xid=752
    )


def test_in_stream_does_not_affect_control_messages() -> None:
    for buf in (g.BEGIN, g.COMMIT, g.STREAM_START_NEXT, g.STREAM_STOP, g.STREAM_COMMIT):
        assert decode(buf, in_stream=True) == decode(buf)


def test_streamed_message_decoded_without_in_stream_is_rejected() -> None:
    with pytest.raises(DecodeError, match="expected 'N'"):
        decode(g.STREAM_INSERT_BIG)


# -- malformed input ---------------------------------------------------------------------


def test_golden_bytes_cover_every_message_tag() -> None:
    assert {buf[0] for buf, _ in g.PGOUTPUT_MESSAGES.values()} == set(MessageTag)


@pytest.mark.parametrize("name", sorted(g.PGOUTPUT_MESSAGES))
def test_every_truncation_raises_decode_error(name: str) -> None:
    buf, in_stream = g.PGOUTPUT_MESSAGES[name]
    decode(buf, in_stream=in_stream)  # the whole message is fine
    for cut in range(len(buf)):
        with pytest.raises(DecodeError):
            decode(buf[:cut], in_stream=in_stream)


@pytest.mark.parametrize("name", sorted(g.PGOUTPUT_MESSAGES))
def test_trailing_bytes_raise_decode_error(name: str) -> None:
    buf, in_stream = g.PGOUTPUT_MESSAGES[name]
    with pytest.raises(DecodeError):
        decode(buf + b"\x00", in_stream=in_stream)


def test_empty_message() -> None:
    with pytest.raises(DecodeError, match="empty"):
        decode(b"")


@pytest.mark.parametrize("tag", [b"Z", b"P", b"\x00", b"\xff"])
def test_unknown_tag(tag: bytes) -> None:
    with pytest.raises(DecodeError, match=rf"unknown pgoutput message tag .*0x{tag.hex()}"):
        decode(tag + bytes(20))


def test_truncated_error_names_the_message() -> None:
    with pytest.raises(DecodeError, match=r"truncated pgoutput BEGIN message.*offset 1"):
        decode(g.BEGIN[:10])


def test_value_length_past_the_end() -> None:
    # hand-built: INSERT_FULL_T with the length of 'a' raised from 1 to 2
    buf = bytearray(g.INSERT_FULL_T)
    buf[-2] = 2
    with pytest.raises(DecodeError, match="only 20"):
        decode(bytes(buf))


def test_unknown_tuple_kind() -> None:
    buf = bytearray(g.INSERT_FULL_T)
    buf[8] = ord("x")
    with pytest.raises(DecodeError, match=r"kind 'x' \(0x78\) at offset 8"):
        decode(bytes(buf))


def test_wrong_tuple_marker() -> None:
    buf = bytearray(g.INSERT_FULL_T)
    buf[5] = ord("K")
    with pytest.raises(DecodeError, match=r"expected 'N' \(new tuple\) in INSERT at offset 5"):
        decode(bytes(buf))
    buf = bytearray(g.DELETE_OLD)
    buf[5] = ord("N")
    with pytest.raises(DecodeError, match="'K' or 'O'"):
        decode(bytes(buf))


def test_unterminated_string() -> None:
    with pytest.raises(DecodeError, match="no terminating NUL byte"):
        decode(g.TYPE_MOOD[:-1])


def test_invalid_utf8_string() -> None:
    buf = g.TYPE_MOOD.replace(b"mood", b"mo\xffd")
    with pytest.raises(DecodeError, match="not valid UTF-8"):
        decode(buf)


def test_message_content_length_mismatch() -> None:
    with pytest.raises(DecodeError, match="MESSAGE content"):
        decode(g.MESSAGE_TRANSACTIONAL[:-1])


# -- the message classes -----------------------------------------------------------------


def test_unchanged_toast_singleton() -> None:
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"
    assert UnchangedToast() == UNCHANGED_TOAST
    assert copy.deepcopy(UNCHANGED_TOAST) is UNCHANGED_TOAST
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST


def test_messages_are_frozen_and_xid_defaults_to_none() -> None:
    msg = Insert(1, (b"a",))
    assert msg.xid is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.relation_id = 2  # type: ignore[misc]
    assert not hasattr(msg, "__dict__")
