"""The Spark driver JVM's class archive (imports/class_archive.py).

The bookkeeping runs against real processes (a Python process that behaves like the gateway JVM:
it writes the file when its stdin closes); the end-to-end test starts real Spark twice
in fresh Python processes, each reading from PostgreSQL through the JDBC driver: the
first records the archive at its exit, the second maps it (its JVM's /proc/PID/maps names
the file).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from pg2sink.imports.class_archive import (
    MAGIC,
    STALE_SECONDS,
    WRITE_TIMEOUT,
    ClassArchive,
    archive_key,
    is_archive,
)
from pg2sink.imports.driver import default_jdbc_driver
from tests.conftest import Database, Pg2Sink, wait_for
from tests.imports.support import start_with_imports, wait_imported


def fake_jvm(
    writes: Path, status: int, content: bytes = MAGIC + b"rest"
) -> subprocess.Popen[bytes]:
    """A process that, like the gateway JVM, writes its archive once its stdin closes."""
    script = (
        "import sys; sys.stdin.buffer.read(); "
        f"open({str(writes)!r}, 'wb').write(bytes.fromhex({content.hex()!r})); sys.exit({status})"
    )
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)


def test_the_key_follows_the_vm_options_only(tmp_path: Path) -> None:
    log = "-Dlog4j2.configurationFile=file:/a/log4j2.properties"
    key = archive_key(f"{log} -XX:+UseParallelGC")
    assert key == archive_key(f"{log} -XX:+UseParallelGC")
    assert key != archive_key(f"{log} -XX:+UseSerialGC")
    # another copy of pg2sink (a test's, a bench's) maps the same archive
    assert key == archive_key(
        "-Dlog4j2.configurationFile=file:/b/log4j2.properties -XX:+UseParallelGC"
    )


def test_without_an_archive_the_jvm_records_one_and_with_one_maps_it(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "cache", "k1")
    option = archive.java_option()
    assert option is not None
    assert f"-XX:ArchiveClassesAtExit={archive.recording_path}" in option
    assert archive.recording_path.parent.is_dir()
    assert not archive.recording_path.exists()  # the JVM creates it
    archive.path.write_bytes(MAGIC + b"classes")
    os.utime(archive.path, (1.0, 1.0))
    assert archive.java_option() == f"-XX:SharedArchiveFile={archive.path}"
    assert archive.path.stat().st_mtime > time.time() - 60  # in use: not stale


def test_the_option_survives_a_directory_with_spaces(tmp_path: Path) -> None:
    # Spark splits spark.driver.extraJavaOptions as a shell would
    archive = ClassArchive(tmp_path / "my cache", "k1")
    option = archive.java_option()
    assert option is not None
    assert shlex.split(option) == [
        f"-XX:ArchiveClassesAtExit={archive.recording_path}",
        "-Xlog:cds=off",
    ]


def test_a_file_that_is_not_an_archive_is_removed_and_recorded_again(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path, "k1")
    archive.path.write_bytes(b"\0" * 64)
    option = archive.java_option()
    assert option is not None and "ArchiveClassesAtExit" in option
    assert not archive.path.exists()


def test_recordings_of_dead_processes_are_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f"spark-k0.{gone.pid}.tmp"
    alive = tmp_path / f"spark-k0.{os.getppid()}.tmp"
    dead.write_bytes(MAGIC)
    alive.write_bytes(MAGIC)
    # its process gone, a recording is still its keeper's to finish for WRITE_TIMEOUT
    writing = tmp_path / f"spark-k9.{gone.pid}.tmp"
    writing.write_bytes(MAGIC)
    long_ago = time.time() - WRITE_TIMEOUT - 60
    os.utime(dead, (long_ago, long_ago))
    os.utime(alive, (long_ago, long_ago))
    ClassArchive(tmp_path, "k1").java_option()
    assert not dead.exists()
    assert alive.exists() and writing.exists()


def test_an_unwritable_directory_means_no_archive(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert ClassArchive(blocker / "cache", "k1").java_option() is None


def test_an_archive_is_kept_only_if_its_jvm_exits_with_0(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path, "k2")
    old = tmp_path / "spark-k1.jsa"
    old.write_bytes(MAGIC)
    week_ago = time.time() - STALE_SECONDS - 60
    os.utime(old, (week_ago, week_ago))
    recent = tmp_path / "spark-k0.jsa"  # another installation's, in use
    recent.write_bytes(MAGIC)
    # the JVM fails after writing (a full disk, a crash at exit): nothing is kept
    assert not archive.finish(fake_jvm(archive.recording_path, 1))
    assert not archive.path.exists() and not archive.recording_path.exists()
    assert old.exists()
    # a file that is not an archive is not kept either
    assert not archive.finish(fake_jvm(archive.recording_path, 0, b"\0\0\0\0partial"))
    assert not archive.path.exists() and not archive.recording_path.exists()
    # status 0 and a whole archive: it takes its name; the set-up's unused for a week goes
    assert archive.finish(fake_jvm(archive.recording_path, 0))
    assert archive.path.read_bytes() == MAGIC + b"rest"
    assert not archive.recording_path.exists()
    assert not old.exists()
    assert recent.exists()


def test_a_jvm_that_does_not_exit_in_time_is_killed(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path, "k3")
    stuck = subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE)
    assert not archive.finish(stuck, timeout=0.5)
    assert stuck.wait(5) != 0
    assert not archive.path.exists()


def fake_submit(tmp_path: Path, writes: Path, pid_file: Path) -> str:
    """A spark-submit stand-in: notes its pid, and like the gateway JVM writes the
    archive a second after its stdin closes, exiting with 0."""
    script = tmp_path / "fake-submit"
    body = (
        "import os, sys, time; "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
        "sys.stdin.buffer.read(); time.sleep(1); "
        f"open({str(writes)!r}, 'wb').write(bytes.fromhex({(MAGIC + b'rest').hex()!r}))"
    )
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(body)}\n")
    script.chmod(0o755)
    return str(script)


def test_the_keeper_keeps_the_archive_after_its_parent_stops_waiting(tmp_path: Path) -> None:
    """pg2sink closes the JVM's stdin at exit and goes: the keeper keeps the archive."""
    archive = ClassArchive(tmp_path / "cache", "k4")
    assert archive.java_option() is not None  # makes the directory
    submit = fake_submit(tmp_path, archive.recording_path, tmp_path / "pid")
    # started as pyspark starts spark-submit: argv[0] is spark-submit's name
    keeper = subprocess.Popen(
        ["spark-submit", "--conf", "x=y"], executable=archive.keeper(submit), stdin=subprocess.PIPE
    )
    archive.release(keeper)  # returns at once: the archive is written after it
    assert not archive.path.exists()
    assert keeper.wait(30) == 0
    assert archive.path.read_bytes() == MAGIC + b"rest"
    assert not archive.recording_path.exists()
    assert not list(archive.directory.glob("*.keep"))  # the script removed itself


