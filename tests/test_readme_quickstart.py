"""The README's Quick start, run as written: each command of its console block in bash,
in a fresh directory whose `.venv` is this checkout's, with the environment
`. .services/env` gives, pointing at the test session's PostgreSQL (`make services` is
the one command not run: the session's server stands for it). Imports are on, as they
are for a user. The output of each command must be what the README shows.

pg2sink runs in the background (`&`) as in the README, its stderr kept. As the README
tells the reader, the command after it waits for its `import of public.customers done`
line; the `grep` runs until it prints what the README shows or 30 s pass (the update is
written a moment after its commit: a reader would run it again). `kill %1 && wait` is
its SIGTERM, after which it must have exited 0. The database `shop` and the slot and
publication `pg2sink` are the README's: the test drops them at the end.
"""

from __future__ import annotations

import functools
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, Database, wait_for
from tests.readme_support import readme_block

pytestmark = pytest.mark.slow  # Spark starts for the table's import


def session() -> list[tuple[str, list[str]]]:
    """The Quick start's console block: (command, the output lines after it)."""
    steps: list[tuple[str, list[str]]] = []
    for line in readme_block("console", "--file-path=changes.jsonl").splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


#: pg2sink's line once the table's rows are imported
IMPORTED = "import of public.customers done"


def streaming(proc: subprocess.Popen[bytes] | None, log: Path) -> bool:
    assert proc is not None and proc.poll() is None, log.read_text()
    return "pg2sink is streaming" in log.read_text()


def test_the_quick_start_as_written(db: Database, tmp_path: Path) -> None:
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    services = tmp_path / ".services"
    services.mkdir()
    server = db.server.env()
    services.joinpath("env").write_text(
        "".join(f"export {k}={shlex.quote(v)}\n" for k, v in server.items())
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PG2SINK_"))}
    env["PG2SINK_SPARK_CLASS_CACHE"] = "off"  # the archive is the test session's concern
    steps = session()
    assert steps[0] == ("make services && . .services/env", []), steps[0]
    background: subprocess.Popen[bytes] | None = None
    log = tmp_path / "pg2sink.log"
    try:
        for command, output in steps[1:]:
            script = f". .services/env && {command.removesuffix('&').strip()}"
            if command.endswith("&"):
                assert background is None
                with open(log, "wb") as err:
                    background = subprocess.Popen(
                        ["bash", "-c", script.replace("&& ", "&& exec ", 1)],
                        cwd=tmp_path, env=env, stderr=err, stdout=subprocess.DEVNULL,
                    )  # fmt: skip
                wait_for(functools.partial(streaming, background, log), 120, "pg2sink to stream")
            elif command == "kill %1 && wait":
                assert background is not None
                background.send_signal(signal.SIGTERM)
                assert background.wait(30) == 0, log.read_text()
            else:
                if command.startswith('psql -q shop -c "update'):
                    wait_for(lambda: IMPORTED in log.read_text(), 180, "the import")
                run = functools.partial(
                    subprocess.run,
                    ["bash", "-c", script],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                done = run()
                if command.startswith("grep"):
                    deadline = time.monotonic() + 30
                    while done.stdout.splitlines() != output and time.monotonic() < deadline:
                        time.sleep(0.5)
                        done = run()
                assert done.returncode == 0, (command, done.stderr, log.read_text())
                assert done.stdout.splitlines() == output, (command, log.read_text())
    finally:
        if background is not None and background.poll() is None:
            background.kill()
            background.wait(10)
        cleanup = ". .services/env && .venv/bin/pg2sink drop --source dbname=shop; dropdb shop"
        subprocess.run(["bash", "-c", cleanup], cwd=tmp_path, env=env, capture_output=True)
    assert "Traceback" not in log.read_text()
