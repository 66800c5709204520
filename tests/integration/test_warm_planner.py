"""The restore check's warm planner (services/dispatcher/submission/warm_planner.py) with a real Spark: a
spare whose plan of the counting pipeline is the cold planner's exactly, and which planned a pipeline
of its own before it said ready; a spare that died is no
answer (the check plans cold); closing ends the spare. The dispatcher keeps one from its start,
before any check, at the lowest CPU priority until a check takes it or no warm-up is urgent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from fastapi.testclient import TestClient

from services.dispatcher.app import create_app
from services.dispatcher.submission import warm_planner as warm_planner_module
from services.dispatcher.submission.restore_check import run_planner
from services.dispatcher.submission.warm_planner import START_AFTER_S, WarmPlanner
from shared import cpu_priority
from shared.catalog import Catalog
from shared.jars import DEFAULT_CACHE_DIR
from shared.settings import Settings
from shared.spark_runtime import SparkRuntime
from shared.transport import InMemoryTransport
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = str(ROOT / "examples" / "keyed_counts.py")
ARGS = ["--stream", "s", "--sink", "sql", "--table", "t", "--sink-url", "sqlite:////tmp/never-opened.db"]
REQUEST = dict(
    artifact_path=PIPELINE,
    entry="build",
    args=ARGS,
    config={"spark.sql.shuffle.partitions": "3"},
    parallelism=1,
    timeout_s=120,
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def warm_planner(**kwargs) -> WarmPlanner:
    return WarmPlanner(
        python=sys.executable,
        run_as=None,
        catalog_url=None,
        redis_url=None,
        runtime=SparkRuntime(DEFAULT_CACHE_DIR),
        **kwargs,
    )


def test_a_spare_plans_as_the_cold_planner_does_and_goes_when_closed():
    warm = warm_planner()
    try:
        assert warm.plan(**REQUEST) is None  # none until it is asked for one
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
        assert not warm.spare_niced  # after a check: the next upgrade may come at once
    finally:
        warm.close()
    wait_for("the spare gone after close()", lambda: gone(nxt), 10)


def test_a_spare_that_died_is_no_answer():
    warm = warm_planner()
    try:
        warm.replenish()
        spare = warm.spare_pid
        assert spare is not None
        os.killpg(spare, signal.SIGKILL)
        wait_for("the killed spare gone", lambda: gone(spare), 10)
        assert warm.plan(**REQUEST) is None
    finally:
        warm.close()


def test_the_dispatcher_keeps_a_spare_from_its_start(tmp_path, migrated_sqlite_url):
    """Before any check: the first upgrade of a cluster that has just started is checked warm."""
    settings = Settings(home=tmp_path / "home", catalog_url=migrated_sqlite_url, warm_planner=True, driver_user="")
    catalog = Catalog(settings.catalog)
    try:
        with TestClient(create_app(settings, catalog, InMemoryTransport(sender="dispatcher"))) as client:
            warm = client.app.state.warm_planner
            assert warm.spare_pid is None  # not while the dispatcher itself starts
            spare = wait_for(
                "a spare planner after the dispatcher's start", lambda: warm.spare_pid, timeout_s=START_AFTER_S + 10
            )
            assert client.get("/overview").status_code == 200
        assert wait_for("the spare to end with the dispatcher", lambda: gone(spare), timeout_s=10)
    finally:
        catalog.dispose()


@pytest.mark.skipif(not cpu_priority.may_raise_priority(), reason="spares start at the dispatcher's priority here")
def test_a_spare_waits_at_the_lowest_priority_and_plans_at_the_dispatchers():
    warm = warm_planner()
    try:
        warm.keep_ready(after_s=0.1)
        spare = wait_for("a spare planner", lambda: warm.spare_pid, timeout_s=10)
        assert warm.spare_niced and os.getpriority(os.PRIO_PGRP, spare) == cpu_priority.RESERVE_NICE
        results: list = []
        checking = threading.Thread(target=lambda: results.append(warm.plan(**REQUEST)))
        checking.start()
        own = os.getpriority(os.PRIO_PROCESS, 0)
        wait_for(
            "the taken spare to plan at the dispatcher's priority",
            lambda: gone(spare) or os.getpriority(os.PRIO_PGRP, spare) == own,
            timeout_s=10,
            poll_s=0.01,
        )
        checking.join(120)
        assert results and results[0] is not None and results[0].get("ok"), results
    finally:
        warm.close()


@pytest.mark.skipif(not cpu_priority.may_raise_priority(), reason="spares start at the dispatcher's priority here")
def test_a_spare_not_taken_stays_niced_while_a_taskmanager_starts_a_driver_urgently(monkeypatch):
    """A just-started cluster's spare got its priority back 30 s after the dispatcher's start, while
    a restarted TaskManager started the driver the next failover lands on: in reserve it is niced
    whenever a TaskManager starts a driver at its full priority, and RESERVE_MAX_S ends that."""
    monkeypatch.setattr(warm_planner_module, "RESERVE_POLL_S", 0.1)
    monkeypatch.setattr(warm_planner_module, "CALM_S", 0.5)
    calm = threading.Event()
    warm = warm_planner(no_urgent_warm_up=calm.is_set)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        warm.replenish(in_reserve=True)
        spare = warm.spare_pid
        assert spare is not None and warm.spare_niced
        time.sleep(2.0)  # well past several looks: an urgent warm-up goes on, the spare stays niced
        assert warm.spare_niced and os.getpriority(os.PRIO_PGRP, spare) == cpu_priority.RESERVE_NICE
        calm.set()
        wait_for("the spare's priority back once no warm-up is urgent", lambda: not warm.spare_niced, timeout_s=10)
        assert os.getpriority(os.PRIO_PGRP, spare) == own
        calm.clear()  # a TaskManager started again warms up the driver the next failover lands on
        wait_for("the spare niced again", lambda: warm.spare_niced, timeout_s=10)
        assert os.getpriority(os.PRIO_PGRP, spare) == cpu_priority.RESERVE_NICE
    finally:
        warm.close()
    monkeypatch.setattr(warm_planner_module, "RESERVE_MAX_S", 0.5)
    warm = warm_planner(no_urgent_warm_up=lambda: False)
    try:
        warm.replenish(in_reserve=True)
        wait_for("the spare's priority back after RESERVE_MAX_S", lambda: not warm.spare_niced, timeout_s=10)
    finally:
        warm.close()


def test_a_spare_has_planned_a_pipeline_before_it_says_ready(tmp_path):
    """A JVM's first plan pays for Catalyst's analysis paths: the spare plans one of its own before
    its ready line, so the check that takes it does not."""
    log = tmp_path / "planner.log"
    cmd = [sys.executable, "-m", "services.taskmanager.runtime.planner", "--await-request", "--workdir", str(tmp_path)]
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [*cmd, *SparkRuntime(DEFAULT_CACHE_DIR).cli_args()],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert json.loads(proc.stdout.readline()) == {"ready": True}, log.read_text()[-2000:]
        assert "planner warm-up: planned in" in log.read_text(), log.read_text()[-2000:]
        request = {"artifact": PIPELINE, "args": ARGS, "config": {"spark.sql.shuffle.partitions": "3"}}
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        assert result["ok"], result
        cold = run_planner(python=sys.executable, **REQUEST)
        assert cold is not None and result["plan"] == cold["plan"]  # nothing of the warm-up's plan left over
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
