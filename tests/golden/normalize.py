"""Outputs of two runs of the workload, made comparable: only the volatile fields change.

A live run differs from the golden one in its LSNs, xids, commit times, schema ids and
topic prefix, and in nothing else. Those are found by structure, never by a pattern over
text:
- a JSON record (file sink line, Kafka JSON value, Message value): its `lsn`, `xid` and
  `timestamp` keys;
- an Avro value (Confluent wire format): the schema id in bytes 1-4, replaced by the
  schema it names; the body's leading fields timestamp, sequence, lsn, xid (longs, as
  the registered schema says: checked), the rest of the body kept as bytes;
- an Avro key: the schema id, the body as is;
- Kafka headers lsn and xid; the topic's prefix.
Each LSN and xid is replaced by its rank among the run's values of that field (0 for the
smallest), so equality and order between records are still compared while the numbers
themselves are not. A commit time is replaced by a mark alone: two transactions in a
row may commit within the same microsecond in one run and not in the other (the xid
ranks say which records share a transaction). The rest must be equal exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.golden.files import KafkaMessage

VOLATILE = ("timestamp", "lsn", "xid")
#: the first fields of the Avro Modification envelope: (field, volatile)
_ENVELOPE_HEAD = (("timestamp", True), ("sequence", False), ("lsn", True), ("xid", True))
_HEADERS = {"lsn", "xid"}


@dataclass(frozen=True)
class Volatile:
    """A value that differs between runs, until `ranked` replaces it by its rank."""

    field: str
    value: object


class Exact(str):
    """A JSON number's literal as written (exact: no float rounding, -0 kept)."""


def json_record(data: bytes) -> dict[str, Any]:
    """A JSON record with its volatile fields marked."""
    record: dict[str, Any] = json.loads(data, parse_int=Exact, parse_float=Exact)
    for field in VOLATILE:
        if record.get(field) is not None:
            record[field] = Volatile(field, record[field])
    return record


def ranked(items: Any) -> Any:
    """`items` with every Volatile replaced by ('<field>', rank), a time by a mark."""
    values: dict[str, set[tuple[int, str]]] = {}

    def collect(v: Volatile) -> Volatile:
        values.setdefault(v.field, set()).add(_sort_key(v.value))
        return v

    _replace(items, collect)
    ranks = {f: {v: i for i, v in enumerate(sorted(vs))} for f, vs in values.items()}

    def new(v: Volatile) -> object:
        if v.field == "timestamp":
            return "<timestamp>"
        return (f"<{v.field}>", ranks[v.field][_sort_key(v.value)])

    return _replace(items, new)


def _sort_key(value: object) -> tuple[int, str]:
    """LSNs and xids compare as numbers, whether from JSON, Avro or a header's text."""
    text = str(value)
    return len(text), text


def _replace(item: Any, new: Callable[[Volatile], object]) -> Any:
    if isinstance(item, Volatile):
        return new(item)
    if isinstance(item, dict):
        return {k: _replace(v, new) for k, v in item.items()}
    if isinstance(item, list):
        return [_replace(v, new) for v in item]
    if isinstance(item, tuple):
        return tuple(_replace(v, new) for v in item)
    return item


def json_lines(data: bytes) -> list[Any]:
    """A file sink's output, normalized."""
    return ranked([json_record(line) for line in data.splitlines()])  # type: ignore[no-any-return]


def _zigzag(data: bytes, pos: int) -> tuple[int, int]:
    """An Avro long at `pos`: (value, position after it)."""
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos


def canonical(schema: Mapping[str, Any] | str) -> str:
    """A schema's JSON with sorted keys (a registry may reformat what it was given)."""
    parsed = json.loads(schema) if isinstance(schema, str) else schema
    return json.dumps(parsed, sort_keys=True)


def avro_value(data: bytes, schemas: Callable[[int], Mapping[str, Any]]) -> tuple[Any, ...]:
    """A Modification's Avro value, its volatile fields marked; `schemas` by id."""
    assert data[0] == 0, "not the Confluent wire format"
    schema = schemas(int.from_bytes(data[1:5], "big"))
    names = [f["name"] for f in schema["fields"][: len(_ENVELOPE_HEAD)]]
    assert names == [name for name, _ in _ENVELOPE_HEAD], names
    out: list[object] = [canonical(schema)]
    pos = 5
    for field, volatile in _ENVELOPE_HEAD:
        value, pos = _zigzag(data, pos)
        out.append(Volatile(field, value) if volatile else value)
    out.append(data[pos:])
    return tuple(out)


def avro_key(data: bytes, schemas: Callable[[int], Mapping[str, Any]]) -> tuple[str, bytes]:
    """An Avro key: its schema and body."""
    assert data[0] == 0, "not the Confluent wire format"
    return canonical(schemas(int.from_bytes(data[1:5], "big"))), data[5:]


def kafka_messages(
    messages: Iterable[KafkaMessage],
    prefix: str,
    schemas: Callable[[int], Mapping[str, Any]] | None,
) -> dict[str, list[Any]]:
    """A Kafka output, normalized: per topic (without `prefix`), its messages in order.
    `schemas`: the registry's schema by id (Avro), None for --format json."""
    by_topic: dict[str, list[Any]] = {}
    for m in messages:
        assert m.topic.startswith(prefix + "."), m.topic
        topic = m.topic[len(prefix) :]
        headers = {k: Volatile(k, v.decode()) if k in _HEADERS else v for k, v in m.headers}
        if m.value is None or m.value.startswith(b"{"):  # tombstone, JSON, Message record
            value: Any = None if m.value is None else json_record(m.value)
        else:
            assert schemas is not None
            value = avro_value(m.value, schemas)
        key: Any = m.key
        if m.key is not None and schemas is not None and topic != ".messages":
            key = avro_key(m.key, schemas)
        by_topic.setdefault(topic, []).append((key, value, sorted(headers.items())))
    return ranked(by_topic)  # type: ignore[no-any-return]
