#!/usr/bin/env python3
"""Provisions the PostgreSQL JDBC driver that Spark imports read with (`make setup`).

Downloads org.postgresql:postgresql:<JDBC_VERSION> from Maven Central once into
`<cache>/jdbc/postgresql-<version>.jar` (the cache of scripts/services.py:
~/.cache/pg2sink-services or $PG2SINK_SERVICES_CACHE), checked against Central's
SHA-1, and removes older versions there. pg2sink's import runner finds the jar in
that directory by default (`--jdbc-driver` names another). A warm run only checks
that the file exists. Standard library only: it runs before the virtualenv exists.

`--copy-to PATH` also copies the jar to PATH: the Dockerfile keeps it at a fixed path
that PG2SINK_JDBC_DRIVER names (the jar's name carries the version).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import services

#: pgjdbc release; 42.7 supports PostgreSQL 8.4 and newer and Java 8 and newer.
JDBC_VERSION = "42.7.10"
JDBC_DIR = services.CACHE_DIR / "jdbc"


def jdbc_driver() -> Path:
    """The driver jar, downloaded on first use."""
    dest = JDBC_DIR / f"postgresql-{JDBC_VERSION}.jar"
    if dest.exists():
        return dest
    with services._cache_lock("jdbc"):
        if dest.exists():
            return dest
        JDBC_DIR.mkdir(parents=True, exist_ok=True)
        v = JDBC_VERSION
        url = f"{services.MAVEN_CENTRAL.rstrip('/')}/org/postgresql/postgresql/{v}"
        url += f"/postgresql-{v}.jar"
        services._say(f"jdbc: downloading {url} into {JDBC_DIR} (first run only)")
        tmp = dest.with_suffix(".jar.tmp")
        services._download(url, tmp, service="jdbc")
        tmp.rename(dest)
        # one driver in the directory: the runner takes the jar it finds there
        for old in JDBC_DIR.glob("postgresql-*.jar"):
            if old != dest:
                old.unlink()
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch the PostgreSQL JDBC driver once.")
    parser.add_argument("--copy-to", type=Path, metavar="PATH", help="also copy the jar there")
    args = parser.parse_args(argv)
    try:
        jar = jdbc_driver()
    except services.ServiceError as e:
        print(f"setup: {e}", file=sys.stderr)
        return 1
    if args.copy_to is not None:
        args.copy_to.parent.mkdir(parents=True, exist_ok=True)
        jar = Path(shutil.copyfile(jar, args.copy_to))
    print(jar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
