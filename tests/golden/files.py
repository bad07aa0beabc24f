"""The golden files: their formats, reading, writing, and the rule for regenerating them.

Input (captured once from a real PostgreSQL by `python -m tests.golden.capture`):
  data/frames.bin     the XLogData CopyData messages of the workload, as the walsender
                      sent them (keepalives left out): each a 4-byte big-endian length and
                      the message
  data/frames_streamed.bin   the same from a --streaming session (protocol 2, the
                      first transaction sent while it ran): the output must be the same
  data/catalog.json   what the changelog asked pg_catalog while the frames were replayed
                      against the live server: types by oid, primary keys and partition
                      flags by relation oid (CatalogLookup answers)
Output (what pg2sink made of that input, byte for byte):
  data/file.jsonl         the file sink's output
  data/file.streamed.jsonl   the same from frames_streamed.bin (test_replay.STREAMED);
                          the other outputs are the same in both modes
  data/kafka_avro.jsonl   the Kafka sink's messages in Avro (--tombstones), as read back
                          from the broker: per message a JSON line {topic, key, value,
                          headers}, key and value in hex; grouped by topic (in name
                          order), each topic's in its partition's order; topic prefix
                          `golden`, schema ids those of the registry file
  data/kafka_avro.registry.json   the schemas it registered: [{id, subject, schema}], ids
                          1, 2... in order of registration (a fresh registry's; a run's
                          real ids are mapped to these: pipeline.py)
  data/kafka_json.jsonl   the Kafka sink's messages in --format json, key and value as
                          text, in the same order

Regenerating (after a change of the record bytes that is intended, and reviewed):
    PG2SINK_REGENERATE_GOLDEN=1 .venv/bin/pytest tests/golden/test_replay.py
rewrites the output files from the committed input (the Kafka ones through the session's
broker and registry: tests/conftest.py's kafka_stack), then fails on purpose, naming the
files, so that a regeneration is never mistaken for a pass; `git diff tests/golden/data`
shows what changed. It is refused where the CI variable is set.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pg2sink.catalog.catalog import CatalogLookup
from pg2sink.catalog.types import PgType

DATA = Path(__file__).resolve().parent / "data"
FRAMES = DATA / "frames.bin"
FRAMES_STREAMED = DATA / "frames_streamed.bin"
CATALOG = DATA / "catalog.json"

REGENERATE_VARIABLE = "PG2SINK_REGENERATE_GOLDEN"

_LENGTH = struct.Struct(">I")


# -- input ----------------------------------------------------------------------------


def write_frames(path: Path, frames: Iterable[bytes]) -> None:
    """Length-prefixed frames (see the module docstring)."""
    path.write_bytes(b"".join(_LENGTH.pack(len(f)) + f for f in frames))


def read_frames(path: Path) -> list[bytes]:
    """The frames write_frames wrote, in order."""
    data = path.read_bytes()
    frames, pos = [], 0
    while pos < len(data):
        (size,) = _LENGTH.unpack_from(data, pos)
        pos += _LENGTH.size
        frames.append(data[pos : pos + size])
        pos += size
    return frames


class RecordedCatalog:
    """CatalogLookup answering from recorded facts; with `live`, it asks that catalog and
    records the answers (the capture), else a question it has no answer to fails."""

    def __init__(self, live: CatalogLookup | None = None) -> None:
        self.live = live
        self.types: dict[int, PgType] = {}
        self.keys: dict[int, tuple[str, ...]] = {}
        self.partitions: dict[int, bool] = {}

    def pg_type(self, oid: int) -> PgType:
        if self.live is not None:
            self.types[oid] = self.live.pg_type(oid)
        return self.types[oid]

    def invalidate_type(self, oid: int) -> None:
        if self.live is not None:
            self.live.invalidate_type(oid)

    def primary_key(self, relid: int) -> tuple[str, ...]:
        if self.live is not None:
            self.keys[relid] = self.live.primary_key(relid)
        return self.keys[relid]

    def is_partition(self, relid: int) -> bool:
        if self.live is not None:
            self.partitions[relid] = self.live.is_partition(relid)
        return self.partitions[relid]

    def to_json(self) -> dict[str, Any]:
        """The facts as JSON: every type flat, element and base by oid."""
        flat: dict[int, dict[str, Any]] = {}
        pending = list(self.types.values())
        while pending:
            t = pending.pop()
            if t.oid in flat:
                continue
            flat[t.oid] = {
                "name": t.name,
                "namespace": t.namespace,
                "kind": t.kind,
                "category": t.category,
                "element": t.element.oid if t.element else None,
                "base": t.base.oid if t.base else None,
                "base_typmod": t.base_typmod,
                "enum_labels": list(t.enum_labels) if t.enum_labels is not None else None,
                "delimiter": t.delimiter,
            }
            pending += [r for r in (t.element, t.base) if r is not None]
        return {
            "types": {str(oid): flat[oid] for oid in sorted(flat)},
            "primary_keys": {str(r): list(k) for r, k in sorted(self.keys.items())},
            "partitions": {str(r): p for r, p in sorted(self.partitions.items())},
        }

    @classmethod
    def from_json(cls, facts: Mapping[str, Any]) -> RecordedCatalog:
        """The catalog to_json described."""
        catalog = cls()
        rows = {int(oid): row for oid, row in facts["types"].items()}

        def build(oid: int) -> PgType:
            if oid not in catalog.types:
                row = rows[oid]
                labels = row["enum_labels"]
                catalog.types[oid] = PgType(
                    oid=oid,
                    name=row["name"],
                    namespace=row["namespace"],
                    kind=row["kind"],
                    category=row["category"],
                    element=build(row["element"]) if row["element"] is not None else None,
                    base=build(row["base"]) if row["base"] is not None else None,
                    base_typmod=row["base_typmod"],
                    enum_labels=tuple(labels) if labels is not None else None,
                    delimiter=row["delimiter"],
                )
            return catalog.types[oid]

        for oid in rows:
            build(oid)
        catalog.keys = {int(r): tuple(k) for r, k in facts["primary_keys"].items()}
        catalog.partitions = {int(r): bool(p) for r, p in facts["partitions"].items()}
        return catalog


def read_catalog(path: Path = CATALOG) -> RecordedCatalog:
    return RecordedCatalog.from_json(json.loads(path.read_text()))


def write_catalog(path: Path, catalog: RecordedCatalog) -> None:
    facts = catalog.to_json()
    # one type per line: small, and a diff names the type that changed
    parts = [
        f"{json.dumps(part)}: {{\n"
        + ",\n".join(
            f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in items.items()
        )
        + "\n}"
        for part, items in facts.items()
    ]
    path.write_text("{\n" + ",\n".join(parts) + "\n}\n")


# -- output ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaMessage:
    """One produced message, as the producer was handed it."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def kafka_lines(messages: Sequence[KafkaMessage], text: bool) -> bytes:
    """The golden file form of `messages`: key and value as text (`text`, the JSON
    format) or hex (Avro)."""

    def show(data: bytes | None) -> str | None:
        if data is None:
            return None
        return data.decode() if text else data.hex()

    lines = [
        json.dumps(
            {
                "topic": m.topic,
                "key": show(m.key),
                "value": show(m.value),
                "headers": [[k, v.decode()] for k, v in m.headers],
            },
            ensure_ascii=False,
        )
        for m in messages
    ]
    return "".join(line + "\n" for line in lines).encode()


