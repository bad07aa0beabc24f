"""The file sink on a real file: JSON lines, checkpoints, durability."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from pg2sink.changelog.records import Modification, Operation, Schema
from pg2sink.errors import SinkError
from pg2sink.formats.jsonlines import NewRowLines, record_line
from pg2sink.logical.messages import UNCHANGED_TOAST
from pg2sink.sinks.file import FileSink, append_lines
from tests.conftest import wait_for

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
    """The row writer's lines (NewRowLines, no record object) and write(Modification)
    give the same bytes as the general encoder (record_line), whatever the values."""
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
    lines = NewRowLines("public", "t", newline=True)
    for r in records:
        if r.before is None:
            assert r.after is not None and (r.namespace, r.name) == ("public", "t")
            sink._append(lines.encode(r.timestamp, r.sequence, r.lsn, r.xid, r.operation, r.after))
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


#: A line cut by a kill -9 inside its write(2), as the issue found it in a file.
TORN = b'{"kind":"modification","timestamp":"2026-11-21T02:40:21Z","operatio'


def strict_lines(path: Path) -> list[dict[str, object]]:
    """Every line of the file parsed; a torn or glued line fails (tests/conftest.py's
    read_jsonl skips them)."""
    data = path.read_bytes()
    assert data.endswith(b"\n") or not data, f"a partial last line: {data[-80:]!r}"
    return [json.loads(line) for line in data.splitlines()]


def torn_file(path: Path) -> bytes:
    """A file of one whole line and a torn one; the whole line."""
    whole = record_line(SCHEMA)
    path.write_bytes(whole + TORN)
    return whole


def test_open_cuts_a_torn_last_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "out.jsonl"
    whole = torn_file(path)
    sink = FileSink(str(path))
    with caplog.at_level(logging.WARNING, logger="pg2sink.sinks.file"):
        sink.open()
    assert path.read_bytes() == whole  # repaired at open, before anything is written
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"partial line of {len(TORN)} bytes" in warnings[0]
    sink.write(modification(0, {"id": 1}))
    sink.checkpoint(300)
    sink.close()
    assert [r["kind"] for r in strict_lines(path)] == ["schema", "modification"]
    caplog.clear()
    again = FileSink(str(path))
    again.open()  # whole lines: nothing to say
    again.close()
    assert not caplog.records


def test_a_torn_line_of_only_part_of_a_line_is_cut_whole(tmp_path: Path) -> None:
    """No newline at all: the file is one torn line, and nothing is left of it."""
    path = tmp_path / "out.jsonl"
    path.write_bytes(TORN * 5000)  # longer than one backwards read step
    sink = FileSink(str(path))
    sink.open()
    assert path.read_bytes() == b""
    sink.close()


def test_the_executors_append_cuts_a_torn_last_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An import executor appending after a crash repairs the file before its lines."""
    path = tmp_path / "out.jsonl"
    whole = torn_file(path)
    line = record_line(modification(0, {"id": 1}))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        with caplog.at_level(logging.WARNING, logger="pg2sink.sinks.file"):
            append_lines(fd, line)
    finally:
        os.close(fd)
    assert path.read_bytes() == whole + line
    # named by the descriptor's path: the driver's Schema line passes none
    assert [r.getMessage() for r in caplog.records] == [
        f"--file-path {path} ended in a partial line of {len(TORN)} bytes, left by a writer "
        "that crashed while appending it (never confirmed, so it is written again): removed it"
    ]


#: A writer appending one 64 MiB line again and again, as an executor appends a batch.
BIG_WRITER = """
import os, sys
from pg2sink.sinks.file import append_lines
line = b'{"kind":"big","pad":"' + b"x" * (64 << 20) + b'"}\\n'
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
while True:
    append_lines(fd, line)
"""

#: The stream's FileSink appending small lines and flushing them until a file appears.
SMALL_WRITER = """
import logging, os, sys
from datetime import UTC, datetime
from pg2sink.changelog.records import Modification, Operation
from pg2sink.sinks.file import FileSink
logging.basicConfig(level=logging.WARNING)
sink = FileSink(sys.argv[1])
sink.open()
n = 0
while not os.path.exists(sys.argv[2]):
    for _ in range(100):
        n += 1
        sink.write(Modification(datetime.now(UTC), n, n, 1, Operation.INSERT, "public", "t",
                                None, {"id": n, "v": "x" * 100}))
    sink.checkpoint(n)
    sink.flush()
sink.close()
"""


