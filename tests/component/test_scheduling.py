"""JobMaster + ResourceManager wired through the in-memory transport, a real SQLite catalog and
a scripted TaskManager that answers deploy/cancel commands: the scheduling and failover rules
without processes or Redis. The same scenarios run on the real stack in tests/integration."""

from __future__ import annotations

import pytest

from services.jobmanager.job_master import JobMaster
from services.resourcemanager.service import ResourceManager
from shared import streams
from shared.catalog import repository as repo
from shared.messages import (
    CancelJob,
    CancelTask,
    DeployTask,
    RegisterTaskManager,
    SlotState,
    SubmitJob,
    TaskManagerHeartbeat,
    TaskManagerLost,
    TaskReport,
    UnregisterTaskManager,
    decode,
)
from shared.states import ExecutionState as ES
from tests.component.harness import Harness, executions_of


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path)


def test_job_runs_and_finishes_and_frees_its_slots(h):
    job = h.submit(parallelism=2)
    h.pump()
    [cmd] = h.deployed()
    assert len(cmd.slot_indices) == 2 and h.rm.slots.free_slots() == 6
    h.report(cmd, ES.INITIALIZING, ES.RUNNING, ES.FINISHED)
    assert h.job(job).status == "FINISHED"
    assert h.rm.slots.free_slots() == 8
    with h.catalog.session() as s:
        assert list(repo.job_state_timestamps(s, job)) == ["INITIALIZING", "CREATED", "RUNNING", "FINISHED"]


def test_fixed_delay_fails_twice_then_succeeds_with_three_attempts(h):
    job = h.submit(restart={"type": "fixed-delay", "attempts": 3, "delay": 1})
    h.pump()
    for attempt in range(2):
        [cmd] = h.deployed()
        h.report(cmd, ES.RUNNING, ES.FAILED, cause=f"boom {attempt}")
        assert h.job(job).status == "RESTARTING"
        h.clock.advance(1.0)
        h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.RUNNING, ES.FINISHED)
    assert h.job(job).status == "FINISHED"
    assert h.attempts(job) == [(0, "FAILED"), (1, "FAILED"), (2, "FINISHED")]


def test_no_restart_strategy_fails_job_with_exception_recorded(h):
    job = h.submit(restart={"type": "none"})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.RUNNING, ES.FAILED, cause="Traceback ... ValueError: bad")
    assert h.job(job).status == "FAILED"
    with h.catalog.session() as s:
        [exc] = repo.job_exceptions(s, job)
        assert "ValueError: bad" in exc.stacktrace
    assert h.rm.slots.free_slots() == 8


def test_cancel_during_backoff_wins(h):
    job = h.submit(restart={"type": "fixed-delay", "attempts": 5, "delay": 10})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.RUNNING, ES.FAILED)
    assert h.job(job).status == "RESTARTING"
    h.t.publish(streams.JM_STREAM, CancelJob(job_id=job))
    h.pump()
    h.clock.advance(11)
    h.pump()
    assert h.job(job).status == "CANCELED"
    assert h.deployed() == []


def test_cancel_running_job_sends_cancel_and_ends_canceled(h):
    job = h.submit()
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.RUNNING)
    h.t.publish(streams.JM_STREAM, CancelJob(job_id=job))
    h.pump()
    assert h.job(job).status == "CANCELLING"
    cancels = [c for _, c in h.gw.sent if isinstance(c, CancelTask)]
    assert [c.execution_id for c in cancels] == [cmd.spec.execution_id]
    h.report(cmd, ES.CANCELED)
    assert h.job(job).status == "CANCELED" and h.rm.slots.free_slots() == 8


def _lose_the_taskmanager_of(h, cmd) -> str:
    """Only the other TaskManager keeps heartbeating, for 12 s; returns it."""
    lost_tm = h.execution(cmd.spec.execution_id).taskmanager_id
    survivor = "tm-1" if lost_tm == "tm-0" else "tm-0"
    for _ in range(6):
        h.clock.advance(2)
        h.t.publish(streams.RM_HEARTBEAT_STREAM, TaskManagerHeartbeat(taskmanager_id=survivor, slot_report=()))
        h.pump()
    return survivor


