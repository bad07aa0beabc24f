"""A driver JVM killed while pg2sink calls into it is found dead, whatever py4j raises
(docs/imports.md, "When Spark dies"): a real local Spark session, its JVM killed with
SIGKILL, and the error py4j gives a call whose connection broke."""

from __future__ import annotations

import os
import signal

import pytest
from py4j import protocol  # type: ignore[import-untyped]

from pg2sink.imports.spark import SparkRunner

pytestmark = pytest.mark.slow


def test_a_bare_py4j_error_a_moment_after_the_jvm_was_killed_is_its_death() -> None:
    from pyspark import SparkContext

    runner = SparkRunner("local[1]")
    try:
        runner.session()
        gateway = SparkContext._gateway
        assert gateway is not None
        pid = gateway.proc.pid
        os.kill(pid, signal.SIGKILL)
        # what a call gets once py4j logged its broken connection (GatewayClient's
        # send_command answers proto.ERROR): no Java exception, no network error type
        with pytest.raises(protocol.Py4JError) as raised:
            protocol.get_return_value(protocol.ERROR, gateway._gateway_client, "o50", "conf")
        assert type(raised.value) is protocol.Py4JError
        # before the kernel reaped the JVM: the runner waits for it rather than
        # failing the import as if the job itself had failed
        assert (
            runner._death(raised.value) == f"Spark's driver JVM (pid {pid}) was killed by signal 9"
        )
    finally:
        runner.discard()
