"""The Spark driver JVM's class archive (HotSpot's dynamic AppCDS archive).

Spark's start and a session's first import load some 15,000 classes from Spark's jars,
parsing and verifying each. HotSpot can instead map them, already parsed and verified,
from an archive that an earlier JVM wrote at its exit (`-XX:ArchiveClassesAtExit`, Java
13+; Spark 4 needs 17). pg2sink keeps one archive per driver set-up in a cache directory:

- the first driver JVM of a set-up records: it runs with `-XX:ArchiveClassesAtExit` on a
  file of its own (`spark-<key>.<pid>.tmp`) under a keeper process (archive_keeper.py),
  its parent. When pg2sink exits it closes the JVM's stdin (the gateway's signal to
  exit) and does not wait: the JVM writes the archive, and the keeper fsyncs it and
  renames it to `spark-<key>.jsa` if the JVM exited with 0. A SIGTERM'd pg2sink so exits
  in seconds, not after the archive's write; a container stopped with pg2sink (the
  keeper killed too) keeps no archive and records again at its next start;
- later driver JVMs of that set-up start with `-XX:SharedArchiveFile` on it.

An archive is used only after the JVM that wrote it exited with status 0 and the file
was fsynced: HotSpot maps the file without checking its length, and a truncated archive
crashes the JVM with SIGBUS, so a recording cut short (pg2sink killed, the machine
down) is never used; its file is removed by the next start.

The key hashes what decides whether HotSpot can use an archive: the `java` spark-submit
runs, Spark's jars (the class path it checks) and the JVM's -XX options. Not the JDBC
driver jar: its classes come through Spark's own class loader, and HotSpot takes such a
class from the archive only if the class file's size and CRC match, else loads it from
the jar. Nor the log configuration's path: a test's or a bench's copy of pg2sink maps
the same archive instead of recording its own. A change gives a new archive, and
archives unused for a week are removed when a new one is kept. A JVM that still rejects
an archive (a different build behind the same path) starts without it and says so on
its console (pg2sink's debug log).

Mapping the archive shortens Spark's start and a session's first import; recording it
costs once, at start and at exit.
`make bench-import ARGS="--sink file --spark-class-cache off"` against the default shows it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pg2sink.imports import archive_keeper
from pg2sink.imports.archive_keeper import MAGIC, STALE_SECONDS, is_archive, promote

__all__ = [
    "CLASS_CACHE_ENV",
    "MAGIC",
    "STALE_SECONDS",
    "WRITE_TIMEOUT",
    "ClassArchive",
    "archive_key",
    "default_cache_dir",
    "is_archive",
]

log = logging.getLogger(__name__)

#: The environment variable of --spark-class-cache, read also where no option is parsed
#: (a SparkRunner made by a bench or a test).
CLASS_CACHE_ENV = "PG2SINK_SPARK_CLASS_CACHE"
#: How long pg2sink waits at exit for a recording JVM to write its archive.
WRITE_TIMEOUT = 300.0


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/pg2sink/spark, else ~/.cache/pg2sink/spark."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pg2sink" / "spark"


def _java() -> str:
    """The java spark-submit runs: $JAVA_HOME/bin/java, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return str(Path(home, "bin", "java"))
    return shutil.which("java") or "java"


def _file_identity(path: str) -> str:
    """A file's real path, size and modification time (`:missing` for a missing file)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return f"{real}:missing"
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def _spark_jars() -> list[str]:
    """Spark's jars, as pyspark finds them."""
    try:
        from pyspark.find_spark_home import _find_spark_home
    except ImportError:
        return []
    jars = Path(_find_spark_home(), "jars")
    return sorted(str(p) for p in jars.glob("*.jar"))


