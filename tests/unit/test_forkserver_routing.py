"""Which starts the Python fork server takes (python_forkserver.routed_start): anything else is
refused, and its launcher runs the real interpreter."""

from __future__ import annotations

import pytest

from services.taskmanager.runtime.python_forkserver import DAEMON, ROUTED, routed_start

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


@pytest.mark.parametrize(
    "args",
    [
        ["-m", RUNNER],
        ["-m", DAEMON],
        ["-m", DAEMON, "pyspark.worker"],
        ["-m", DAEMON, "pyspark.sql.worker.plan_data_source_read"],
    ],
)
def test_routed(args):
    assert routed_start(args, ROUTED)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["-m"],
        ["-c", "print(1)"],
        ["-m", "json.tool"],
        ["-m", RUNNER, "extra"],  # only the daemon takes an argument
        ["-m", DAEMON, "os"],  # a worker module is PySpark's own
        ["-m", DAEMON, "pyspark.worker; rm -rf /"],
        ["-m", DAEMON, "pyspark..worker"],
        ["-m", DAEMON, "pyspark.worker", "more"],
        ["-m", DAEMON, ["pyspark.worker"]],  # a request's JSON of the wrong type
    ],
)
def test_refused(args):
    assert not routed_start(args, ROUTED)


def test_a_server_without_the_daemon_takes_no_daemon():
    assert not routed_start(["-m", DAEMON, "pyspark.worker"], (RUNNER,))
