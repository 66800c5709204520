"""Tasks that never start, on a real local cluster (JobManager, ResourceManager, one TaskManager,
dispatcher, redis-server, PostgreSQL catalog): a pipeline whose build() hangs fails at its
start-up timeout with where it hung, through the restart strategy, and its driver is gone; a
deploy that breaks before its task starts fails the attempt and frees its slots instead of
leaving it DEPLOYING."""

from __future__ import annotations

import psutil
import pytest
import redis

from shared.catalog import Catalog, repository
from shared.ids import new_job_id
from shared.message_auth import control_plane_auth
from shared.messages import SubmitJob
from shared.streams import JM_STREAM
from shared.transport import RedisStreamsTransport
from tests.clusters import start_cluster
from tests.waiting import wait_for

HANGING_BUILD = """\
import time


def build(ctx):
    time.sleep(3600)  # stands for an import or a build() that never returns
"""
SLOTS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(
        tmp_path_factory.mktemp("startup-home"), catalog_url=pg_url_module, taskmanagers=1, slots=SLOTS, warm_drivers=0
    )
    yield c
    c.stop()


def _drivers_of(cluster) -> list[psutil.Process]:
    tm = psutil.Process(cluster.child("taskmanager-1").proc.pid)
    return [p for p in tm.children(recursive=True) if "services.taskmanager.runtime.runner" in " ".join(p.cmdline())]


def test_a_hanging_build_fails_at_the_startup_timeout_and_restarts(cluster, rest, tmp_path):
    pipeline = tmp_path / "hangs_in_build.py"
    pipeline.write_text(HANGING_BUILD)
    job = rest.run(
        rest.upload(pipeline),
        parallelism=1,
        restartStrategy={"type": "fixed-delay", "attempts": 1, "delay": "100 ms"},
        config={"headrace.task.startup-timeout": "3 s"},
    )
    # Two cold Spark drivers (no warm ones here) on a shared 2-core machine: minutes at worst.
    final = rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=300)
    assert final["state"] == "FAILED"
    attempts = rest.attempts(job)
    assert [(a["attempt"], a["status"]) for a in attempts] == [(0, "FAILED"), (1, "FAILED")], attempts
    for a in attempts:
        cause = a["failure-cause"]
        assert "the pipeline did not start within 3 s: it was still building the pipeline (in build(ctx))" in cause
        assert "headrace.task.startup-timeout" in cause
        assert "hangs_in_build.py" in cause and "line 5 in build" in cause, cause  # the thread dump
    history = rest.get(f"/jobs/{job}/exceptions")["exceptionHistory"]["entries"]
    assert [e["exceptionName"] for e in history] == ["PipelineStartupTimeout"] * 2
    # The restart strategy decided: one restart, then the job failed.
    assert "RESTARTING" in final["timestamps"]
    wait_for(
        "the stuck drivers killed", lambda: _drivers_of(cluster), 15, poll_s=0.2, until=lambda drivers: drivers == []
    )
    assert rest.wait_free_slots(SLOTS, timeout_s=10) == SLOTS


def test_a_slow_noop_start_fails_at_the_timeout_and_a_quick_one_runs(rest, jar):
    slow = rest.run(
        jar,
        kind="noop",
        restartStrategy={"type": "none"},
        config={"noop.startup-delay": "30 s", "headrace.task.startup-timeout": "1 s"},
    )
    quick = rest.run(
        jar,
        kind="noop",
        restartStrategy={"type": "none"},
        config={"noop.startup-delay": "200 ms", "noop.duration": 0.2, "headrace.task.startup-timeout": "5 s"},
    )
    assert rest.wait_state(slow, ("FAILED", "FINISHED"), timeout_s=20)["state"] == "FAILED"
    assert "did not start within 1 s" in rest.attempts(slow)[0]["failure-cause"]
    assert rest.wait_state(quick, ("FAILED", "FINISHED"), timeout_s=20)["state"] == "FINISHED"


def test_a_deploy_that_breaks_fails_the_attempt_and_frees_its_slots(cluster, rest, jar):
    # The dispatcher refuses this option now; a job stored before that check (or written by
    # another client) must still fail rather than stay DEPLOYING holding its slots.
    job_id = new_job_id()
    catalog = Catalog(cluster.settings.catalog)
    try:
        with catalog.session() as s:
            repository.create_job(
                s,
                id=job_id,
                name="bad-config",
                artifact_id=jar,
                entry="build",
                parallelism=SLOTS,
                program_args=[],
                config={"noop.duration": "abc"},
                restart_strategy={"type": "none"},
                kind="noop",
            )
    finally:
        catalog.dispose()
    client = redis.Redis.from_url(cluster.redis_url)
    try:
        # As the dispatcher submits: signed with the cluster's keys (shared/message_auth.py).
        RedisStreamsTransport(client, sender="test", auth=control_plane_auth(cluster.settings)).publish(
            JM_STREAM, SubmitJob(job_id=job_id)
        )
    finally:
        client.close()
    final = rest.wait_state(job_id, ("FAILED", "FINISHED"), timeout_s=30)
    assert final["state"] == "FAILED"
    cause = rest.attempts(job_id)[0]["failure-cause"]
    assert "could not be started" in cause and "noop.duration" in cause and "'abc'" in cause, cause
    assert rest.wait_free_slots(SLOTS, timeout_s=10) == SLOTS
