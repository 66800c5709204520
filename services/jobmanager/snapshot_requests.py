"""Snapshots the REST API asks for (manual checkpoints, savepoints, stop-with-savepoint,
rescale): each is an operation row the caller polls; it is triggered through the checkpoint
coordinator when the job has a RUNNING task, else FAILS with the reason. A rescale savepoint
that stopped the task restarts the job with the new parallelism (`rescale_after_finish`)."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from services.jobmanager.checkpoint_store import BatchLatest
from services.jobmanager.checkpoints import CheckpointCoordinator, running_attempt
from services.jobmanager.unit_of_work import UnitOfWork
from shared.catalog import repository as repo
from shared.catalog.models import Execution, Job, Operation
from shared.checkpoint_storage import new_savepoint_dir
from shared.messages import RequestCheckpoint, RequestSavepoint
from shared.settings import Settings
from shared.states import OperationStatus as OS
from shared.storage_roots import confine

log = logging.getLogger("headrace.jobmanager.checkpoints")


class SnapshotRequests:
    def __init__(self, settings: Settings, uow: UnitOfWork, coordinator: CheckpointCoordinator):
        self.settings, self.uow, self.coordinator = settings, uow, coordinator

    def on_request_checkpoint(self, msg: RequestCheckpoint) -> None:
        with self.uow.tx() as s:
            accepted = self._accept(s, msg.request_id, msg.job_id)
            if accepted is None:
                return
            op, job, ex = accepted
            row = self.coordinator.trigger(s, job, ex, kind="checkpoint", request_id=op.id)
            repo.set_operation_checkpoint(s, op, row.checkpoint_id)

    def on_request_savepoint(self, msg: RequestSavepoint) -> None:
        with self.uow.tx() as s:
            accepted = self._accept(s, msg.request_id, msg.job_id)
            if accepted is None:
                return
            op, job, ex = accepted
            if msg.after == "rescale":
                if not msg.parallelism:
                    repo.finish_operation(s, op, OS.FAILED, failure_cause="rescaling needs a parallelism")
                    return
                op.params = {**(op.params or {}), "parallelism": msg.parallelism}
            try:  # the dispatcher checked it too; a message on the stream is not proof of that
                parent = confine(msg.target_directory, self.settings, what="savepoint target")
            except ValueError as exc:
                repo.finish_operation(s, op, OS.FAILED, failure_cause=str(exc))
                log.warning("savepoint of job %s refused: %s", msg.job_id, exc)
                return
            target = new_savepoint_dir(parent, job.id)
            row = self.coordinator.trigger(s, job, ex, kind="savepoint", request_id=op.id, target=target,
                                           after=msg.after, drain=msg.drain)
            repo.set_operation_checkpoint(s, op, row.checkpoint_id)
        log.info("savepoint %d of job %s triggered into %s (then %s)", row.checkpoint_id, msg.job_id, target,
                 msg.after)

    def _accept(self, s: Session, request_id: str, job_id: str) -> tuple[Operation, Job, Execution] | None:
        """(operation, job, running attempt) of a REST snapshot request, or None when there is
        nothing to do: a redelivered request, or a job without a running task (the operation
        then FAILS with the reason, so the caller polling it learns why)."""
        try:
            op = repo.get_operation(s, request_id, lock=True)
        except repo.NotFound:
            log.warning("snapshot request %s has no operation row; ignored", request_id)
            return None
        if op.status != OS.IN_PROGRESS.value:
            return None
        found = running_attempt(s, job_id)
        if isinstance(found, str):
            repo.finish_operation(s, op, OS.FAILED, failure_cause=found)
            return None
        return (op, *found)


def rescale_after_finish(s: Session, store: BatchLatest, job: Job) -> int | None:
    """The job's task finished because a rescale savepoint stopped it: the parallelism to
    restart with (from that savepoint), or None when the job really finished."""
    latest = store.latest(s, job.id)
    if not latest or latest.get("id") is None:
        return None
    try:
        row = repo.get_checkpoint(s, job.id, int(latest["id"]))
        if row.after != "rescale" or not row.request_id:
            return None
        op = repo.get_operation(s, row.request_id, lock=True)
    except repo.NotFound:
        return None
    params = dict(op.params or {})
    if params.get("applied"):
        return None  # already restarted with it: this FINISHED is a real end
    op.params = {**params, "applied": True}
    return int(params.get("parallelism") or 0) or None