def test_taskmanager_lost_restarts_on_the_other_one(h):
    job = h.submit(restart={"type": "fixed-delay", "attempts": 1, "delay": 0})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.RUNNING)
    survivor = _lose_the_taskmanager_of(h, cmd)
    [cmd2] = h.deployed()
    ex1 = h.execution(cmd.spec.execution_id)
    assert ex1.state == "FAILED" and "TaskManager lost" in ex1.failure_cause
    assert h.execution(cmd2.spec.execution_id).taskmanager_id == survivor
    assert h.job(job).status == "RUNNING"


def _restart_resourcemanager(h) -> None:
    h.rm.flush_catalog()
    h.rm = ResourceManager(h.settings, h.catalog, h.t, h.clock)
    h.rm.adopt_previous_taskmanagers()


def test_taskmanager_that_died_while_the_resourcemanager_was_down_is_declared_lost(h):
    job = h.submit(restart={"type": "fixed-delay", "attempts": 1, "delay": 0})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.RUNNING)
    dead = h.execution(cmd.spec.execution_id).taskmanager_id
    survivor = "tm-1" if dead == "tm-0" else "tm-0"
    _restart_resourcemanager(h)
    # Only the survivor registers again, as TaskManagers do when they see a new session.
    h.t.publish(
        streams.RM_STREAM,
        RegisterTaskManager(
            taskmanager_id=survivor, host="h", slots=4, cores=2, memory_bytes=1, queue=f"tm.{survivor}"
        ),
    )
    h.pump()
    h.clock.advance(h.settings.heartbeat_timeout_s - 1)
    h.t.publish(streams.RM_HEARTBEAT_STREAM, TaskManagerHeartbeat(taskmanager_id=survivor, slot_report=()))
    h.pump()
    assert h.execution(cmd.spec.execution_id).state == "RUNNING"  # still within its grace
    h.clock.advance(2)
    h.t.publish(streams.RM_HEARTBEAT_STREAM, TaskManagerHeartbeat(taskmanager_id=survivor, slot_report=()))
    h.pump()
    ex = h.execution(cmd.spec.execution_id)
    assert ex.state == "FAILED" and "did not register again" in ex.failure_cause
    [cmd2] = h.deployed()
    assert h.execution(cmd2.spec.execution_id).taskmanager_id == survivor
    assert h.job(job).status == "RUNNING"
    with h.catalog.session() as s:
        assert repo.get_taskmanager(s, dead).state == "LOST"


def test_a_lost_verdict_is_in_the_catalog_before_the_jobmanager_hears_of_it(h):
    # The periodic catalog flush (every 0.5 s) has just run: only the verdict itself can write.
    h.clock.advance(h.settings.heartbeat_timeout_s)
    h.t.publish(streams.RM_HEARTBEAT_STREAM, TaskManagerHeartbeat(taskmanager_id="tm-1", slot_report=()))
    h.pump(rounds=1)
    h.clock.advance(0.3)  # tm-0 silent for longer than the timeout; the next scan is due
    h.t.drain(streams.RM_HEARTBEAT_STREAM, streams.RM_GROUP, h.rm.handle)
    h.rm.tick()
    # Published, not yet read by the JobManager; what it will act on is already in the catalog.
    assert [m.taskmanager_id for m in h.t.bodies(streams.JM_STREAM) if isinstance(m, TaskManagerLost)] == ["tm-0"]
    with h.catalog.session() as s:
        assert repo.get_taskmanager(s, "tm-0").state == "LOST"
        assert repo.get_taskmanager(s, "tm-1").state == "REGISTERED"


