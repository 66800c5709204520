"""A JobManager that is no longer the leader commits and sends nothing; what earlier leaders left
in the outbox is decided again, never sent under a newer epoch; deploys and cancels that are
never acknowledged time out; redelivered failures and progress reports count once.

The Harness of test_scheduling.py: a real SQLite catalog, the in-memory transport, a fake clock."""

from __future__ import annotations

import pytest

from services.jobmanager.job_master import JobMaster
from services.jobmanager.unit_of_work import LeadershipLost
from shared import streams
from shared.catalog import repository as repo
from shared.messages import (
    CancelJob,
    CancelTask,
    CommandRejected,
    DeployTask,
    SlotState,
    TaskManagerHeartbeat,
    TaskProgress,
    TaskStateChanged,
    decode,
)
from shared.states import ExecutionState as ES
from tests.component.harness import Harness, executions_of


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path)


def new_leader(h, epoch: int) -> JobMaster:
    jm = JobMaster(h.settings, h.catalog, h.t, h.gw, h.clock, epoch=epoch)
    with jm.unit_of_work():
        jm.recover()
    return jm


def running(h, **submit):
    job = h.submit(**submit)
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    return job, cmd


def wait(h, seconds: float, *deploys: DeployTask) -> None:
    """Let `seconds` pass with both TaskManagers heartbeating, reporting the slots of `deploys`."""
    reports = {"tm-0": [], "tm-1": []}
    for d in deploys:
        reports[d.taskmanager_id] += [
            SlotState(index=i, allocation_id=d.allocation_id, job_id=d.spec.job_id, execution_id=d.spec.execution_id)
            for i in d.slot_indices
        ]
    left = seconds
    while left > 0:
        step = min(2.0, left)
        h.clock.advance(step)
        left -= step
        for tm, report in reports.items():
            h.t.publish(streams.RM_HEARTBEAT_STREAM, TaskManagerHeartbeat(taskmanager_id=tm, slot_report=tuple(report)))
        h.pump()


def fail_report(cmd: DeployTask, ex_tm: str) -> TaskStateChanged:
    return TaskStateChanged(
        execution_id=cmd.spec.execution_id,
        job_id=cmd.spec.job_id,
        taskmanager_id=ex_tm,
        state=ES.FAILED,
        failure_cause="boom",
    )


def test_a_deposed_leader_commits_nothing_even_for_jobs_the_new_leader_has_not_touched(h):
    job, cmd = running(h, restart={"type": "fixed-delay", "attempts": 3, "delay": 0})
    old = h.jm
    h.jm = new_leader(h, epoch=2)  # the old one was paused; it wakes up with a batch to finish
    ex_tm = h.execution(cmd.spec.execution_id).taskmanager_id
    with pytest.raises(LeadershipLost):
        with old.unit_of_work():
            old.handle(_env(fail_report(cmd, ex_tm)))
    assert h.execution(cmd.spec.execution_id).state == "RUNNING"
    assert h.job(job).status == "RUNNING" and h.job(job).restart_state is None
    with h.catalog.session() as s:
        assert repo.pending_outbox(s) == []  # and nothing it decided waits to be sent


def _env(body):
    from shared.messages import wrap

    return wrap(body, sender=f"taskmanager:{body.taskmanager_id}")


def test_a_deposed_leader_neither_sends_nor_deletes_the_new_leaders_outbox_entries(h):
    job = h.submit()
    old = h.jm
    h.jm = JobMaster(h.settings, h.catalog, h.t, h.gw, h.clock, epoch=2)
    h.jm.outbox.transport = type(
        "Down", (), {"publish_many": lambda *a, **k: (_ for _ in ()).throw(ConnectionError())}
    )()
    with h.jm.unit_of_work():
        h.jm.recover()  # claims; re-derives nothing yet
    h.t.drain(streams.JM_STREAM, streams.JM_GROUP, h.jm.handle, around_batch=h.jm.unit_of_work)
    with h.catalog.session() as s:
        rows = repo.pending_outbox(s)
        assert rows and {decode(r.envelope).epoch for r in rows} == {2}
    sent_before = len(h.t._streams[streams.RM_STREAM])
    with pytest.raises(repo.StaleEpoch):
        old.outbox.replay()
    with h.catalog.session() as s:
        assert len(repo.pending_outbox(s)) == len(rows)
    assert len(h.t._streams[streams.RM_STREAM]) == sent_before
    assert h.attempts(job) == [(0, "SCHEDULED")]


def test_a_deploy_committed_by_the_old_leader_goes_out_only_under_the_new_epoch(h):
    h.gw.deploy = lambda queue, cmd: (_ for _ in ()).throw(ConnectionError("Redis is down"))
    job = h.submit()
    h.pump()
    [(ex_id, state)] = [(e.id, e.state) for e in executions_of(h, job)]
    assert state == "DEPLOYING"
    del h.gw.deploy
    sent = []
    h.jm = JobMaster(h.settings, h.catalog, h.t, h.gw, h.clock, epoch=2)
    h.jm.outbox.gateway = type(
        "G",
        (),
        {
            "deploy": lambda self, q, c: sent.append(("epoch", h.jm.epoch, c)),
            "cancel": lambda self, q, c: None,
            "trigger_checkpoint": lambda self, q, c: None,
        },
    )()
    with h.jm.unit_of_work():
        h.jm.recover()
    [(_, epoch, cmd)] = sent
    assert epoch == 2 and cmd.spec.execution_id == ex_id
    with h.catalog.session() as s:
        assert {decode(r.envelope).epoch for r in repo.pending_outbox(s)} <= {2}