def test_killing_the_keeper_kills_the_jvm(tmp_path: Path) -> None:
    """The import supervision kills a lost driver through the process it started."""
    archive = ClassArchive(tmp_path / "cache", "k5")
    assert archive.java_option() is not None
    pid_file = tmp_path / "pid"
    submit = fake_submit(tmp_path, archive.recording_path, pid_file)
    keeper = subprocess.Popen(
        ["spark-submit"], executable=archive.keeper(submit), stdin=subprocess.PIPE
    )
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the stand-in did not start"
        time.sleep(0.05)
    jvm = int(pid_file.read_text())
    keeper.kill()
    assert keeper.wait(10) == -9
    assert keeper.stdin is not None
    keeper.stdin.close()
    while (
        Path(f"/proc/{jvm}").exists()
        and "Z" not in Path(f"/proc/{jvm}/stat").read_text().split()[2]
    ):
        assert time.monotonic() < deadline, "the JVM outlived its keeper"
        time.sleep(0.05)
    assert not archive.path.exists()


SESSION = textwrap.dedent(
    """
    import sys
    from pyspark import SparkContext
    from pg2sink.imports.spark import SparkRunner

    cache, url, user, password = sys.argv[1:]
    runner = SparkRunner("local[1]", class_cache=cache)
    spark = runner.session()
    # a read through the JDBC driver (Spark's class loader, not the class path)
    read = (
        spark.read.format("jdbc")
        .option("url", url)
        .option("user", user)
        .option("password", password)
        .option("driver", "org.postgresql.Driver")
        .option("query", "SELECT i FROM generate_series(1, 1000) AS i")
        .load()
    )
    assert read.count() == 1000
    maps = open(f"/proc/{SparkContext._gateway.proc.pid}/maps").read()
    print(runner.class_archive_option)
    print("mapped" if cache in maps else "not mapped")
    runner.close()
    """
)


@pytest.mark.slow
@pytest.mark.skipif(default_jdbc_driver() is None, reason="no JDBC driver: run `make setup`")
def test_the_first_driver_jvm_records_and_the_next_maps_the_archive(
    db: Database, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    params = conninfo_to_dict(db.dsn)
    url = f"jdbc:postgresql://{params['host']}:{params['port']}/{params['dbname']}"
    user, password = str(params.get("user", "")), str(params.get("password", ""))

    def session() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", SESSION, str(cache), url, user, password],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(Path.cwd())},
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split("\n")[-3:-1]

    option, mapped = session()
    assert option.startswith("-XX:ArchiveClassesAtExit="), option
    assert mapped == "not mapped"
    # the keeper keeps it once the JVM has written it, after the session's process exited
    archives = wait_for(lambda: list(cache.glob("spark-*.jsa")), WRITE_TIMEOUT, "the kept archive")
    assert len(archives) == 1 and is_archive(archives[0])
    assert archives[0].stat().st_size > 10_000_000  # Spark's classes, not a header
    assert not list(cache.glob("*.tmp"))
    option, mapped = session()
    assert option == f"-XX:SharedArchiveFile={archives[0]}"
    assert mapped == "mapped"


@pytest.mark.slow
@pytest.mark.skipif(default_jdbc_driver() is None, reason="no JDBC driver: run `make setup`")
def test_a_recording_pg2sink_exits_within_10s_of_sigterm_and_the_archive_is_kept_after(
    db: Database, pg2sink_proc: Callable[..., Pg2Sink], tmp_path: Path
) -> None:
    """A container runtime's stop waits 10 s before SIGKILL: the archive's write (seconds
    of a JVM's exit) must not hold pg2sink's exit."""
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
    cache = tmp_path / "cache"
    env = {"PG2SINK_SPARK_CLASS_CACHE": str(cache)}
    p = start_with_imports(pg2sink_proc, tmp_path / "out.jsonl", env=env)
    wait_imported(db, {"public.t"}, p)
    started = time.monotonic()
    assert p.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 10, p.stderr()
    archives = wait_for(lambda: list(cache.glob("spark-*.jsa")), WRITE_TIMEOUT, "the kept archive")
    assert archives[0].stat().st_size > 10_000_000  # Spark's classes, not a header
