"""Issue 23 through the JobMaster and the ResourceManager: after a TaskManager is lost and comes
back (the supervisor of `headrace up` restarts it in ~2 s, every slot free, its warm-up just
begun), the restarted task goes to the TaskManager whose heartbeat reports a ready warm driver,
not to the one with the most free slots."""

from __future__ import annotations

from shared import streams
from shared.messages import DeployTask, RegisterTaskManager, SlotState, TaskManagerHeartbeat
from shared.states import ExecutionState as ES
from tests.component.harness import Harness


def heartbeat(h: Harness, tm: str, running: list[DeployTask], *, warm_ready: int) -> None:
    report = tuple(
        SlotState(index=i, allocation_id=c.allocation_id, job_id=c.spec.job_id, execution_id=c.spec.execution_id)
        for c in running
        for i in c.slot_indices
    )
    h.t.publish(
        streams.RM_HEARTBEAT_STREAM,
        TaskManagerHeartbeat(taskmanager_id=tm, slot_report=report, warm_ready=warm_ready, warm_parallelism=2),
    )


def test_a_restarted_task_goes_to_the_ready_warm_driver_not_the_returned_empty_taskmanager(tmp_path):
    h = Harness(tmp_path, slots=(2, 2))
    h.submit(restart={"type": "fixed-delay", "attempts": 1, "delay": "20 s"}, name="counting")
    h.pump()
    [first] = h.deployed()
    h.report(first, ES.RUNNING)
    h.submit(name="other")  # spreads to the other TaskManager: it then has 1 free slot, not 2
    h.pump()
    [other] = h.deployed()
    h.report(other, ES.RUNNING)
    lost = first.taskmanager_id
    survivor = other.taskmanager_id
    assert lost != survivor
    for _ in range(6):  # only the survivor heartbeats, for 12 s: the other one is lost
        h.clock.advance(2)
        heartbeat(h, survivor, [other], warm_ready=1)
        h.pump()
    assert h.deployed() == []  # the restart waits its 20 s
    # The lost TaskManager is back: every slot free (2 against the survivor's 1), no driver ready.
    h.t.publish(
        streams.RM_STREAM,
        RegisterTaskManager(
            taskmanager_id=lost, host="h", slots=2, cores=2, memory_bytes=1, queue=f"tm.{lost}", warm_parallelism=2
        ),
    )
    h.pump()
    for _ in range(5):
        h.clock.advance(2)
        heartbeat(h, survivor, [other], warm_ready=1)
        heartbeat(h, lost, [], warm_ready=0)
        h.pump()
    [restarted] = h.deployed()
    assert restarted.spec.job_id == first.spec.job_id
    assert restarted.taskmanager_id == survivor
    assert h.execution(restarted.spec.execution_id).taskmanager_id == survivor