def test_a_deploy_never_acknowledged_fails_over_after_the_timeout(h):
    job = h.submit(restart={"type": "fixed-delay", "attempts": 1, "delay": 0})
    h.pump()
    [cmd] = h.deployed()  # "lost": the TaskManager never answers
    wait(h, h.settings.deploy_ack_timeout_s - 1, cmd)
    assert h.execution(cmd.spec.execution_id).state == "DEPLOYING"
    wait(h, 2, cmd)
    ex = h.execution(cmd.spec.execution_id)
    assert ex.state == "FAILED" and "did not acknowledge the deployment" in ex.failure_cause
    [again] = h.deployed()
    assert again.spec.attempt == 1 and again.spec.job_id == job


def test_a_rejected_deploy_fails_over_at_once(h):
    job = h.submit(restart={"type": "fixed-delay", "attempts": 1, "delay": 0})
    h.pump()
    [cmd] = h.deployed()
    tm = h.execution(cmd.spec.execution_id).taskmanager_id
    h.t.publish(
        streams.JM_STREAM,
        CommandRejected(
            taskmanager_id=tm,
            command="DeployTask",
            execution_id=cmd.spec.execution_id,
            job_id=job,
            reason="spec failed validation: parallelism: must be > 0",
        ),
    )
    h.pump()
    assert "spec failed validation" in h.execution(cmd.spec.execution_id).failure_cause
    [again] = h.deployed()
    assert again.spec.attempt == 1


def test_a_cancel_never_confirmed_is_sent_again_then_given_up_and_its_slots_freed(h):
    job, cmd = running(h)
    free = h.rm.slots.free_slots()
    h.gw.sent.clear()
    h.t.publish(streams.JM_STREAM, CancelJob(job_id=job))
    h.pump()
    assert [type(c) for _, c in h.gw.sent] == [CancelTask]
    wait(h, h.settings.cancel_ack_timeout_s + 1, cmd)
    assert [type(c) for _, c in h.gw.sent] == [CancelTask, CancelTask]
    assert h.execution(cmd.spec.execution_id).state == "CANCELING"
    wait(h, h.settings.cancel_ack_timeout_s + 1, cmd)
    assert h.execution(cmd.spec.execution_id).state == "CANCELED"
    assert h.job(job).status == "CANCELED"
    assert h.rm.slots.free_slots() == free + len(cmd.slot_indices)


def test_a_failure_redelivered_after_a_rollback_uses_one_restart_not_two(h):
    job, cmd = running(h, restart={"type": "fixed-delay", "attempts": 1, "delay": 0})
    ex_tm = h.execution(cmd.spec.execution_id).taskmanager_id
    # The first delivery is handled, then its unit of work rolls back (the catalog failed at commit).
    with pytest.raises(RuntimeError):
        with h.jm.unit_of_work():
            h.jm.handle(_env(fail_report(cmd, ex_tm)))
            raise RuntimeError("commit failed")
    h.t.publish(streams.JM_STREAM, fail_report(cmd, ex_tm))  # redelivered
    h.pump()
    assert h.job(job).restart_state == {"failures": 1}
    [again] = h.deployed()  # one restart allowed, one used: the job restarted, it did not fail
    assert again.spec.attempt == 1 and h.job(job).status == "RUNNING"


def test_the_restart_budget_survives_a_leader_change(h):
    job, cmd = running(h, restart={"type": "fixed-delay", "attempts": 1, "delay": 0})
    h.report(cmd, ES.FAILED, cause="first")
    [second] = h.deployed()
    h.report(second, ES.INITIALIZING, ES.RUNNING)
    h.jm = new_leader(h, epoch=2)
    h.report(second, ES.FAILED, cause="second")
    assert h.job(job).status == "FAILED"  # the new leader knew one of one restarts was used


def test_a_redelivered_progress_report_is_counted_once(h):
    job, cmd = running(h)
    p = TaskProgress(execution_id=cmd.spec.execution_id, job_id=job, batch_id=0, num_input_rows=500)
    sender = f"taskmanager:{cmd.taskmanager_id}"
    for _ in range(2):
        h.t.publish(streams.JM_STREAM, p, sender=sender)
        h.pump()
    h.t.publish(
        streams.JM_STREAM,
        TaskProgress(execution_id=cmd.spec.execution_id, job_id=job, batch_id=1, num_input_rows=7),
        sender=sender,
    )
    h.pump()
    ex = h.execution(cmd.spec.execution_id)
    assert (ex.last_batch_id, ex.rows_processed) == (1, 507)
