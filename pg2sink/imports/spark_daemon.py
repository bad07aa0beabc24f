"""pyspark's daemon for a local master, importing pyspark from its installed package.

Spark starts its Python workers' daemon with `PYTHONPATH` beginning with
`$SPARK_HOME/python/lib/pyspark.zip` and py4j's zip. Python cannot cache the bytecode of
modules imported from a zip, so the daemon and every worker it forks compile pyspark's
worker modules from source: `import pyspark.worker` costs several times more CPU from
the zip than from the installed package, paid by every worker process of a session's
first import (`make bench-import`: two workers and the daemon).

With pip's pyspark (what `pg2sink[spark]` installs) SPARK_HOME is the installed package
itself, so those zips are copies of the modules next to them. This module drops from
`sys.path` only the zips found inside the installed package that the rest of the path
also provides, then runs pyspark's own daemon (`spark.python.daemon.module`, set by
spark.py for local masters). A Spark distribution elsewhere (its own SPARK_HOME) keeps
its zips: its modules may be another version than the installed ones.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

__all__ = ["installed_path"]

#: the zips Spark puts on the workers' path, and the package each one provides
_ZIPPED = {"pyspark.zip": "pyspark", "py4j": "py4j"}


def installed_path(path: list[str]) -> list[str]:
    """`path` without Spark's zips of pyspark and py4j when the same interpreter finds
    both packages outside the zips and the zips lie inside that pyspark package."""
    zips = [p for p in path if p.endswith(".zip") and _zipped(p) is not None]
    rest = [p for p in path if p not in zips]
    found = {name: PathFinder.find_spec(name, rest) for name in set(_ZIPPED.values())}
    pyspark = found["pyspark"]
    if not zips or pyspark is None or pyspark.origin is None or found["py4j"] is None:
        return path
    home = os.path.dirname(pyspark.origin) + os.sep
    if not all(os.path.abspath(z).startswith(home) for z in zips):
        return path
    return rest


def _zipped(entry: str) -> str | None:
    name = os.path.basename(entry)
    return next((pkg for prefix, pkg in _ZIPPED.items() if name.startswith(prefix)), None)


if __name__ == "__main__":
    sys.path[:] = installed_path(sys.path)
    from pyspark.daemon import manager

    manager()
