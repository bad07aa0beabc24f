"""Output bytes unchanged: the golden workload through the real pipeline, byte for byte.

The frames a real PostgreSQL sent for tests/golden/workload.py (every built-in type and
arrays of them, NULLs, unchanged TOAST, a key-changing UPDATE, DELETE, TRUNCATE, DDL
with a new Schema record, logical messages) are replayed, with no PostgreSQL, through
the changelog into the file sink and into the Kafka sink (Avro with --tombstones, and
JSON) producing to the session's real broker and registry; what each wrote (the Kafka
messages read back from the broker, the schemas from the registry: pipeline.py) must
equal the golden files, under the C encoder and the Python path alike. files.py says
how the golden files are regenerated after an intended change.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from pg2sink.logical.copydata import XLOG_DATA_HEADER
from pg2sink.logical.decoder import MessageTag
from tests.golden.files import (
    DATA,
    FRAMES,
    FRAMES_STREAMED,
    check_or_write,
    first_difference,
    read_catalog,
    read_frames,
)
from tests.golden.pipeline import (
    FILE_OUTPUTS,
    IMPLEMENTATIONS,
    KAFKA_OUTPUTS,
    OUTPUTS,
    STREAMED,
    Broker,
    Input,
    implementation,
)
from tests.test_type_fidelity import CASES, row_count


def golden_input(streamed: bool) -> Input:
    return Input(read_frames(FRAMES_STREAMED if streamed else FRAMES), read_catalog(), streamed)


def output(name: str, source: Input, request: pytest.FixtureRequest) -> bytes:
    """The output `name` made from `source`; a Kafka one through the session's broker
    and registry (asked for only then: the file sink's tests need no server)."""
    if name in FILE_OUTPUTS:
        return FILE_OUTPUTS[name](source)
    broker = Broker(request.getfixturevalue("kafka_stack"), request.getfixturevalue("topic_prefix"))
    return KAFKA_OUTPUTS[name](source, broker)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OUTPUTS)
def test_output_equals_the_golden_file(
    name: str, impl: str, request: pytest.FixtureRequest
) -> None:
    with implementation(impl) as native:
        got = output(name, golden_input(streamed=False), request)
    if name.startswith("kafka_avro"):
        # the C encoder writes the tables whose types it knows (native: the workload's
        # table made for it), the Python path every one: a run tests what it says
        assert (native.tables > 0) == (impl == "c"), native
    check_or_write(name, got)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OUTPUTS)
def test_streamed_output_equals_the_golden_file(
    name: str, impl: str, request: pytest.FixtureRequest
) -> None:
    """--streaming: the first transaction arrived in blocks while it ran, with a
    subtransaction aborted after it was streamed; the records are those of the same
    transaction sent whole at commit (but for STREAMED)."""
    source = golden_input(streamed=True)
    tags = Counter(frame[XLOG_DATA_HEADER.size] for frame in source.frames)
    assert tags[MessageTag.STREAM_ABORT] and tags[MessageTag.STREAM_COMMIT], tags
    with implementation(impl):
        got = output(name, source, request)
    if name in STREAMED:
        check_or_write(STREAMED[name], got)
    else:  # not regenerated from here: the one golden file of both modes
        expected = (DATA / name).read_bytes()
        assert got == expected, f"{name}, streamed:\n{first_difference(expected, got)}"


def test_the_golden_output_covers_the_workload() -> None:
    """What the golden file sink output holds, so a recapture cannot quietly lose a case."""
    records = [json.loads(line) for line in (DATA / "file.jsonl").read_bytes().splitlines()]
    changes = [r for r in records if r["kind"] == "modification"]
    schemas = Counter(r["name"] for r in records if r["kind"] == "schema")
    assert schemas == {"fidelity": 1, "native": 1, "toasty": 2, "nokey": 1}  # DDL: toasty
    assert {r["operation"] for r in changes} == {"INSERT", "UPDATE", "DELETE", "TRUNCATE"}
    fidelity = [r for r in changes if r["name"] == "fidelity"]
    assert len(fidelity) == row_count() + 3
    zoo = {f"c_{case}" for case, _, _ in CASES} | {f"a_{case}" for case, _, _ in CASES}
    assert zoo <= set(fidelity[0]["after"])  # every type and array of it, NULLs included
    key_change = fidelity[row_count()]
    assert key_change["before"] == {"id": 0} and key_change["after"]["id"] == 100
    assert fidelity[-1]["before"]["c_text"] != fidelity[-1]["after"]["c_text"]  # FULL
    toasted = [r for r in changes if r["name"] == "toasty" and r["operation"] == "UPDATE"]
    assert all(r["after"]["big"] == {"unchanged_toast": True} for r in toasted)
    messages = [r for r in records if r["kind"] == "message"]
    assert [m["transactional"] for m in messages] == [True, False]
    truncated = [r["name"] for r in changes if r["operation"] == "TRUNCATE"]
    assert truncated == ["toasty", "nokey"]