def _ends_whole(path: Path) -> bool:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return size > 0 and os.pread(f.fileno(), 1, size - 1) == b"\n"


def _python(code: str, *args: str, stderr: int | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args], stderr=stderr)


def _kill_inside_a_big_write(path: Path, writer: subprocess.Popen[bytes]) -> str:
    """SIGKILL `writer` while its 64 MiB write(2) is half done (the file's end is more
    than 2 MiB past the last newline seen, so it is that write, not a small line); what
    it logged (a torn line it cut, when its stderr is a pipe)."""
    whole_end = 0
    deadline = time.monotonic() + 60
    with open(path, "rb") as f:
        while time.monotonic() < deadline:
            size = os.fstat(f.fileno()).st_size
            if size and os.pread(f.fileno(), 1, size - 1) == b"\n":
                whole_end = size
            elif size - whole_end > 2 << 20:
                writer.send_signal(signal.SIGKILL)
                _, err = writer.communicate(timeout=10)  # closes its stderr pipe
                return (err or b"").decode()
    raise AssertionError("the big writer never wrote")


def test_a_writer_killed_inside_its_write_leaves_no_torn_line(tmp_path: Path) -> None:
    """Three kill -9s inside a 64 MiB append while the stream's FileSink appends small
    lines to the same file: every torn line is cut before anything follows it (else the
    next line glues to it), reported once, and the file is whole lines only."""
    path, stop = tmp_path / "out.jsonl", tmp_path / "stop"
    path.touch()
    small = _python(SMALL_WRITER, str(path), str(stop), stderr=subprocess.PIPE)
    big_logs = ""
    try:
        for _ in range(3):
            big = _python(BIG_WRITER, str(path), stderr=subprocess.PIPE)
            big_logs += _kill_inside_a_big_write(path, big)
        # the small writer's next append cuts the last torn line: only then may it stop
        # (else it may see the stop file first and leave the repair to the next writer)
        wait_for(lambda: _ends_whole(path), 30, "the small writer to cut the torn line")
        stop.touch()
        _, err = small.communicate(timeout=60)
    finally:
        small.kill()
    assert small.returncode == 0, err.decode()
    lines = strict_lines(path)
    kinds = {str(r["kind"]) for r in lines}
    assert "modification" in kinds
    # each torn line cut once, by whichever writer took the lock after the kill (the
    # small one, or the next big one before it); a kill that lands between two writes
    # leaves none, so up to 3, and never one reported twice
    logs = err.decode() + big_logs
    torn = re.findall(r"ended in a partial line of (\d+) bytes", logs)
    assert 1 <= len(torn) <= 3 and len(set(torn)) == len(torn), logs


def test_a_restart_after_a_kill_inside_a_write_cuts_the_torn_line(tmp_path: Path) -> None:
    """kill -9 inside a write with nobody else writing, then a new FileSink: the file
    ends torn until then, and whole lines after."""
    path = tmp_path / "out.jsonl"
    path.write_bytes(record_line(SCHEMA))
    _kill_inside_a_big_write(path, _python(BIG_WRITER, str(path)))
    assert not path.read_bytes().endswith(b"\n")  # torn indeed
    sink = FileSink(str(path))
    sink.open()
    sink.write(modification(0, {"id": 1}))
    sink.checkpoint(300)
    sink.close()
    assert [r["kind"] for r in strict_lines(path)] == ["schema", "modification"]


#: FileSink("-") writing one line, as `pg2sink >> FILE` does.
STDOUT_WRITER = """
import logging, sys
from pg2sink.sinks.file import FileSink
logging.basicConfig(level=logging.WARNING)
sink = FileSink("-")
sink.open()
sink._append(sys.argv[1].encode())
sink.close()
"""


def test_standard_output_appended_to_a_file_is_repaired_too(tmp_path: Path) -> None:
    """`pg2sink >> FILE` after a kill -9: the shell's O_APPEND descriptor is the file
    sink's file, torn line included."""
    path = tmp_path / "out.jsonl"
    whole = torn_file(path)
    with open(path, "ab") as stdout:
        done = subprocess.run(
            [sys.executable, "-c", STDOUT_WRITER, record_line(SCHEMA).decode()],
            stdout=stdout,
            stderr=subprocess.PIPE,
        )
    assert done.returncode == 0, done.stderr.decode()
    assert path.read_bytes() == whole + record_line(SCHEMA)
    assert f"partial line of {len(TORN)} bytes" in done.stderr.decode()