def archive_key(java_options: str) -> str:
    """What decides whether HotSpot can use an archive, hashed (16 hex digits): the java,
    Spark's jars, the -XX options among `java_options`."""
    digest = hashlib.sha256()
    vm_options = [o for o in shlex.split(java_options) if o.startswith("-XX:")]
    for part in (
        _file_identity(_java()),
        *(_file_identity(jar) for jar in _spark_jars()),
        *vm_options,
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class ClassArchive:
    """One driver set-up's archive in `directory`; see the module docstring."""

    directory: Path
    key: str

    @property
    def path(self) -> Path:
        return self.directory / f"spark-{self.key}.jsa"

    @property
    def recording_path(self) -> Path:
        return self.directory / f"spark-{self.key}.{os.getpid()}.tmp"

    def java_option(self) -> str | None:
        """The option for the next driver JVM: use the archive if it exists, else
        record one; None if the directory cannot be written."""
        if self.path.is_file():
            if is_archive(self.path):
                with contextlib.suppress(OSError):
                    os.utime(self.path)  # in use: not stale (STALE_SECONDS)
                return shlex.quote(f"-XX:SharedArchiveFile={self.path}")
            log.warning("%s is not a class archive: removed", self.path)
            self.path.unlink(missing_ok=True)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_dead_recordings()
            probe = self.recording_path
            probe.touch()
            probe.unlink()
        except OSError as e:
            log.debug("no Spark class archive in %s: %s", self.directory, e)
            return None
        # (quoted: Spark splits the JVM options as a shell would.) The JVM's notes on
        # every class it cannot archive are thousands of lines.
        return shlex.quote(f"-XX:ArchiveClassesAtExit={self.recording_path}") + " -Xlog:cds=off"

    def _remove_dead_recordings(self) -> None:
        """Recordings whose process is gone and whose keeper (which may outlive it by up
        to WRITE_TIMEOUT) did not keep them: an archive that was never complete."""
        old = time.time() - WRITE_TIMEOUT
        for tmp in self.directory.glob("spark-*.*.tmp"):
            pid = tmp.name.split(".")[-2]
            with contextlib.suppress(OSError):
                if pid.isdigit() and not _pid_alive(int(pid)) and tmp.stat().st_mtime < old:
                    tmp.unlink()

    def keeper(self, submit: str) -> str:
        """The program to start in spark-submit's place for a recording JVM: a script
        running archive_keeper.py on `submit` (its path, which the kernel does not pass
        on) with this recording's files."""
        script = self.directory / f"spark-{self.key}.{os.getpid()}.keep"
        words = [sys.executable, archive_keeper.__file__, submit]
        words += [str(self.recording_path), str(self.path)]
        # (the script removes itself: the shell has read the line it runs)
        script.write_text(f'#!/bin/sh\nrm -f "$0"; exec {shlex.join(words)} "$@"\n')
        script.chmod(0o700)
        return str(script)

    def release_at_exit(self, keeper: subprocess.Popen[bytes]) -> None:
        """At this process's exit: close the keeper's (and so the JVM's) stdin, without
        waiting: the keeper keeps the archive once the JVM has written it."""
        atexit.register(self.release, keeper)

    def release(self, keeper: subprocess.Popen[bytes]) -> None:
        log.info(
            "Spark: its class archive (once per set-up) is written to %s after this exit",
            self.path,
        )
        if keeper.stdin is not None:
            keeper.stdin.close()

    def finish(self, jvm: subprocess.Popen[bytes], timeout: float = WRITE_TIMEOUT) -> bool:
        """Close a recording JVM's stdin (it exits, writing the archive), wait for it,
        and promote the archive if the JVM exited with 0; True if promoted. What the
        keeper does, for a JVM that is this process's own child."""
        if jvm.stdin is not None:
            jvm.stdin.close()
        try:
            status: int | None = jvm.wait(timeout)
        except subprocess.TimeoutExpired:
            jvm.kill()
            status = None
        why = promote(self.recording_path, self.path, status)
        if why is not None:
            log.warning("Spark's class archive was not kept: %s", why)
        return why is None
