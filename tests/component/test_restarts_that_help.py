"""Issue 21 finding 9 and the JobManager's half of finding 8, in a real JobMaster and
ResourceManager (in-memory transport, SQLite catalog, fake clock, scripted TaskManagers):

  * a slot request no registered TaskManager could ever hold fails the job at once (after the
    ResourceManager's grace), with the reason, and no restart;
  * an attempt whose snapshot could not be restored marks that checkpoint and the next attempt
    starts from the previous retained one; nothing older, or the submission's own savepoint: the
    job fails with the reason instead of looping through its restarts;
  * a RequestSavepoint on the stream naming a target outside the storage roots fails its
    operation; nothing is triggered.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared import checkpoint_storage as storage
from shared import streams
from shared.catalog import repository as repo
from shared.ids import new_request_id
from shared.messages import (
    RegisterTaskManager,
    RequestSavepoint,
    TaskManagerHeartbeat,
    TaskStateChanged,
    TriggerCheckpoint,
    UnregisterTaskManager,
)
from shared.restore_failure import SnapshotRestoreError
from shared.states import CheckpointStatus as CS
from shared.states import ExecutionState as ES
from tests.component.harness import Harness

RESTARTS = {"type": "fixed-delay", "attempts": 5, "delay": 0}


def exceptions(h, job):
    with h.catalog.session() as s:
        return [(e.exception_name, e.stacktrace) for e in repo.job_exceptions(s, job)]


# --- slot requests that can never be served ------------------------------------------------


def wait(h, seconds: float) -> None:
    """Let time pass with every registered TaskManager heartbeating (idle: no slots in use)."""
    steps = int(seconds * 2)
    for _ in range(steps):
        for tm in list(h.rm.slots.taskmanagers):
            h.t.publish(streams.RM_HEARTBEAT_STREAM, TaskManagerHeartbeat(taskmanager_id=tm, slot_report=()))
        h.clock.advance(seconds / steps)
        h.pump(rounds=1)
    h.pump()


def test_parallelism_above_every_taskmanager_fails_the_job_after_the_grace_without_restarts(tmp_path):
    h = Harness(tmp_path, slots=(2, 2))
    job = h.submit(parallelism=3, restart=RESTARTS)
    h.pump()
    # Within the heartbeat timeout after the ResourceManager started, a larger TaskManager of a
    # previous ResourceManager may still register again: the request waits.
    assert h.job(job).status == "RUNNING" and "no TaskManager has 3 slots" in h.job(job).waiting_reason
    wait(h, h.settings.heartbeat_timeout_s - 1)
    assert h.job(job).status == "RUNNING"
    wait(h, 1.5)
    assert h.job(job).status == "FAILED"
    [(name, text)] = exceptions(h, job)
    assert name == "NoResourceAvailableException"
    assert text.startswith(
        "parallelism 3 needs 3 slots on one TaskManager; the largest registered TaskManager "
        "has 2 (tm-0, tm-1; 2 registered)"
    )
    assert "resubmit with parallelism 2 or less" in text
    assert h.attempts(job) == [(0, "FAILED")]  # no restart, however many the strategy allows
    assert h.deployed() == [] and not h.rm.slots.pending


def test_a_request_that_fits_once_a_bigger_taskmanager_registers_in_the_grace_runs(tmp_path):
    h = Harness(tmp_path, slots=(2,))
    job = h.submit(parallelism=3, restart=RESTARTS)
    h.pump()
    wait(h, 3)
    h.t.publish(
        streams.RM_STREAM,
        RegisterTaskManager(taskmanager_id="tm-big", host="h", slots=4, cores=2, memory_bytes=1, queue="tm.tm-big"),
    )
    h.pump()
    [cmd] = h.deployed()
    assert cmd.taskmanager_id == "tm-big" and h.job(job).status == "RUNNING"


def test_losing_the_only_big_taskmanager_gives_it_the_grace_to_come_back(tmp_path):
    h = Harness(tmp_path, slots=(2, 4))
    wait(h, h.settings.heartbeat_timeout_s + 1)  # the start's grace is over
    h.t.publish(streams.RM_STREAM, UnregisterTaskManager(taskmanager_id="tm-1", reason="restarting"))
    h.pump()
    job = h.submit(parallelism=3, restart=RESTARTS)
    h.pump()
    wait(h, h.settings.heartbeat_timeout_s - 2)
    assert h.job(job).status == "RUNNING"  # the big one may be restarting
    wait(h, 3)
    assert (
        h.job(job).status == "FAILED" and "the largest registered TaskManager has 2 (tm-0;" in exceptions(h, job)[0][1]
    )


def test_no_taskmanager_at_all_is_a_cluster_still_starting_not_a_permanent_failure(tmp_path):
    h = Harness(tmp_path, slots=())
    job = h.submit(parallelism=3, restart={"type": "none"})
    h.pump()
    h.clock.advance(h.settings.heartbeat_timeout_s + 5)
    h.pump()
    assert h.job(job).status == "RUNNING"  # the slot request timeout still applies
    h.clock.advance(h.settings.slot_request_timeout_s)
    h.pump()
    assert h.job(job).status == "FAILED" and "within the slot request timeout" in exceptions(h, job)[0][1]


# --- checkpoints that cannot be restored ---------------------------------------------------


def completed(h, job, cid, kind="checkpoint") -> str:
    """A real completed snapshot recorded as the JobManager records an acknowledged one."""
    path = h.settings.checkpoints / job / f"chk-{cid}"
    storage.take_empty_snapshot(path, metadata={"job_id": job, "kind": kind, "checkpoint_id": cid})
    with h.catalog.session() as s:
        row = repo.create_checkpoint(
            s, job_id=job, checkpoint_id=cid, kind=kind, execution_id=None, vertex_id=None, path=str(path)
        )
        repo.transition_checkpoint(s, row, CS.COMPLETED, batch_id=cid)
        repo.next_value(s, f"checkpoint:{job}")
    return str(path)


def fail(h, cmd, name: str, cause: str) -> None:
    ex = h.execution(cmd.spec.execution_id)
    h.t.publish(
        streams.JM_STREAM,
        TaskStateChanged(
            execution_id=ex.id,
            job_id=ex.job_id,
            taskmanager_id=ex.taskmanager_id,
            state=ES.FAILED,
            failure_name=name,
            failure_cause=cause,
        ),
    )
    h.pump()


def restore_failed(h, cmd, why="spark/offsets/2: not a Spark offset log") -> None:
    fail(
        h,
        cmd,
        SnapshotRestoreError.__name__,
        f"Traceback (most recent call last):\n  ...\nshared.restore_failure.SnapshotRestoreError: the snapshot "
        f"{cmd.spec.restore_from} could not be restored: {why}\n",
    )


def checkpoint_rows(h, job):
    with h.catalog.session() as s:
        return {r.checkpoint_id: (r.status, r.failure_cause) for r in repo.list_checkpoints(s, job)}


def test_a_checkpoint_that_cannot_be_restored_is_marked_and_the_restart_uses_the_previous_one(tmp_path):
    h = Harness(tmp_path)
    job = h.submit(restart=RESTARTS)
    h.pump()
    [first] = h.deployed()
    h.report(first, ES.INITIALIZING, ES.RUNNING)
    one, two = completed(h, job, 1), completed(h, job, 2)
    fail(h, first, "TaskFailure", "boom")
    [second] = h.deployed()
    assert second.spec.restore_from == two and second.spec.restore_checkpoint_id == 2
    restore_failed(h, second)
    [third] = h.deployed()
    assert third.spec.restore_from == one and third.spec.restore_checkpoint_id == 1
    assert checkpoint_rows(h, job) == {
        2: (
            "DISCARDED",
            "restore failed: the snapshot " + two + " could not be restored: spark/offsets/2: not a Spark offset log",
        ),
        1: ("COMPLETED", None),
    }
    assert Path(two, "_metadata").is_file()  # kept for inspection: retention never deletes it
    name, text = exceptions(h, job)[0]
    assert name == "SnapshotRestoreError"
    assert text.startswith(
        f"checkpoint 2 could not be restored (the snapshot {two} could not be restored: "
        f"spark/offsets/2: not a Spark offset log); restarting from checkpoint 1\n"
    )
    # The next checkpoint after the fallback is 3, and restores come from it again.
    h.report(third, ES.INITIALIZING, ES.RUNNING)
    three = completed(h, job, 3)
    fail(h, third, "TaskFailure", "boom again")
    [fourth] = h.deployed()
    assert fourth.spec.restore_from == three


def test_nothing_older_to_fall_back_to_fails_the_job_instead_of_starting_over(tmp_path):
    h = Harness(tmp_path)
    job = h.submit(restart=RESTARTS)
    h.pump()
    [first] = h.deployed()
    h.report(first, ES.INITIALIZING, ES.RUNNING)
    completed(h, job, 1)
    fail(h, first, "TaskFailure", "boom")
    [second] = h.deployed()
    restore_failed(h, second)
    assert h.job(job).status == "FAILED" and h.deployed() == []
    text = exceptions(h, job)[0][1]
    assert text.startswith("checkpoint 1 could not be restored (") and "no older retained checkpoint" in text
    assert checkpoint_rows(h, job)[1][0] == "DISCARDED"


def test_the_savepoint_a_job_was_submitted_with_is_never_silently_replaced(tmp_path):
    h = Harness(tmp_path)
    sp = h.settings.savepoints / "savepoint-abcdef-0123456789ab"
    storage.take_empty_snapshot(sp, metadata={"job_id": "0" * 32, "kind": "savepoint"})
    job = h.submit(restart=RESTARTS, config={"execution.savepoint.path": str(sp)})
    h.pump()
    [first] = h.deployed()
    assert first.spec.restore_from == str(sp) and first.spec.restore_checkpoint_id is None
    restore_failed(h, first, why="spark/: 3 files, its metadata counted 4")
    assert h.job(job).status == "FAILED" and h.deployed() == []
    text = exceptions(h, job)[0][1]
    assert text.startswith(f"the savepoint {sp} the job was submitted to start from could not be restored (")
    assert "submit the job again" in text


def test_other_failures_still_restart_from_the_latest_checkpoint(tmp_path):
    h = Harness(tmp_path)
    job = h.submit(restart=RESTARTS)
    h.pump()
    [first] = h.deployed()
    h.report(first, ES.INITIALIZING, ES.RUNNING)
    two = (completed(h, job, 1), completed(h, job, 2))[1]
    fail(h, first, "TaskFailure", "boom")
    [second] = h.deployed()
    fail(h, second, "Py4JJavaError", "a pipeline bug, not the snapshot's")
    [third] = h.deployed()
    assert third.spec.restore_from == two and checkpoint_rows(h, job)[2] == ("COMPLETED", None)


# --- savepoint targets on the JobManager's side --------------------------------------------


@pytest.mark.parametrize("target", ["/etc", "{savepoints}/../../../etc", "{link}"])
def test_a_forged_savepoint_request_outside_the_roots_fails_and_triggers_nothing(tmp_path, target):
    h = Harness(tmp_path)
    link = h.settings.savepoints / "escape"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("/etc")
    job = h.submit(restart=RESTARTS)
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    rid = new_request_id()
    with h.catalog.session() as s:
        repo.create_operation(s, id=rid, kind="savepoint", job_id=job, params={})
    h.t.publish(
        streams.JM_STREAM,
        RequestSavepoint(
            job_id=job, request_id=rid, target_directory=target.format(savepoints=h.settings.savepoints, link=link)
        ),
    )
    h.pump()
    with h.catalog.session() as s:
        op = repo.get_operation(s, rid)
        assert op.status == "FAILED" and "outside the allowed storage roots" in op.failure_cause
        assert repo.list_checkpoints(s, job) == []
    assert not [c for _, c in h.gw.sent if isinstance(c, TriggerCheckpoint)]
    assert h.job(job).status == "RUNNING"
