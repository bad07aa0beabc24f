"""The file sink on a real file: JSON lines, checkpoints, durability."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.errors import SinkError
from pg2sink.logical.messages import UNCHANGED_TOAST
from pg2sink.sinks.file import FileSink, record_line

T = datetime(2026, 11, 21, 2, 40, 21, 811015, tzinfo=UTC)
SCHEMA = Schema(T, 100, "public", "t", {"type": "record", "name": "value", "fields": []})


def modification(seq: int, after: dict[str, object]) -> Modification:
    return Modification(T, seq, 200 + seq, 7, Operation.INSERT, "public", "t", None, after)


def test_lines_and_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = FileSink(str(path))
    sink.open()
    assert sink.acknowledged() is None
    sink.write(SCHEMA)
    sink.write(modification(0, {"id": 1, "n": Decimal("1.50"), "big": UNCHANGED_TOAST}))
    sink.checkpoint(300)
    sink.write(modification(1, {"id": 2, "n": None, "big": "x"}))
    # written after the checkpoint: a flush now acknowledges 300, nothing later
    assert sink.flush() == 300
    assert sink.acknowledged() == 300
    sink.checkpoint(400)
    sink.close()
    assert sink.acknowledged() == 400  # close() flushes
    lines = [json.loads(line, parse_float=Decimal) for line in path.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["schema", "modification", "modification"]
    assert lines[0] == {
        "kind": "schema",
        "timestamp": "2026-11-21T02:40:21.811015Z",
        "lsn": 100,
        "namespace": "public",
        "name": "t",
        "schema": {"type": "record", "name": "value", "fields": []},
    }
    assert lines[1] == {
        "kind": "modification",
        "timestamp": "2026-11-21T02:40:21.811015Z",
        "sequence": 0,
        "lsn": 200,
        "xid": 7,
        "operation": "INSERT",
        "namespace": "public",
        "name": "t",
        "before": None,
        "after": {"id": 1, "n": Decimal("1.50"), "big": {"unchanged_toast": True}},
    }


def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text('{"kind":"old"}\n')
    sink = FileSink(str(path))
    sink.open()
    sink.write(SCHEMA)
    sink.close()
    assert path.read_text().splitlines()[0] == '{"kind":"old"}'
    assert len(path.read_text().splitlines()) == 2


def test_unwritable_path_is_a_sink_error(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="cannot open --file-path"):
        FileSink(str(tmp_path / "no" / "such" / "dir" / "out.jsonl")).open()


def test_write_before_open_is_a_sink_error() -> None:
    with pytest.raises(SinkError, match="not opened"):
        FileSink("-").write(SCHEMA)


def test_start_flush_acknowledges_after_a_background_fsync(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path / "out.jsonl"))
    sink.open()
    sink.write(modification(0, {"id": 1}))
    sink.checkpoint(300)
    sink.start_flush()  # returns at once; the fsync runs in a thread
    deadline = time.monotonic() + 10
    while sink.acknowledged() != 300:
        assert time.monotonic() < deadline, "the background fsync never finished"
        time.sleep(0.001)
    # more data while nothing is in flight: the next start_flush covers it
    sink.write(modification(1, {"id": 2}))
    sink.checkpoint(400)
    sink.start_flush()
    assert sink.flush() == 400  # waits for everything
    sink.close()
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2


def test_nothing_is_acknowledged_before_its_checkpoint(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path / "out.jsonl"))
    sink.open()
    sink.write(modification(0, {"id": 1}))  # no checkpoint: an open transaction
    sink.start_flush()
    time.sleep(0.05)
    assert sink.acknowledged() is None
    sink.close()


def test_pending_bytes_count_what_is_not_fsynced(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path / "out.jsonl"))
    sink.open()
    assert sink.pending_bytes() == 0
    sink.write(modification(0, {"id": 1}))
    sink.checkpoint(300)
    written = sink.pending_bytes()
    assert written == len((tmp_path / "out.jsonl").read_bytes()) + written  # still buffered
    assert written > 50
    sink.start_flush()
    deadline = time.monotonic() + 10
    while sink.acknowledged() != 300:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert sink.pending_bytes() == 0
    sink.close()


def test_write_new_row_writes_the_modification_line(tmp_path: Path) -> None:
    """The changelog's shortcut (no record object) and write(Modification) give the
    same bytes as the general encoder (record_line), whatever the values."""
    later = datetime(2026, 11, 21, 2, 40, 22, tzinfo=UTC)
    records = [
        modification(0, {"id": 1, "n": Decimal("1.50"), "big": UNCHANGED_TOAST, "s": "é\u2028"}),
        modification(1, {"id": 2, "n": None, "at": later}),
        Modification(later, 0, 300, 8, Operation.UPDATE, "s p", 't"q', {"id": 2}, {"id": 3}),
        Modification(later, 1, 301, 8, Operation.UPDATE, "public", "t", None, {}),
    ]
    shortcut, general = tmp_path / "shortcut.jsonl", tmp_path / "general.jsonl"
    sink = FileSink(str(shortcut))
    sink.open()
    for r in records:
        if r.before is None:
            assert r.after is not None
            sink.write_new_row(
                r.timestamp, r.sequence, r.lsn, r.xid, r.operation, r.namespace, r.name, r.after
            )
        else:
            sink.write(r)
    sink.close()
    written = FileSink(str(general))
    written.open()
    for r in records:
        written.write(r)
    written.close()
    expected = b"".join(record_line(r) for r in records)
    assert shortcut.read_bytes() == expected
    assert general.read_bytes() == expected
    assert json.loads(expected.splitlines()[2])["before"] == {"id": 2}
