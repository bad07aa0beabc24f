"""normalize.py forgets what differs between runs, and nothing else.

A second run is simulated from the golden output itself: every LSN and xid moved by a
constant (JSON fields, Avro envelope longs, headers), the schema ids renumbered, another
topic prefix. That must normalize to the same; a changed value, a record moved to
another transaction, or a changed Avro body byte must not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tests.golden.files import DATA, KafkaMessage, parse_kafka_lines, schemas_by_id
from tests.golden.normalize import _zigzag, json_lines, kafka_messages
from tests.golden.pipeline import TOPIC_PREFIX

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
    value = live[1].value
    assert value is not None
    one_byte = KafkaMessage(live[1].topic, live[1].key, value[:-1] + b"\1", live[1].headers)
    broken = [*live[:1], one_byte, *live[2:]]
    assert kafka_messages(broken, "live", live_schemas.__getitem__) != want
