"""changelog._cmodule: PG2SINK_IMPL chooses the Python path or the C encoder, once.

Each choice is made by a process at import, so each case runs a process of its own with
the variable set: a Kafka sink opened on the session's broker and registry, given a
table's Schema record, tells whether its raw writer (the builder's shortcut for new
rows) is the C encoder's, and whether the C module was loaded at all. The state of an
install built without a compiler is a copy of the package without the extension.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pg2sink
from pg2sink.changelog import _cmodule
from tests.conftest import KafkaStack, clean_env, run_cli

UNREACHABLE = "host=127.0.0.1 port=1 connect_timeout=2"

# A Kafka sink in Avro given one table whose column the C encoder writes (int8): what the
# process chose, whether the sink's raw writer exists, whether the C module was loaded.
SINK_REPORT = """
import json, sys
from datetime import datetime, timezone
from pg2sink.changelog import _cmodule
from pg2sink.changelog.builder import TableShape
from pg2sink.changelog.records import Schema
from pg2sink.sinks.kafka.config import KafkaConfig
from pg2sink.sinks.kafka.sink import KafkaSink

bootstrap, registry, prefix = sys.argv[1:]
row = {
    "type": "record", "name": "value", "namespace": "public.t",
    "fields": [{"name": "id", "type": ["null", {"type": "long", "pg.type": "int8"}],
                "default": None, "pg.column": "id", "pg.key": True}],
    "pg.namespace": "public", "pg.table": "t", "pg.primary_key": ["id"],
}
sink = KafkaSink(KafkaConfig(bootstrap, schema_registry_url=registry, topic_prefix=prefix))
sink.open()
try:
    sink.write(Schema(datetime.now(timezone.utc), 1, "public", "t", row, primary_key=("id",)))
    raw = sink.row_writer(TableShape("public", "t", (), ()))
finally:
    sink.close()
print(json.dumps({
    "impl": _cmodule.IMPL,
    "raw_writer": raw is not None,
    "c_module_loaded": "pg2sink.changelog._avro_native" in sys.modules,
}))
"""


def sink_report(stack: KafkaStack, prefix: str, **env: str) -> dict[str, Any]:
    """SINK_REPORT's answer from a process with `env` (PG2SINK_IMPL unset unless given)."""
    base = {k: v for k, v in clean_env().items() if k != _cmodule.VARIABLE}
    res = subprocess.run(
        [sys.executable, "-c", SINK_REPORT, stack.bootstrap_servers, stack.registry_url, prefix],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **env},
    )
    assert res.returncode == 0, res.stderr
    report: dict[str, Any] = json.loads(res.stdout.splitlines()[-1])
    return report


def test_the_extension_is_built_here() -> None:
    # `pip install -e .` builds it on this machine (gcc): a silent fallback to the Python
    # path would leave the C code untested by the PG2SINK_IMPL=c run
    assert _cmodule.built()


def test_this_session_runs_what_pg2sink_impl_says() -> None:
    # unset: c, the extension being built here
    assert _cmodule.check() == os.environ.get(_cmodule.VARIABLE, "c")
    assert (_cmodule.ROW_ENCODER is not None) == (_cmodule.IMPL == "c")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"PG2SINK_IMPL": "python"}, {"impl": "python", "raw_writer": False, "loaded": False}),
        ({"PG2SINK_IMPL": "c"}, {"impl": "c", "raw_writer": True, "loaded": True}),
        ({}, {"impl": "c", "raw_writer": True, "loaded": True}),  # built here
    ],
    ids=["python", "c", "unset"],
)
def test_the_kafka_sink_uses_the_chosen_encoder(
    kafka_stack: KafkaStack, topic_prefix: str, env: dict[str, str], expected: dict[str, Any]
) -> None:
    report = sink_report(kafka_stack, topic_prefix, **env)
    assert report == {
        "impl": expected["impl"],
        "raw_writer": expected["raw_writer"],
        "c_module_loaded": expected["loaded"],
    }


@pytest.mark.parametrize("value", ["xml", "C", ""])
@pytest.mark.parametrize(
    "args",
    [
        ("--sink=kafka", "--kafka-bootstrap-servers=127.0.0.1:1", "--format=json"),
        ("--file-path", "-"),  # a sink that never loads the encoder checks it too
        ("status",),
    ],
)
def test_a_bad_value_exits_2_with_one_line(value: str, args: tuple[str, ...]) -> None:
    command = list(args[:1]) if args[0] == "status" else []
    flags = list(args[1:]) if args[0] == "status" else list(args)
    res = run_cli(*command, "--source", UNREACHABLE, *flags, env={"PG2SINK_IMPL": value})
    assert res.returncode == 2, res
    assert res.stderr.splitlines() == [
        f"pg2sink: error: invalid PG2SINK_IMPL={value!r}: choose one of python, c"
    ]


@pytest.fixture(scope="module")
def unbuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package without the C extension, as an install without a compiler
    has it (the directory to put first on PYTHONPATH)."""
    root = tmp_path_factory.mktemp("unbuilt")
    shutil.copytree(
        Path(pg2sink.__file__).parent,
        root / "pg2sink",
        ignore=shutil.ignore_patterns("*.so", "__pycache__"),
    )
    return root


def run_unbuilt(root: Path, code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -c code args` on the copy without the extension, with `env`."""
    base = {k: v for k, v in clean_env().items() if k != _cmodule.VARIABLE}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
        env={**base, "PYTHONPATH": str(root), **env},
    )


def test_without_the_extension_unset_means_python(unbuilt: Path) -> None:
    res = run_unbuilt(
        unbuilt,
        "import pg2sink.formats.avro_native, pg2sink.changelog._cmodule as m;"
        " print(m.__file__, m.IMPL, m.built())",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(unbuilt / "pg2sink/changelog/_cmodule.py"), "python", "False"]


def test_without_the_extension_c_exits_2_naming_the_build(unbuilt: Path) -> None:
    res = run_unbuilt(
        unbuilt,
        "import sys; from pg2sink.cli import main; sys.exit(main(sys.argv[1:]))",
        "--source",
        UNREACHABLE,
        "--sink=kafka",
        "--kafka-bootstrap-servers=127.0.0.1:1",
        "--format=json",
        PG2SINK_IMPL="c",
    )
    assert res.returncode == 2, res
    (line,) = res.stderr.splitlines()
    assert line == (
        "pg2sink: error: PG2SINK_IMPL=c but the C extension pg2sink.changelog._avro_native is"
        " not built: reinstall pg2sink where a C compiler is found (`make setup` in a"
        " checkout), or set PG2SINK_IMPL=python"
    )
