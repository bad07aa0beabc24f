"""The local master's Python workers import pyspark from its installed package, not from
Spark's pyspark.zip (pg2sink/imports/spark_daemon.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyspark

from pg2sink.imports.spark import SparkRunner
from pg2sink.imports.spark_daemon import installed_path

PACKAGE = Path(pyspark.__file__).parent
ZIPS = [
    str(PACKAGE / "python" / "lib" / "pyspark.zip"),
    str(PACKAGE / "python" / "lib" / "py4j.zip"),
]


def test_the_installed_packages_zips_leave_the_path() -> None:
    rest = [p for p in sys.path if p]
    assert installed_path([*ZIPS, *rest]) == rest
    # a Spark distribution elsewhere keeps its zips (its modules may be another version)
    other = ["/opt/spark/python/lib/pyspark.zip", "/opt/spark/python/lib/py4j-0.10.9.9-src.zip"]
    assert installed_path([*other, *rest]) == [*other, *rest]
    # so does a path where pyspark is found only in the zips
    assert installed_path([*ZIPS]) == ZIPS


def test_workers_import_pyspark_from_the_installed_package() -> None:
    runner = SparkRunner("local[1]")
    try:
        sc = runner.session().sparkContext
        found = sc.parallelize([0], 1).map(lambda _: (pyspark.__file__, os.getpid())).collect()
    finally:
        runner.close()
    ((where, pid),) = found
    assert pid != os.getpid()  # a Python worker's answer
    assert where == pyspark.__file__ and ".zip" not in where