def test_while_the_catalog_is_down_a_verdict_is_tried_once_early_then_with_the_periodic_flush(h):
    class Down:
        attempts = 0

        def session(self):
            Down.attempts += 1
            raise ConnectionError("catalog unreachable")

    h.clock.advance(h.settings.heartbeat_timeout_s)
    h.t.publish(streams.RM_HEARTBEAT_STREAM, TaskManagerHeartbeat(taskmanager_id="tm-1", slot_report=()))
    h.pump(rounds=1)  # the periodic flush has just run
    h.rm.catalog_sync.catalog = Down()  # where the ResourceManager's writes go
    h.clock.advance(0.3)
    h.t.drain(streams.RM_HEARTBEAT_STREAM, streams.RM_GROUP, h.rm.handle)
    for _ in range(5):  # ticks within the next 0.5 s: no write is due but the verdict's own
        h.rm.tick()
        h.clock.advance(0.05)
    assert Down.attempts == 1
    # Sent anyway: the JobManager acts on it without waiting for the catalog.
    assert [m.taskmanager_id for m in h.t.bodies(streams.JM_STREAM) if isinstance(m, TaskManagerLost)] == ["tm-0"]


def test_taskmanager_that_unregistered_while_the_resourcemanager_was_down_is_gone_at_once(h):
    h.submit(restart={"type": "fixed-delay", "attempts": 1, "delay": 0})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.RUNNING)
    stopped = h.execution(cmd.spec.execution_id).taskmanager_id
    h.t.publish(streams.RM_STREAM, UnregisterTaskManager(taskmanager_id=stopped, reason="shutdown"))
    _restart_resourcemanager(h)  # the unregistration waits in the stream for the new one
    h.pump()
    assert h.execution(cmd.spec.execution_id).state == "FAILED"
    with h.catalog.session() as s:
        assert repo.get_taskmanager(s, stopped).state == "UNREGISTERED"


def test_taskmanager_that_registers_again_after_a_resourcemanager_restart_keeps_its_task(h):
    h.submit()
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.RUNNING)
    _restart_resourcemanager(h)
    # The TaskManager that runs the task reports it, and its slots, when it registers again.
    ex = h.execution(cmd.spec.execution_id)
    held = tuple(
        SlotState(index=i, allocation_id=cmd.allocation_id, job_id=ex.job_id, execution_id=ex.id)
        for i in cmd.slot_indices
    )
    reports = {tm: (held if tm == ex.taskmanager_id else ()) for tm in ("tm-0", "tm-1")}
    running = (TaskReport(execution_id=ex.id, job_id=ex.job_id, state=ES.RUNNING, allocation_id=cmd.allocation_id),)
    for tm in ("tm-0", "tm-1"):
        h.t.publish(
            streams.RM_STREAM,
            RegisterTaskManager(
                taskmanager_id=tm,
                host="h",
                slots=4,
                cores=2,
                memory_bytes=1,
                queue=f"tm.{tm}",
                slot_report=reports[tm],
                running=running if tm == ex.taskmanager_id else (),
            ),
        )
    for _ in range(8):
        h.clock.advance(2)
        for tm in ("tm-0", "tm-1"):
            h.t.publish(streams.RM_HEARTBEAT_STREAM, TaskManagerHeartbeat(taskmanager_id=tm, slot_report=reports[tm]))
        h.pump()
    assert h.execution(cmd.spec.execution_id).state == "RUNNING"
    assert h.deployed() == []


def test_taskmanager_that_registers_again_without_its_task_fails_it_over(h):
    job = h.submit(restart={"type": "fixed-delay", "attempts": 1, "delay": 0})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    ex = h.execution(cmd.spec.execution_id)
    # The same TaskManager id comes back (a restarted process, as in the compose stack), running
    # nothing: the catalog's RUNNING attempt has nothing behind it and must move at once.
    _restart_resourcemanager(h)
    for tm in ("tm-0", "tm-1"):
        h.t.publish(
            streams.RM_STREAM,
            RegisterTaskManager(taskmanager_id=tm, host="h", slots=4, cores=2, memory_bytes=1, queue=f"tm.{tm}"),
        )
    h.pump()
    assert h.execution(ex.id).state == "FAILED"
    assert "registered again without this task" in h.execution(ex.id).failure_cause
    [again] = h.deployed()
    assert again.spec.job_id == job and again.spec.attempt == 1


def test_many_jobs_wait_with_reason_and_start_in_submission_order(h):
    jobs = [h.submit(parallelism=2, name=f"j{i}") for i in range(6)]
    h.pump()
    first = h.deployed()
    assert len(first) == 4  # 2 TaskManagers x 4 slots / 2 slots each
    assert {c.spec.job_id for c in first} == set(jobs[:4])
    assert h.job(jobs[4]).waiting_reason == "waiting for 2 slots; 0 free"
    h.report(first[2], ES.RUNNING, ES.FINISHED)
    [nxt] = h.deployed()
    assert nxt.spec.job_id == jobs[4]