def parse_kafka_lines(data: bytes, text: bool) -> list[KafkaMessage]:
    """The messages kafka_lines wrote."""

    def load(shown: str | None) -> bytes | None:
        if shown is None:
            return None
        return shown.encode() if text else bytes.fromhex(shown)

    out = []
    for line in data.splitlines():
        obj = json.loads(line)
        headers = tuple((k, v.encode()) for k, v in obj["headers"])
        out.append(KafkaMessage(obj["topic"], load(obj["key"]), load(obj["value"]), headers))
    return out


def registry_json(registered: Sequence[tuple[int, str, Mapping[str, Any]]]) -> bytes:
    """The golden file form of the registered schemas, (id, subject, schema) each."""
    items = [
        json.dumps({"id": i, "subject": s, "schema": schema}, ensure_ascii=False)
        for i, s, schema in registered
    ]
    return ("[\n" + ",\n".join(items) + "\n]\n").encode()  # one schema per line


def schemas_by_id(data: bytes) -> dict[int, dict[str, Any]]:
    """Schema by id from a registry_json file."""
    return {item["id"]: item["schema"] for item in json.loads(data)}


def regenerating() -> bool:
    """Whether this run rewrites the golden output (refused under CI)."""
    if os.environ.get(REGENERATE_VARIABLE, "") in ("", "0"):
        return False
    if os.environ.get("CI"):
        pytest.fail(f"{REGENERATE_VARIABLE} is refused under CI: regenerate locally and commit")
    return True


def check_or_write(name: str, got: bytes) -> None:
    """Compare `got` with the golden file data/`name`, or (regenerating) rewrite the file
    and fail, so that a regeneration never passes for a green run."""
    path = DATA / name
    if regenerating():
        path.write_bytes(got)
        pytest.fail(
            f"{path} regenerated ({len(got):,} bytes): review `git diff {DATA}`, commit, "
            f"and run again without {REGENERATE_VARIABLE}"
        )
    if not path.exists():
        pytest.fail(f"{path} is missing: see {__name__}'s docstring to regenerate it")
    expected = path.read_bytes()
    if got != expected:
        pytest.fail(f"{name} differs from the golden file:\n{first_difference(expected, got)}")


def first_difference(expected: bytes, got: bytes) -> str:
    """Where two outputs first differ, by line, for the failure message."""
    want, have = expected.splitlines(), got.splitlines()
    for i, (a, b) in enumerate(zip(want, have, strict=False)):
        if a != b:
            return f"line {i + 1}:\n  golden: {_clip(a)}\n  got:    {_clip(b)}"
    return f"golden has {len(want)} lines, got {len(have)} (the common lines are equal)"


def _clip(line: bytes, width: int = 600) -> str:
    text = line.decode(errors="replace")
    return text if len(text) <= width else text[:width] + f"... ({len(text)} chars)"
