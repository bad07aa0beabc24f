"""The keeper of a recording driver JVM: the process between pg2sink and the Spark driver
JVM that records the class archive (class_archive.py), so that pg2sink never waits for
the archive at its exit.

pg2sink starts the keeper in the JVM's place (a script in the cache directory runs this
file by its path, with the standard library only); the keeper starts spark-submit with
the same standard streams, so the JVM still sees pg2sink's stdin close when pg2sink
exits. The keeper then waits for the JVM's exit status, which only a parent can read,
and promotes the archive (`promote`) if the JVM exited with 0, after pg2sink is gone if
need be. The JVM dies with the keeper (PR_SET_PDEATHSIG): killing the keeper, as the
import supervision kills a lost driver, kills the JVM. The keeper ends as the JVM did:
the same exit code, or the same signal.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: The first four bytes of a dynamic archive (HotSpot's CDS_DYNAMIC_ARCHIVE_MAGIC,
#: 0xf00baba8, little-endian): a file without them is not one.
MAGIC = bytes.fromhex("a8ab0bf0")
#: An archive unused (never mapped, so its mtime not refreshed) this long is removed
#: when a new one is kept.
STALE_SECONDS = 7 * 24 * 3600
_PR_SET_PDEATHSIG = 1


def is_archive(path: Path) -> bool:
    """Whether `path` starts like a dynamic class archive."""
    try:
        with path.open("rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def promote(tmp: Path, final: Path, status: int | None) -> str | None:
    """Keep the archive `tmp` as `final` if its JVM exited with 0 and it is whole
    (fsynced, then renamed, then the directory fsynced), removing the set-up's archives
    unused for STALE_SECONDS; None when kept, else why not. `tmp` is gone afterwards."""
    try:
        if status != 0 or not is_archive(tmp):
            return f"the JVM's status was {status}"
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        tmp.rename(final)
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        stale = time.time() - STALE_SECONDS
        for old in final.parent.glob("spark-*.jsa"):
            if old != final and old.stat().st_mtime < stale:
                old.unlink(missing_ok=True)
        return None
    except OSError as e:
        return str(e)
    finally:
        tmp.unlink(missing_ok=True)


def _die_with_the_keeper() -> None:
    """In the JVM's process before exec: SIGKILL when the keeper dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main(argv: list[str]) -> int:
    """`archive_keeper.py SUBMIT TMP FINAL [SPARK-SUBMIT ARGS...]`."""
    submit, tmp, final, *args = argv
    jvm = subprocess.Popen([submit, *args], preexec_fn=_die_with_the_keeper)
    # a SIGTERM for the keeper is for the JVM (SIGINT is ignored, as pyspark asks)
    signal.signal(signal.SIGTERM, lambda signum, frame: jvm.send_signal(signum))
    status = jvm.wait()
    promote(Path(tmp), Path(final), status)
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