def test_slot_request_timeout_fails_job_with_message(tmp_path):
    h = Harness(tmp_path, slots=(1,))
    h.submit(parallelism=1)
    h.pump()
    assert len(h.deployed()) == 1
    job = h.submit(parallelism=1)
    h.pump()
    h.clock.advance(h.settings.slot_request_timeout_s + 1)
    h.pump()
    assert h.job(job).status == "FAILED"
    with h.catalog.session() as s:
        [exc] = repo.job_exceptions(s, job)
    assert exc.exception_name == "NoResourceAvailableException"
    assert "could not allocate 1 slot" in exc.stacktrace


def test_redelivered_submission_changes_nothing(h):
    job = h.submit()
    h.pump()
    h.t.publish(streams.JM_STREAM, SubmitJob(job_id=job))
    h.pump()
    assert len(h.deployed()) == 1 and len(h.attempts(job)) == 1


def test_submissions_of_one_batch_start_together_and_keep_the_order_of_the_batch(h):
    """One stream batch: A submitted then cancelled, B submitted twice, C cancelled before its
    submission, D submitted. The batch's submissions are written set-based; the outcome must be
    what handling the messages one by one gives."""
    ids = {}
    for name in "ABCD":
        ids[name] = h.submit(name=name, announce=False)
    for body in (
        SubmitJob(job_id=ids["A"]),
        CancelJob(job_id=ids["A"]),
        SubmitJob(job_id=ids["B"]),
        CancelJob(job_id=ids["C"]),
        SubmitJob(job_id=ids["B"]),
        SubmitJob(job_id=ids["C"]),
        SubmitJob(job_id=ids["D"]),
    ):
        h.t.publish(streams.JM_STREAM, body)
    h.pump()
    assert h.job(ids["A"]).status == "CANCELED" and h.attempts(ids["A"]) == [(0, "CANCELED")]
    assert h.job(ids["C"]).status == "CANCELED" and h.attempts(ids["C"]) == []  # never planned
    deployed = {c.spec.job_id: c for c in h.deployed()}
    assert set(deployed) == {ids["B"], ids["D"]}
    for name in "BD":
        assert h.job(ids[name]).status == "RUNNING" and h.attempts(ids[name]) == [(0, "DEPLOYING")]
        h.report(deployed[ids[name]], ES.INITIALIZING, ES.RUNNING, ES.FINISHED)
        assert h.job(ids[name]).status == "FINISHED"
        with h.catalog.session() as s:
            assert list(repo.job_state_timestamps(s, ids[name])) == ["INITIALIZING", "CREATED", "RUNNING", "FINISHED"]
            [ex] = repo.job_executions(s, ids[name])
            assert set(ex.timestamps) == {"CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING", "FINISHED"}
            assert len(ex.slots) == 1
    assert h.rm.slots.free_slots() == 8


class _Unreachable:
    """Stands in for Redis being down: every call raises, as redis-py would (or only the calls
    named in `only`)."""

    def __init__(self, real, only: tuple[str, ...] = ()):
        self.real, self.down, self.only = real, True, only

    def __getattr__(self, name):
        attr = getattr(self.real, name)
        if not callable(attr) or not self.down or (self.only and name not in self.only):
            return attr

        def refuse(*_a, **_k):
            raise ConnectionError("Redis is down")

        return refuse


def _outbox_rows(h):
    h.jm.outbox.forget_sent()  # as the JobManager loop does when idle
    with h.catalog.session() as s:
        return [(r.kind, r.execution_id) for r in repo.pending_outbox(s)]


