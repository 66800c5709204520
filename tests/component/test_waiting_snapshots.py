"""Snapshot requests that come before the job's task runs (right after submission, while it
deploys or initializes, while the job restarts) wait for it inside a real JobMaster (in-memory
transport, SQLite catalog, fake clock): triggered once the task is RUNNING, failed past
execution.checkpointing.timeout or when the job ends, resumed by a new leader. The operation row
says why it waits meanwhile."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.jobmanager.job_master import JobMaster
from shared import streams
from shared.messages import RequestSavepoint, SubmitJob
from shared.states import ExecutionState as ES
from tests.component.harness import Harness, ack, operation, request, triggers

CONFIG = {"execution.checkpointing.timeout": "30 s"}


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path)


def savepoint(h, job, **body) -> str:
    return request(h, job, target_directory=str(h.settings.savepoints / "sp"), **body)


def waiting(h, rid) -> dict:
    op = operation(h, rid)
    assert op.status == "IN_PROGRESS", op.failure_cause
    return op.params["waiting"]


def execution_of(cmd) -> str:
    spec = cmd.spec  # a TaskSpec, or the dict older commands carried
    return spec["execution_id"] if isinstance(spec, dict) else spec.execution_id


def settle(h, seconds: float) -> None:
    """Let `seconds` pass in small steps, as the JobManager's loop would."""
    for _ in range(int(seconds / 0.25)):
        h.clock.advance(0.25)
        h.pump()


def test_a_savepoint_asked_right_after_submission_completes_once_the_task_runs(h):
    job = h.submit(config=CONFIG, announce=False)
    rid = savepoint(h, job)  # before the JobManager even planned the job
    assert "job INITIALIZING" in waiting(h, rid)["reason"]
    h.t.publish(streams.JM_STREAM, SubmitJob(job_id=job))
    h.pump()
    [cmd] = h.deployed()
    settle(h, 1)
    assert "DEPLOYING" in waiting(h, rid)["reason"] and triggers(h) == []
    h.report(cmd, ES.INITIALIZING)
    settle(h, 1)
    wait = waiting(h, rid)
    assert "attempt 0 INITIALIZING" in wait["reason"] and wait["deadline"] - wait["since"] == 30
    assert triggers(h) == []
    h.report(cmd, ES.RUNNING)
    settle(h, 0.5)
    [trig] = triggers(h)
    assert trig.kind == "savepoint" and trig.execution_id == cmd.spec.execution_id and not trig.stop_after
    assert Path(trig.target).parent == h.settings.savepoints / "sp"
    location = ack(h, trig)
    op = operation(h, rid)
    assert (op.status, op.location, op.checkpoint_id) == ("COMPLETED", location, trig.checkpoint_id)
    assert "waiting" not in op.params and op.params["waited_s"] >= 2


def test_stop_with_savepoint_waits_too_and_then_stops_the_job(h):
    job = h.submit(config=CONFIG)
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING)
    rid = savepoint(h, job, after="stop")
    assert "INITIALIZING" in waiting(h, rid)["reason"]
    h.report(cmd, ES.RUNNING)
    settle(h, 0.5)
    [trig] = triggers(h)
    assert trig.stop_after
    ack(h, trig)
    h.report(cmd, ES.FINISHED)
    assert operation(h, rid).status == "COMPLETED" and h.job(job).status == "FINISHED"


def test_the_wait_is_bounded_by_the_checkpoint_timeout(h):
    job = h.submit(config={"execution.checkpointing.timeout": "5 s"})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING)
    rid = savepoint(h, job)
    settle(h, 4.5)
    assert waiting(h, rid)
    settle(h, 1.0)
    op = operation(h, rid)
    assert op.status == "FAILED" and triggers(h) == []
    assert "did not reach RUNNING within 5 s (execution.checkpointing.timeout)" in op.failure_cause
    assert "attempt 0 INITIALIZING" in op.failure_cause
    h.report(cmd, ES.RUNNING)  # running later triggers nothing
    settle(h, 1)
    assert triggers(h) == [] and operation(h, rid).status == "FAILED"


