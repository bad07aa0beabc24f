"""The Spark driver JVM's class archive (HotSpot's dynamic AppCDS archive).

Spark's start and a session's first import load some 15,000 classes from Spark's jars,
parsing and verifying each. HotSpot can instead map them, already parsed and verified,
from an archive that an earlier JVM wrote at its exit (`-XX:ArchiveClassesAtExit`, Java
13+; Spark 4 needs 17). pg2sink keeps one archive per driver set-up in a cache directory:

- the first driver JVM of a set-up records: it runs with `-XX:ArchiveClassesAtExit` on a
  file of its own (`spark-<key>.<pid>.tmp`), and when pg2sink exits it closes the JVM's
  stdin (the gateway's signal to exit), waits for the archive to be written, fsyncs it
  and renames it to `spark-<key>.jsa`;
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
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CLASS_CACHE_ENV", "ClassArchive", "archive_key", "default_cache_dir"]

log = logging.getLogger(__name__)

#: The first four bytes of a dynamic archive (HotSpot's CDS_DYNAMIC_ARCHIVE_MAGIC,
#: 0xf00baba8, little-endian): a file without them is not one.
MAGIC = bytes.fromhex("a8ab0bf0")
#: The environment variable of --spark-class-cache, read also where no option is parsed
#: (a SparkRunner made by a bench or a test).
CLASS_CACHE_ENV = "PG2SINK_SPARK_CLASS_CACHE"
#: How long pg2sink waits at exit for a recording JVM to write its archive.
WRITE_TIMEOUT = 300.0
#: Other set-ups' archives unused this long are removed when a new one is kept: another
#: installation on the machine has its own key (its jars' paths), and evicting its archive
#: at once would have the two record in turn, ~13 s each time.
STALE_SECONDS = 7 * 24 * 3600.0


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


def is_archive(path: Path) -> bool:
    """A file that starts like a dynamic archive."""
    try:
        with path.open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


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
        """Recordings of processes gone before their JVM's archive was complete."""
        for tmp in self.directory.glob("spark-*.*.tmp"):
            pid = tmp.name.split(".")[-2]
            if pid.isdigit() and not _pid_alive(int(pid)):
                tmp.unlink(missing_ok=True)

    def finish_at_exit(self, jvm: subprocess.Popen[bytes]) -> None:
        """At this process's exit: end the recording JVM and keep its archive."""
        atexit.register(self.finish, jvm)

    def finish(self, jvm: subprocess.Popen[bytes], timeout: float = WRITE_TIMEOUT) -> bool:
        """Close the gateway JVM's stdin (it exits, writing the archive), wait for it,
        and promote the archive if the JVM exited with 0; True if promoted."""
        tmp = self.recording_path
        log.info("Spark: writing its class archive (once per set-up) to %s", self.path)
        try:
            if jvm.stdin is not None:
                jvm.stdin.close()
            status = jvm.wait(timeout)
        except subprocess.TimeoutExpired:
            jvm.kill()
            status = None
        try:
            if status != 0 or not is_archive(tmp):
                log.warning("Spark's class archive was not written (JVM status %s)", status)
                return False
            with tmp.open("rb") as f:
                os.fsync(f.fileno())
            tmp.rename(self.path)
            self._fsync_directory()
            stale = time.time() - STALE_SECONDS
            for old in self.directory.glob("spark-*.jsa"):
                if old != self.path and old.stat().st_mtime < stale:
                    old.unlink(missing_ok=True)
            return True
        except OSError as e:
            log.warning("Spark's class archive was not kept: %s", e)
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