def test_effects_of_a_committed_batch_survive_a_failed_send_and_a_jobmanager_restart(h):
    redis_down = _Unreachable(h.t)
    h.jm.outbox.transport = redis_down
    job = h.submit()
    h.pump()
    # The decision (a SCHEDULED attempt) committed; its slot request could not be sent.
    assert h.attempts(job) == [(0, "SCHEDULED")]
    assert [kind for kind, _ in _outbox_rows(h)] == ["stream"]
    # A new JobManager (this one died) finds the request in the outbox and decides it again
    # from the catalog (the attempt is still SCHEDULED): it goes out under the new epoch.
    h.jm = JobMaster(h.settings, h.catalog, h.t, h.gw, h.clock, epoch=2)
    with h.jm.unit_of_work():
        h.jm.recover()
    with h.catalog.session() as s:  # nothing of epoch 1 is left to be sent as it is
        assert {decode(r.envelope).epoch for r in repo.pending_outbox(s)} == {2}
    h.pump()
    assert len(h.deployed()) == 1 and _outbox_rows(h) == []


def test_a_deploy_left_in_the_outbox_is_dropped_once_its_attempt_moved_on(h):
    h.gw.deploy = lambda queue, cmd: (_ for _ in ()).throw(ConnectionError("Redis is down"))
    job = h.submit()
    h.pump()
    [(ex_id, state)] = [(e.id, e.state) for e in executions_of(h, job)]
    assert state == "DEPLOYING" and ("deploy", ex_id) in _outbox_rows(h)
    h.t.publish(streams.JM_STREAM, CancelJob(job_id=job))
    h.pump()
    del h.gw.deploy  # Redis is back
    h.jm.outbox.replay()
    assert [c for _, c in h.gw.sent if isinstance(c, DeployTask)] == []
    assert _outbox_rows(h) == []


def test_sent_effects_leave_the_outbox_with_the_next_transaction(h):
    h.submit()
    h.pump()
    assert len(h.deployed()) == 1
    assert _outbox_rows(h) == []


def test_resourcemanager_answers_survive_a_failed_publish(h):
    job = h.submit()
    real = h.rm.transport
    h.rm.transport = _Unreachable(real, only=("publish_many",))  # the RM's replies fail for a while
    h.t.drain(streams.JM_STREAM, streams.JM_GROUP, h.jm.handle, around_batch=h.jm.unit_of_work)
    with pytest.raises(ConnectionError):
        h.rm.poll_once(block_ms=0)  # the request is handled (and acknowledged); the reply fails
    h.rm.transport = real
    h.pump()
    assert len(h.deployed()) == 1 and h.attempts(job) == [(0, "DEPLOYING")]


def test_restart_backoff_counts_from_the_last_heartbeat_of_a_lost_taskmanager(h):
    # delay 5 s < the 12 s the TaskManager has been silent: the restart does not wait again.
    h.submit(restart={"type": "fixed-delay", "attempts": 1, "delay": "5 s"})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.RUNNING)
    _lose_the_taskmanager_of(h, cmd)
    assert len(h.deployed()) == 1


def test_restart_backoff_after_a_task_failure_is_waited_in_full(h):
    h.submit(restart={"type": "fixed-delay", "attempts": 1, "delay": "5 s"})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.RUNNING, ES.FAILED, cause="boom")
    h.clock.advance(4)
    h.pump()
    assert h.deployed() == []
    h.clock.advance(1.5)
    h.pump()
    assert len(h.deployed()) == 1


def test_a_taskmanager_back_within_one_flush_keeps_its_last_loss_in_the_catalog(h):
    # A supervisor restarts a killed TaskManager within seconds: the loss and the new
    # registration can reach the ResourceManager before its next catalog write.
    h.t.publish(streams.RM_STREAM, UnregisterTaskManager(taskmanager_id="tm-0", reason="shutdown"))
    h.t.publish(
        streams.RM_STREAM,
        RegisterTaskManager(taskmanager_id="tm-0", host="h", slots=4, cores=2, memory_bytes=1, queue="tm.tm-0"),
    )
    h.pump()
    h.rm.flush_catalog()
    with h.catalog.session() as s:
        back = repo.get_taskmanager(s, "tm-0")
        assert (back.state, back.lost_reason) == ("REGISTERED", None)
        assert back.last_lost_reason == "TaskManager unregistered: shutdown" and back.last_lost_at is not None
        assert repo.get_taskmanager(s, "tm-1").last_lost_at is None