def test_a_job_that_ends_while_the_request_waits_fails_it_with_that_reason(h):
    job = h.submit(config=CONFIG, restart={"type": "none"})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING)
    rid = savepoint(h, job)
    h.report(cmd, ES.FAILED, cause="the pipeline could not start")
    settle(h, 1)
    op = operation(h, rid)
    assert h.job(job).status == "FAILED"
    assert op.status == "FAILED" and "the job reached FAILED first" in op.failure_cause


def test_the_request_waits_through_a_restart_and_snapshots_the_new_attempt(h):
    job = h.submit(config=CONFIG, restart={"type": "fixed-delay", "attempts": 3, "delay": 1})
    h.pump()
    [first] = h.deployed()
    h.report(first, ES.INITIALIZING)
    rid = savepoint(h, job)
    h.report(first, ES.FAILED, cause="boom")
    settle(h, 0.5)
    assert "job RESTARTING" in waiting(h, rid)["reason"]
    settle(h, 1)
    [second] = h.deployed()
    h.report(second, ES.INITIALIZING, ES.RUNNING)
    settle(h, 0.5)
    [trig] = triggers(h)
    assert trig.execution_id == second.spec.execution_id
    ack(h, trig)
    assert operation(h, rid).status == "COMPLETED"


def test_a_new_leader_resumes_the_wait(h):
    job = h.submit(config=CONFIG)
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING)
    rid = savepoint(h, job)
    since = waiting(h, rid)["since"]
    # The leader dies; a new one (next epoch) takes over the same catalog and transport.
    h.jm = JobMaster(h.settings, h.catalog, h.t, h.gw, h.clock, epoch=2)
    with h.jm.unit_of_work():
        h.jm.recover()
    h.report(cmd, ES.RUNNING)
    settle(h, 0.5)
    [trig] = triggers(h)
    assert trig.kind == "savepoint"
    ack(h, trig)
    op = operation(h, rid)
    assert op.status == "COMPLETED" and op.params["waited_s"] >= h.clock.now() - since - 1


def test_a_new_leader_still_enforces_the_bound(h):
    job = h.submit(config={"execution.checkpointing.timeout": "5 s"})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING)
    rid = savepoint(h, job)
    h.clock.advance(6)  # no leader for a while (under the TaskManagers' heartbeat timeout)
    h.jm = JobMaster(h.settings, h.catalog, h.t, h.gw, h.clock, epoch=2)
    with h.jm.unit_of_work():
        h.jm.recover()
    settle(h, 0.5)
    op = operation(h, rid)
    assert op.status == "FAILED" and "within 5 s" in op.failure_cause


def test_a_manual_checkpoint_waits_as_a_savepoint_does(h):
    job = h.submit(config=CONFIG)
    h.pump()
    [cmd] = h.deployed()
    rid = request(h, job, kind="checkpoint")
    assert "DEPLOYING" in waiting(h, rid)["reason"]
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    settle(h, 0.5)
    [trig] = triggers(h)
    assert trig.kind == "checkpoint"
    ack(h, trig)
    assert operation(h, rid).status == "COMPLETED"


def test_a_redelivered_request_does_not_trigger_twice(h):
    job = h.submit(config=CONFIG)
    h.pump()
    [cmd] = h.deployed()
    rid = savepoint(h, job)
    h.t.publish(
        streams.JM_STREAM,
        RequestSavepoint(job_id=job, request_id=rid, target_directory=str(h.settings.savepoints / "sp")),
    )
    h.pump()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    settle(h, 1)
    assert len(triggers(h)) == 1


def test_a_target_outside_the_storage_roots_fails_at_once(h, tmp_path):
    job = h.submit(config=CONFIG)
    h.pump()
    rid = request(h, job, target_directory="/etc/headrace-savepoints")
    op = operation(h, rid)
    assert op.status == "FAILED" and "outside the allowed storage roots" in op.failure_cause
