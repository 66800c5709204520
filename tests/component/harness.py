"""The control plane in one process for component tests: a JobMaster and a ResourceManager on a
throwaway SQLite catalog and an in-memory bus, a fake clock, and TaskManagers played by the test
(`Harness`); the checkpoint and savepoint steps those tests take (triggers, ack, request)."""

from __future__ import annotations

from pathlib import Path

from services.jobmanager.job_master import JobMaster
from services.resourcemanager.service import ResourceManager
from shared import checkpoint_storage as storage
from shared import streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.clock import FakeClock
from shared.ids import new_job_id, new_request_id
from shared.message_auth import TASKMANAGER_MESSAGES, ClusterAuth, taskmanager_sender
from shared.messages import (
    CancelTask,
    CheckpointAcknowledged,
    DeployTask,
    RegisterTaskManager,
    RequestCheckpoint,
    RequestSavepoint,
    SubmitJob,
    TaskStateChanged,
    TriggerCheckpoint,
)
from shared.settings import Settings
from shared.states import ExecutionState as ES
from shared.transport import InMemoryTransport


class RecordingGateway:
    def __init__(self):
        self.sent: list[tuple[str, object]] = []

    def deploy(self, queue, cmd: DeployTask):
        self.sent.append((queue, cmd))

    def cancel(self, queue, cmd: CancelTask):
        self.sent.append((queue, cmd))

    def trigger_checkpoint(self, queue, cmd):
        self.sent.append((queue, cmd))


class PlaysEveryTaskManager(ClusterAuth):
    """The bus of a harness that scripts the TaskManagers: what a TaskManager would send goes out
    signed as the TaskManager it names, so the sender checks of the JobManager and the
    ResourceManager apply as on a cluster (shared/message_auth.py)."""

    def sender_for(self, body, default: str) -> str:
        tm = getattr(body, "taskmanager_id", None)
        return taskmanager_sender(tm) if isinstance(body, TASKMANAGER_MESSAGES) and tm else default


class Harness:
    def __init__(self, tmp_path, slots=(4, 4)):
        self.clock = FakeClock()
        self.settings = Settings(home=tmp_path, heartbeat_interval_s=2, heartbeat_timeout_s=10)
        self.catalog = Catalog(self.settings.catalog)
        self.catalog.migrate()
        self.t = InMemoryTransport(sender="test", epoch=1, auth=PlaysEveryTaskManager.ephemeral())
        self.gw = RecordingGateway()
        self.jm = JobMaster(self.settings, self.catalog, self.t, self.gw, self.clock, epoch=1)
        with self.jm.unit_of_work():
            self.jm.recover()  # claims the catalog's leadership row, as a real leader does
        self.rm = ResourceManager(self.settings, self.catalog, self.t, self.clock)
        for i, n in enumerate(slots):
            self.t.publish(
                streams.RM_STREAM,
                RegisterTaskManager(
                    taskmanager_id=f"tm-{i}", host="h", slots=n, cores=2, memory_bytes=1, queue=f"tm.tm-{i}"
                ),
            )
        self.pump()

    def pump(self, rounds=5):
        for _ in range(rounds):
            self.t.drain(streams.RM_STREAM, streams.RM_GROUP, self.rm.handle)
            self.t.drain(streams.RM_HEARTBEAT_STREAM, streams.RM_GROUP, self.rm.handle)
            self.rm.tick()
            self.t.drain(streams.JM_STREAM, streams.JM_GROUP, self.jm.handle, around_batch=self.jm.unit_of_work)
            self.jm.timers.run_due()
            if self.jm.checkpoints.due():
                with self.jm.unit_of_work():
                    self.jm.checkpoints.tick()

    def submit(self, parallelism=1, restart=None, name="job", config=None, announce=True) -> str:
        job_id = new_job_id()
        with self.catalog.session() as s:
            repo.create_job(
                s,
                id=job_id,
                name=name,
                artifact_id=None,
                entry="build",
                parallelism=parallelism,
                program_args=[],
                config=config or {},
                restart_strategy=restart or {"type": "none"},
                kind="noop",
            )
        if announce:
            self.t.publish(streams.JM_STREAM, SubmitJob(job_id=job_id))
        return job_id

    def deployed(self) -> list[DeployTask]:
        out = [c for _, c in self.gw.sent if isinstance(c, DeployTask)]
        self.gw.sent = [(q, c) for q, c in self.gw.sent if not isinstance(c, DeployTask)]
        return out

    def report(self, cmd: DeployTask, *states: ES, cause=None):
        tm = cmd.spec.execution_id
        ex_tm = self.execution(cmd.spec.execution_id).taskmanager_id
        for st in states:
            self.t.publish(
                streams.JM_STREAM,
                TaskStateChanged(
                    execution_id=tm, job_id=cmd.spec.job_id, taskmanager_id=ex_tm, state=st, failure_cause=cause
                ),
            )
        self.pump()

    def execution(self, ex_id):
        with self.catalog.session() as s:
            return repo.get_execution(s, ex_id)

    def job(self, job_id):
        with self.catalog.session() as s:
            return repo.get_job(s, job_id)

    def attempts(self, job_id):
        with self.catalog.session() as s:
            return [(e.attempt, e.state) for e in repo.job_executions(s, job_id)]


def executions_of(h, job_id):
    with h.catalog.session() as s:
        return list(repo.job_executions(s, job_id))


CONFIG = {"execution.checkpointing.interval": "1 s", "state.checkpoints.num-retained": 2}


def triggers(h) -> list[TriggerCheckpoint]:
    out = [c for _, c in h.gw.sent if isinstance(c, TriggerCheckpoint)]
    h.gw.sent = [(q, c) for q, c in h.gw.sent if not isinstance(c, TriggerCheckpoint)]
    return out


def ack(h, trig: TriggerCheckpoint, batch_id: int = 7) -> str:
    """Write the snapshot the task would have written, then acknowledge it."""
    info = storage.take_empty_snapshot(
        Path(trig.target), metadata={"job_id": trig.job_id, "kind": trig.kind, "checkpoint_id": trig.checkpoint_id}
    )
    h.t.publish(
        streams.JM_STREAM,
        CheckpointAcknowledged(
            job_id=trig.job_id,
            execution_id=trig.execution_id,
            taskmanager_id=trig.taskmanager_id,
            checkpoint_id=trig.checkpoint_id,
            path=str(info.path),
            batch_id=batch_id,
            state_size=123,
            duration_ms=5,
        ),
    )
    h.pump()
    return str(info.path)


def request(h, job, kind="savepoint", **body) -> str:
    rid = new_request_id()
    with h.catalog.session() as s:
        repo.create_operation(s, id=rid, kind=kind, job_id=job, params=dict(body))
    if kind == "checkpoint":
        h.t.publish(streams.JM_STREAM, RequestCheckpoint(job_id=job, request_id=rid))
    else:
        h.t.publish(streams.JM_STREAM, RequestSavepoint(job_id=job, request_id=rid, **body))
    h.pump()
    return rid


def operation(h, rid):
    with h.catalog.session() as s:
        return repo.get_operation(s, rid)
