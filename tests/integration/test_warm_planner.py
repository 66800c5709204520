"""The restore check's warm planner (services/dispatcher/warm_planner.py) with a real Spark: no
spare before a first check; after it a spare whose plan of the counting pipeline is the cold
planner's exactly; a spare that died is no answer (the check plans cold); closing ends the spare."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from services.dispatcher.restore_check import run_planner
from services.dispatcher.warm_planner import WarmPlanner
from shared.jars import DEFAULT_CACHE_DIR
from shared.spark_runtime import SparkRuntime

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = str(ROOT / "examples" / "keyed_counts.py")
ARGS = ["--stream", "s", "--sink", "sql", "--table", "t", "--sink-url", "sqlite:////tmp/never-opened.db"]
REQUEST = dict(artifact_path=PIPELINE, entry="build", args=ARGS, config={"spark.sql.shuffle.partitions": "3"},
               parallelism=1, timeout_s=120)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def warm_planner() -> WarmPlanner:
    return WarmPlanner(python=sys.executable, run_as=None, catalog_url=None, redis_url=None,
                       runtime=SparkRuntime(DEFAULT_CACHE_DIR))


def test_a_spare_plans_as_the_cold_planner_does_and_goes_when_closed():
    warm = warm_planner()
    try:
        assert warm.plan(**REQUEST) is None  # no spare before a first check
        warm.replenish()
        spare = warm.spare_pid
        assert spare is not None
        result = warm.plan(**REQUEST)
        assert result is not None and result.get("ok"), result
        cold = run_planner(python=sys.executable, **REQUEST)
        assert cold is not None and cold.get("ok"), cold
        assert result["plan"] == cold["plan"]
        assert gone(spare)  # a spare serves one check
        warm.replenish()
        nxt = warm.spare_pid
        assert nxt is not None and nxt != spare
    finally:
        warm.close()
    deadline = time.monotonic() + 10
    while not gone(nxt):
        assert time.monotonic() < deadline, "the spare outlived close()"
        time.sleep(0.1)


def test_a_spare_that_died_is_no_answer():
    warm = warm_planner()
    try:
        warm.replenish()
        spare = warm.spare_pid
        assert spare is not None
        os.killpg(spare, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not gone(spare):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert warm.plan(**REQUEST) is None
    finally:
        warm.close()
