"""The checkpoint coordinator inside a real JobMaster (in-memory transport, SQLite catalog, fake
clock): triggers, acknowledgements, declines, timeouts, retention, savepoints, restore points,
rescaling and a leader change. The TaskManager side is scripted: acks are published by the test,
and the snapshot directories are real ones written with shared.checkpoint_storage."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.jobmanager.job_master import JobMaster
from shared import streams
from shared.catalog import repository as repo
from shared.messages import CancelTask, CheckpointDeclined, DeployTask
from shared.states import ExecutionState as ES
from tests.component.harness import CONFIG, Harness, ack, operation, request, triggers


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path)


def running_job(h, config=CONFIG, restart=None):
    job = h.submit(config=dict(config), restart=restart)
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    return job, cmd


def rows(h, job):
    with h.catalog.session() as s:
        return [(r.checkpoint_id, r.kind, r.status) for r in repo.list_checkpoints(s, job, newest_first=False)]


def test_periodic_checkpoints_complete_and_only_the_retained_ones_stay(h):
    job, cmd = running_job(h)
    assert triggers(h) == []  # not before the first interval has passed
    paths = []
    for n in range(1, 5):
        h.clock.advance(1.0)
        h.pump()
        [trig] = triggers(h)
        assert (trig.checkpoint_id, trig.kind, trig.execution_id) == (n, "checkpoint", cmd.spec.execution_id)
        assert trig.target == str(h.settings.checkpoints / job / f"chk-{n}")
        paths.append(ack(h, trig, batch_id=10 * n))
    assert rows(h, job) == [
        (1, "checkpoint", "DISCARDED"),
        (2, "checkpoint", "DISCARDED"),
        (3, "checkpoint", "COMPLETED"),
        (4, "checkpoint", "COMPLETED"),
    ]
    assert [Path(p).exists() for p in paths] == [False, False, True, True]
    with h.catalog.session() as s:
        latest = repo.list_checkpoints(s, job, statuses=None)[0]
        assert (latest.batch_id, latest.state_size, latest.path) == (40, 123, paths[-1])


def test_max_concurrent_holds_back_triggers_until_the_pending_one_ends(h):
    job, _ = running_job(h)
    h.clock.advance(1.0)
    h.pump()
    [first] = triggers(h)
    h.clock.advance(3.0)
    h.pump()
    assert triggers(h) == []  # one pending (max-concurrent-checkpoints 1)
    ack(h, first)
    h.clock.advance(1.0)
    h.pump()
    assert [t.checkpoint_id for t in triggers(h)] == [2]


def test_expired_checkpoint_fails_the_job_over_and_the_restart_restores_the_latest(h):
    config = {**CONFIG, "execution.checkpointing.timeout": "5 s"}
    job, cmd = running_job(h, config, restart={"type": "fixed-delay", "attempts": 3, "delay": 0})
    h.clock.advance(1.0)
    h.pump()
    [first] = triggers(h)
    completed = ack(h, first)
    h.clock.advance(1.0)
    h.pump()
    [second] = triggers(h)
    h.clock.advance(5.5)
    h.pump()
    assert rows(h, job)[1] == (2, "checkpoint", "FAILED")
    with h.catalog.session() as s:
        assert "expired" in repo.get_checkpoint(s, job, 2).failure_cause
        [exc] = repo.job_exceptions(s, job)
        assert exc.exception_name == "CheckpointException" and "tolerable failure threshold" in exc.stacktrace
    h.report(cmd, ES.CANCELED)  # the failed-over attempt's task stops
    h.pump()
    [redeploy] = h.deployed()
    assert redeploy.spec.attempt == 1
    assert redeploy.spec.restore_from == completed and redeploy.spec.restore_checkpoint_id == 1
    assert redeploy.spec.checkpoint_dir != cmd.spec.checkpoint_dir  # never the old attempt's live dir
    assert h.execution(redeploy.spec.execution_id).restored_from == completed


def test_a_checkpoint_failover_cancels_the_running_attempt_and_keeps_its_slot_until_it_stopped(tmp_path):
    # One TaskManager with one slot: the restart may only be deployed once the old attempt's
    # TaskManager confirmed it stopped (else the deploy lands in a slot the old one occupies).
    h = Harness(tmp_path, slots=(1,))
    config = {**CONFIG, "execution.checkpointing.timeout": "5 s"}
    job, cmd = running_job(h, config, restart={"type": "fixed-delay", "attempts": 3, "delay": 0})
    h.clock.advance(1.0)
    h.pump()
    [trig] = triggers(h)
    h.clock.advance(5.5)
    h.pump()
    old = cmd.spec.execution_id
    cancels = [c for _, c in h.gw.sent if isinstance(c, CancelTask)]
    assert [c.execution_id for c in cancels] == [old]
    assert h.execution(old).state == ES.CANCELING.value
    h.clock.advance(2.0)
    h.pump()
    assert h.deployed() == [], "a restart was deployed while the old attempt still held the only slot"
    h.report(cmd, ES.CANCELED)
    h.pump()
    [redeploy] = h.deployed()
    assert redeploy.spec.attempt == 1 and redeploy.slot_indices == cmd.slot_indices


def test_tolerable_failures_let_declines_pass_and_a_completion_resets_the_count(h):
    config = {**CONFIG, "execution.checkpointing.tolerable-failed-checkpoints": 1}
    job, cmd = running_job(h, config)
    for expected_failures in (1, 0):
        h.clock.advance(1.0)
        h.pump()
        [trig] = triggers(h)
        if expected_failures:
            h.t.publish(
                streams.JM_STREAM,
                CheckpointDeclined(
                    job_id=job,
                    execution_id=trig.execution_id,
                    taskmanager_id=trig.taskmanager_id,
                    checkpoint_id=trig.checkpoint_id,
                    reason="disk full",
                ),
            )
            h.pump()
        else:
            ack(h, trig)
        assert h.job(job).checkpoint_failures == expected_failures
        assert h.job(job).status == "RUNNING"


def test_a_batch_task_declines_permanently_and_is_not_triggered_again(h):
    job, _ = running_job(h)
    h.clock.advance(1.0)
    h.pump()
    [trig] = triggers(h)
    h.t.publish(
        streams.JM_STREAM,
        CheckpointDeclined(
            job_id=job,
            execution_id=trig.execution_id,
            taskmanager_id=trig.taskmanager_id,
            checkpoint_id=trig.checkpoint_id,
            reason="a batch task has no checkpoints",
            permanent=True,
        ),
    )
    h.pump()
    h.clock.advance(5.0)
    h.pump()
    assert triggers(h) == [] and h.job(job).checkpoint_failures == 0 and h.job(job).status == "RUNNING"


def test_savepoint_completes_its_operation_and_is_never_pruned(h, tmp_path):
    job, _ = running_job(h)
    rid = request(h, job, target_directory=str(h.settings.savepoints / "sp"))
    [trig] = triggers(h)
    assert trig.kind == "savepoint" and not trig.stop_after
    assert Path(trig.target).parent == h.settings.savepoints / "sp" and Path(trig.target).name.startswith(
        f"savepoint-{job[:6]}-"
    )
    location = ack(h, trig)
    op = operation(h, rid)
    assert (op.status, op.location, op.checkpoint_id) == ("COMPLETED", location, trig.checkpoint_id)
    for _ in range(3):  # more checkpoints than retained: the savepoint stays
        h.clock.advance(1.0)
        h.pump()
        [t] = triggers(h)
        ack(h, t)
    assert (trig.checkpoint_id, "savepoint", "COMPLETED") in rows(h, job) and Path(location).exists()


def test_stop_with_savepoint_ends_the_job_finished_and_deletes_its_checkpoints(h, tmp_path):
    job, cmd = running_job(h)
    h.clock.advance(1.0)
    h.pump()
    [chk] = triggers(h)
    chk_path = ack(h, chk)
    rid = request(h, job, target_directory=str(h.settings.savepoints / "sp"), after="stop")
    [trig] = triggers(h)
    assert trig.stop_after
    sp = ack(h, trig)
    h.report(cmd, ES.FINISHED)  # the driver stops its query after the savepoint
    assert h.job(job).status == "FINISHED"
    assert operation(h, rid).status == "COMPLETED"
    assert Path(sp).exists() and not Path(chk_path).exists()


def test_savepoint_of_a_job_whose_task_will_not_run_again_fails_with_a_reason(h, tmp_path):
    # (One whose task is still on its way waits for it: tests/component/test_waiting_snapshots.py.)
    job, cmd = running_job(h)
    h.report(cmd, ES.FINISHED)
    rid = request(h, job, target_directory=str(h.settings.savepoints / "sp"))
    op = operation(h, rid)
    assert op.status == "FAILED" and "is FINISHED: snapshots need a RUNNING job" in op.failure_cause


def test_pending_checkpoints_of_an_ended_attempt_fail_without_counting(h):
    job, cmd = running_job(h, restart={"type": "fixed-delay", "attempts": 3, "delay": 0})
    h.clock.advance(1.0)
    h.pump()
    [trig] = triggers(h)
    h.report(cmd, ES.FAILED, cause="boom")
    assert rows(h, job) == [(1, "checkpoint", "FAILED")]
    assert h.job(job).checkpoint_failures == 0
    # a late ack of it is ignored and its files removed
    late = ack(h, trig)
    assert rows(h, job) == [(1, "checkpoint", "FAILED")] and not Path(late).exists()


def test_rescale_restarts_from_the_savepoint_with_the_new_parallelism(h, tmp_path):
    job, cmd = running_job(h)
    rid = request(h, job, target_directory=str(h.settings.savepoints / "sp"), after="rescale", parallelism=3)
    [trig] = triggers(h)
    assert trig.stop_after
    sp = ack(h, trig)
    h.report(cmd, ES.FINISHED)
    h.pump()
    [redeploy] = h.deployed()
    assert redeploy.spec.parallelism == 3 and len(redeploy.slot_indices) == 3
    assert redeploy.spec.restore_from == sp
    assert h.job(job).status == "RUNNING" and operation(h, rid).status == "COMPLETED"


def test_manual_checkpoint_request(h):
    job, _ = running_job(h, config={})
    rid = request(h, job, kind="checkpoint")
    [trig] = triggers(h)
    assert trig.kind == "checkpoint"
    ack(h, trig)
    op = operation(h, rid)
    assert op.status == "COMPLETED" and op.checkpoint_id == trig.checkpoint_id


def test_a_new_leader_adopts_pending_checkpoints_and_continues_the_numbering(h):
    job, _ = running_job(h)
    h.clock.advance(1.0)
    h.pump()
    [first] = triggers(h)
    # a new JobManager (next epoch) takes over the same catalog and transport
    h.jm = JobMaster(h.settings, h.catalog, h.t, h.gw, h.clock, epoch=2)
    with h.jm.unit_of_work():
        h.jm.recover()
    # The new leader cannot know whether the old one's trigger went out: it sends it again under
    # its own epoch (the driver serves each checkpoint id once).
    assert [(t.checkpoint_id, t.execution_id) for t in triggers(h)] == [(1, first.execution_id)]
    ack(h, first)
    assert rows(h, job) == [(1, "checkpoint", "COMPLETED")]
    h.clock.advance(1.0)
    h.pump()
    assert [t.checkpoint_id for t in triggers(h)] == [2]


def test_noop_jobs_do_not_checkpoint_by_cluster_default(h):
    assert h.settings.checkpointing.get("execution.checkpointing.interval")
    h.submit()
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    h.clock.advance(30)
    h.pump()
    assert triggers(h) == []
    assert isinstance(cmd, DeployTask)
