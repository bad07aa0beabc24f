"""normalize.py forgets what differs between runs, and nothing else.

A second run is simulated from the golden output itself: every LSN and xid moved by a
constant (JSON fields, Avro envelope longs, headers), the schema ids renumbered, another
topic prefix. That must normalize to the same; a changed value, a record moved to
another transaction, or a changed Avro body byte must not. The same for the replay's
golden form (pipeline.py), which renames the registry's schema ids and the prefix only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pytest

from tests.golden.files import DATA, KafkaMessage, kafka_lines, parse_kafka_lines, schemas_by_id
from tests.golden.normalize import _zigzag, json_lines, kafka_messages
from tests.golden.pipeline import TOPIC_PREFIX, golden_ids, golden_message

SHIFT = 1_000_003
ID_SHIFT = 100


def _long(value: int) -> bytes:
    """Avro's zigzag varint of a long."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _shift_json(data: bytes) -> bytes:
    """lsn and xid moved; by text, as json.dumps would rewrite number literals (1e308)
    that the comparison keeps exact: a record's own keys come before its row images."""
    for field in (b"lsn", b"xid"):
        data = re.sub(
            b'"' + field + rb'":(\d+)',
            lambda m: m.group(0)[: -len(m.group(1))] + str(int(m.group(1)) + SHIFT).encode(),
            data,
            count=1,
        )
    return data


def _shift_avro(data: bytes, value: bool) -> bytes:
    """Another schema id; for a value, lsn and xid (fields 3 and 4) moved too."""
    head = b"\0" + (int.from_bytes(data[1:5], "big") + ID_SHIFT).to_bytes(4, "big")
    if not value:
        return head + data[5:]
    fields, pos = [], 5
    for _ in range(4):
        n, pos = _zigzag(data, pos)
        fields.append(n)
    fields[2] += SHIFT
    fields[3] += SHIFT
    return head + b"".join(map(_long, fields)) + data[pos:]


def _another_run(m: KafkaMessage) -> KafkaMessage:
    value = m.value
    if value is not None:
        value = _shift_json(value) if value.startswith(b"{") else _shift_avro(value, True)
    key = m.key
    if key is not None and key.startswith(b"\0"):
        key = _shift_avro(key, False)
    headers = tuple(
        (k, str(int(v) + SHIFT).encode() if k in ("lsn", "xid") else v) for k, v in m.headers
    )
    return KafkaMessage("live" + m.topic[len(TOPIC_PREFIX) :], key, value, headers)


def _golden_avro() -> tuple[list[KafkaMessage], dict[int, Any]]:
    messages = parse_kafka_lines((DATA / "kafka_avro.jsonl").read_bytes(), text=False)
    return messages, schemas_by_id((DATA / "kafka_avro.registry.json").read_bytes())


def test_json_records_compare_without_lsn_and_xid() -> None:
    golden = (DATA / "file.jsonl").read_bytes().splitlines()
    shifted = [_shift_json(line) for line in golden]
    assert json_lines(b"\n".join(shifted)) == json_lines(b"\n".join(golden))
    changed = list(shifted)
    changed[2] = changed[2].replace(b'"c_int2":-32768', b'"c_int2":-32767')
    assert changed[2] != shifted[2]
    assert json_lines(b"\n".join(changed)) != json_lines(b"\n".join(golden))
    # the last record (TRUNCATE of nokey) into another transaction than its neighbour's
    moved = [*shifted[:-1], shifted[-1].replace(b'"xid":', b'"xid":1')]
    assert json_lines(b"\n".join(moved)) != json_lines(b"\n".join(golden))


def test_kafka_avro_compares_without_schema_ids_lsn_and_xid() -> None:
    golden, schemas = _golden_avro()
    live = [_another_run(m) for m in golden]
    live_schemas: Mapping[int, Any] = {i + ID_SHIFT: s for i, s in schemas.items()}
    want = kafka_messages(golden, TOPIC_PREFIX, schemas.__getitem__)
    assert kafka_messages(live, "live", live_schemas.__getitem__) == want
    i = _first_avro_value(live)
    value = live[i].value
    assert value is not None
    one_byte = KafkaMessage(live[i].topic, live[i].key, value[:-1] + b"\1", live[i].headers)
    assert value != one_byte.value
    broken = [*live[:i], one_byte, *live[i + 1 :]]
    assert kafka_messages(broken, "live", live_schemas.__getitem__) != want


def _first_avro_value(messages: list[KafkaMessage]) -> int:
    """The index of the first message with a value in Confluent's framing (the first
    topics are the Message records', JSON)."""
    return next(i for i, m in enumerate(messages) if m.value and m.value.startswith(b"\0"))


# -- the replay's golden form (pipeline.py): registry ids renamed, nothing else --------


def _as_read_back(m: KafkaMessage, ids: Mapping[int, int]) -> KafkaMessage:
    """A golden message as a broker would hand it back from a run under prefix `live`
    whose registry gave id `ids[golden id]` (schema ids only in framed keys and values)."""
    topic = "live" + m.topic[len(TOPIC_PREFIX) :]
    if topic == "live.messages":
        return KafkaMessage(topic, m.key, m.value, m.headers)

    def renamed(data: bytes | None) -> bytes | None:
        if data is None:
            return None
        golden = int.from_bytes(data[1:5], "big")
        return data[:1] + ids[golden].to_bytes(4, "big") + data[5:]

    return KafkaMessage(topic, renamed(m.key), renamed(m.value), m.headers)


def test_the_replays_golden_form_changes_schema_ids_alone() -> None:
    """A changed Avro body byte, magic byte or schema, or an id the registry does not
    hold for the subject, stays a difference from the golden file."""
    golden, schemas = _golden_avro()
    registered = json.loads((DATA / "kafka_avro.registry.json").read_bytes())
    # a registry sharing ids across subjects, in another order: 300 - golden id
    ids = {item["id"]: 300 - item["id"] for item in registered}
    logged = [
        (ids[r["id"]], "live" + r["subject"][len(TOPIC_PREFIX) :], r["schema"]) for r in registered
    ]
    held: dict[str, list[tuple[int, Any]]] = {}
    for real_id, subject, schema in logged:
        held.setdefault(subject, []).append((real_id, schema))
    golden_id = golden_ids(logged, held)
    read = [_as_read_back(m, ids) for m in golden]
    expected = kafka_lines(golden, text=False)

    def form(messages: list[KafkaMessage]) -> bytes:
        return kafka_lines([golden_message(m, "live", golden_id) for m in messages], False)

    assert form(read) == expected
    i = _first_avro_value(read)
    m = read[i]
    assert m.value is not None and m.key is not None
    for changed in (
        m.value[:-1] + bytes([m.value[-1] ^ 1]),  # the body's last byte
        b"\1" + m.value[1:],  # the magic byte
        m.value[:1] + m.key[1:5] + m.value[5:],  # the id of the key's schema, held
    ):
        other = KafkaMessage(m.topic, m.key, changed, m.headers)
        assert form([*read[:i], other, *read[i + 1 :]]) != expected
    # the registry holding another schema than was registered
    first = next(iter(held))
    wrong = {**held, first: [(held[first][0][0], schemas[2])]}
    with pytest.raises(AssertionError, match="the registry holds"):
        golden_ids(logged, wrong)
