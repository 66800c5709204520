"""Snapshots the REST API asks for (manual checkpoints, savepoints, stop-with-savepoint,
rescale): each is an operation row the caller polls, triggered through the checkpoint
coordinator once the job's task runs. A rescale savepoint that stopped the task restarts the job
with the new parallelism (`rescale_after_finish`).

A request that comes while the task is not RUNNING yet (scheduled, deploying, initializing, or
the job restarting) waits for it, at most `execution.checkpointing.timeout` (Flink fails it at
once). The wait is kept in the operation row (`params["waiting"]`: why, since when, until when),
so the status resource can say why it is still IN_PROGRESS and a new leader resumes the wait
(`recover`). The row is checked again every WAIT_POLL_S until the task runs (then triggered),
the bound passes, or the job can no longer run (then FAILED with the reason; a job that ends
fails its operations in `CheckpointCoordinator.on_job_terminal`)."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.orm import Session

from services.jobmanager.checkpoint_coordinator import running_attempt
from services.jobmanager.checkpoint_store import BatchLatest
from services.jobmanager.context import Context
from shared.catalog import repository as repo
from shared.catalog.models import Execution, Job, Operation
from shared.catalog.repository.operations import in_progress_operations
from shared.checkpoint_storage import new_savepoint_dir
from shared.ids import JobId
from shared.messages import RequestCheckpoint, RequestSavepoint
from shared.states import JobStatus as JS
from shared.states import OperationStatus as OS
from shared.storage_roots import confine

log = logging.getLogger("headrace.jobmanager.checkpoints")

# Job states whose task may still come to run: a request waits through them.
WAITABLE = frozenset({JS.INITIALIZING, JS.CREATED, JS.RUNNING, JS.RESTARTING})
WAITING = "waiting"  # the key of the wait in the operation's params


class SnapshotRequests:
    WAIT_POLL_S = 0.2

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._watched: set[str] = set()  # operations with a recheck armed in this leader's timers

    def on_request_checkpoint(self, msg: RequestCheckpoint) -> None:
        with self.ctx.uow.tx() as s:
            op = _new_request(s, msg.request_id)
            if op is not None:
                self._trigger_or_wait(s, op)

    def on_request_savepoint(self, msg: RequestSavepoint) -> None:
        with self.ctx.uow.tx() as s:
            op = _new_request(s, msg.request_id)
            if op is None:
                return
            params: dict[str, Any] = {"target_directory": msg.target_directory, "after": msg.after, "drain": msg.drain}
            if msg.after == "rescale":
                if not msg.parallelism:
                    repo.finish_operation(s, op, OS.FAILED, failure_cause="rescaling needs a parallelism")
                    return
                params["parallelism"] = msg.parallelism
            op.params = {**(op.params or {}), **params}
            if self._target(s, op) is not None:  # refused before waiting, not after
                self._trigger_or_wait(s, op)

    def recover(self) -> None:
        """A new leader resumes the waits its predecessors recorded."""
        with self.ctx.uow.tx() as s:
            for op in in_progress_operations(s):
                if (op.params or {}).get(WAITING):
                    self._recheck_soon(op.id, 0.0)

    # --- waiting for the task ------------------------------------------------------------

    def _trigger_or_wait(self, s: Session, op: Operation) -> None:
        job_id = op.job_id or JobId("")  # a snapshot operation always names its job
        found = running_attempt(s, job_id)
        if not isinstance(found, str):
            self._trigger(s, op, *found)
            return
        why = _not_running_yet(s, job_id)
        if why is None:  # it never will: a job that is failing, cancelling, ended or unknown
            repo.finish_operation(s, op, OS.FAILED, failure_cause=found)
            return
        now = self.ctx.restart_clock.now()
        waiting = dict((op.params or {}).get(WAITING) or {})
        if not waiting:
            bound = self.ctx.checkpoints.config(repo.get_job(s, job_id)).timeout_s
            waiting = {"since": now, "deadline": now + bound, "bound_s": bound}
            log.info(
                "%s %s of job %s waits for its task to run (%s), at most %g s", op.kind, op.id, op.job_id, why, bound
            )
        elif now >= waiting["deadline"]:
            cause = (
                f"the {op.kind} was not triggered: the job's task did not reach RUNNING within "
                f"{waiting['bound_s']:g} s (execution.checkpointing.timeout) of the request; last seen: {why}"
            )
            repo.finish_operation(s, op, OS.FAILED, failure_cause=cause)
            log.warning("%s %s of job %s: %s", op.kind, op.id, op.job_id, cause)
            return
        reason = f"the task is not RUNNING yet ({why})"
        if waiting.get("reason") != reason:
            op.params = {**(op.params or {}), WAITING: {**waiting, "reason": reason}}
        self._recheck_soon(op.id, self.WAIT_POLL_S)

    def _recheck_soon(self, operation_id: str, delay_s: float) -> None:
        def arm() -> None:
            if operation_id not in self._watched:
                self._watched.add(operation_id)
                self.ctx.timers.call_later(delay_s, lambda: self._recheck(operation_id))

        self.ctx.uow.after_commit(arm)  # a rolled-back wait is not one

    def _recheck(self, operation_id: str) -> None:
        self._watched.discard(operation_id)
        with self.ctx.uow.tx() as s:
            try:
                op = repo.get_operation(s, operation_id, lock=True)
            except repo.NotFound:
                return
            if op.status == OS.IN_PROGRESS.value and (op.params or {}).get(WAITING):
                self._trigger_or_wait(s, op)

    # --- triggering ----------------------------------------------------------------------

    def _target(self, s: Session, op: Operation) -> str | None:
        """The savepoint's parent directory, confined to the allowed roots; None (and the
        operation FAILED) when it is not allowed."""
        try:  # the dispatcher checked it too; a message on the stream is not proof of that
            return confine((op.params or {}).get("target_directory") or "", self.ctx.settings, what="savepoint target")
        except ValueError as exc:
            repo.finish_operation(s, op, OS.FAILED, failure_cause=str(exc))
            log.warning("savepoint of job %s refused: %s", op.job_id, exc)
            return None

    def _trigger(self, s: Session, op: Operation, job: Job, ex: Execution) -> None:
        params = dict(op.params or {})
        waited = params.pop(WAITING, None)
        if waited:
            params["waited_s"] = round(self.ctx.restart_clock.now() - waited["since"], 3)
        op.params = params
        coordinator = self.ctx.checkpoints
        if op.kind == "checkpoint":
            row = coordinator.trigger(s, job, ex, kind="checkpoint", request_id=op.id)
        else:
            parent = self._target(s, op)
            if parent is None:
                return
            target = new_savepoint_dir(parent, job.id)
            after = params.get("after") or "continue"
            row = coordinator.trigger(
                s,
                job,
                ex,
                kind="savepoint",
                request_id=op.id,
                target=target,
                after=after,
                drain=bool(params.get("drain")),
            )
            log.info("savepoint %d of job %s triggered into %s (then %s)", row.checkpoint_id, job.id, target, after)
        repo.set_operation_checkpoint(s, op, row.checkpoint_id)


def _new_request(s: Session, request_id: str) -> Operation | None:
    """The operation of a REST snapshot request, locked, unless there is nothing to do: no row,
    already ended, already triggered or already waiting (a redelivered request)."""
    try:
        op = repo.get_operation(s, request_id, lock=True)
    except repo.NotFound:
        log.warning("snapshot request %s has no operation row; ignored", request_id)
        return None
    if op.status != OS.IN_PROGRESS.value or op.checkpoint_id is not None or (op.params or {}).get(WAITING):
        return None
    return op


def _not_running_yet(s: Session, job_id: JobId) -> str | None:
    """Where the job's task is on its way to RUNNING, or None when it will not get there."""
    try:
        job = repo.get_job(s, job_id)
    except repo.NotFound:
        return None
    if JS(job.status) not in WAITABLE:
        return None
    states = ", ".join(f"attempt {e.attempt} {e.state}" for e in repo.latest_executions(s, job_id).values())
    return f"job {job.status}, {states or 'no task yet'}"


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
