"""The README's Kafka example, run as written: its console session and its consumer.

The session's statements run on the test database, pg2sink runs with the session's
flags (on this test's topic prefix, slot and publication), and the consumer, the
README's Python block unchanged except for the topic and group names, reads the topic.
Its output must be the output the README shows, tombstone included (the consumer used
to stop at the first one with `TypeError: 'NoneType' object is not subscriptable`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Database, KafkaStack, wait_for
from tests.readme_support import readme_block
from tests.support import FAST, Proc

README_TOPIC = "pg2sink.public.customers"


def session() -> list[tuple[str, list[str]]]:
    """The console block of the consumer: (command, the output lines after it)."""
    text = re.sub(r"\\\n\s*", "", readme_block("console", "consume.py"))
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


@pytest.mark.slow  # the consumer waits 10 s for more messages before it stops
def test_the_readme_consumer_reads_inserts_updates_deletes_and_tombstones(
    db: Database,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    tmp_path: Path,
) -> None:
    conn = db.connect()
    servers = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_stack.bootstrap_servers,
        "SCHEMA_REGISTRY_URL": kafka_stack.registry_url,
    }
    consumer = readme_block("python", "DeserializingConsumer")
    # this test's topic, and its own consumer group: a consumer of an earlier run that
    # died in the README's group would hold the partitions until its session times out
    for name in (f'"{README_TOPIC}"', '"group.id": "readme"'):
        assert consumer.count(name) == 1, name
    consumer = consumer.replace(README_TOPIC, f"{topic_prefix}.public.customers")
    consumer = consumer.replace('"group.id": "readme"', f'"group.id": "{topic_prefix}"')
    script = tmp_path / "consume.py"
    script.write_text(consumer)
    expected: list[str] | None = None
    proc = None
    for command, output in session():
        words = shlex.split(command)
        if words[0] == "psql":
            assert words[1] == "-c", command
            conn.execute(words[2].encode())
        elif words[0].endswith("/pg2sink"):
            assert words[-1] == "&", command
            flags = [re.sub(r"\$(\w+)", lambda m: servers[m.group(1)], w) for w in words[1:-1]]
            proc = pg2sink_proc(*flags, "--topic-prefix", topic_prefix, *FAST).start()
            proc.wait_streaming()
        elif words[-1] == "consume.py":
            expected = output
        else:
            assert command == "make services && . .services/env", command
    assert proc is not None and expected, "the session starts pg2sink and runs consume.py"
    wait_for(
        lambda: (db.slot_confirmed_lsn() or 0) >= db.current_lsn(),
        60,
        "pg2sink to deliver every change",
    )
    # the consumer stops after 10 s without a message
    res = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, **servers},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == expected, proc.stderr()
