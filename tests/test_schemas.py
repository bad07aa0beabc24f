"""The published Avro envelopes in schemas/ are valid Avro and match the records."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import fastavro

from pg2sink.changelog.records import Modification, Truncation

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


def test_envelopes_parse() -> None:
    for path in sorted(SCHEMAS.glob("*.avsc")):
        fastavro.parse_schema(json.loads(path.read_text()))


def test_modification_envelope_has_the_record_fields() -> None:
    schema = json.loads((SCHEMAS / "modification.avsc").read_text())
    # the record's fields, then the Avro-only list of unchanged TOAST fields, then the
    # options of a TRUNCATE (records.Truncation's own fields)
    assert [f["name"] for f in schema["fields"]] == [
        *(f.name for f in dataclasses.fields(Modification)),
        "unchanged_toast",
        "truncate",
    ]
    truncate = schema["fields"][-1]
    assert truncate["default"] is None and truncate["type"][0] == "null"
    own = [f.name for f in dataclasses.fields(Truncation)][len(dataclasses.fields(Modification)) :]
    assert [f["name"] for f in truncate["type"][1]["fields"]] == own
