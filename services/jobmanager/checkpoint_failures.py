"""Failed checkpoints (Flink's CheckpointFailureManager): a checkpoint declined by its task,
expired past its `timeout`, or aborted because its attempt or its job ended goes FAILED, and the
REST operation waiting on it fails with it.

Declines and expiries of checkpoints count as the job's consecutive failures (a completed
checkpoint resets the count, CheckpointCoordinator.on_ack); beyond `tolerable-failed-checkpoints`
the attempt fails over and the job's restart strategy decides, as in Flink. A failed savepoint
never counts, nor does a checkpoint aborted by its attempt's end, nor a permanent decline (a task
that can never checkpoint, which is no longer triggered).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Callable

from services.jobmanager.snapshot_files import discard_files
from shared import checkpointing
from shared.catalog import repository as repo
from shared.catalog.models import Job
from shared.ids import ExecutionId, JobId
from shared.messages import CheckpointDeclined
from shared.states import CheckpointStatus as CS
from shared.states import JobStatus as JS
from shared.states import OperationStatus as OS

if TYPE_CHECKING:
    from services.jobmanager.checkpoint_schedule import TriggerSchedule
    from services.jobmanager.unit_of_work import UnitOfWork
    from shared.settings import Settings

log = logging.getLogger("headrace.jobmanager.checkpoints")

EXPIRED = "Checkpoint expired before completing."


class CheckpointFailures:
    def __init__(
        self,
        settings: Settings,
        uow: UnitOfWork,
        schedule: TriggerSchedule,
        config: Callable[[Job], checkpointing.CheckpointConfig],
        fail_over: Callable[[ExecutionId, str], None],
    ):
        self.settings, self.uow, self.schedule = settings, uow, schedule
        self.config, self.fail_over = config, fail_over

    def fail(self, s, row, cause: str) -> None:
        """The checkpoint's row FAILED, and the operation that asked for it (if any) with it;
        counts nothing."""
        repo.transition_checkpoint(s, row, CS.FAILED, failure_cause=cause)
        if row.request_id:
            try:
                op = repo.get_operation(s, row.request_id, lock=True)
                repo.finish_operation(s, op, OS.FAILED, failure_cause=cause, checkpoint_id=row.checkpoint_id)
            except repo.NotFound:
                pass

    def on_decline(self, msg: CheckpointDeclined) -> None:
        permanent = msg.permanent
        with self.uow.tx() as s:
            try:
                row = repo.get_checkpoint(s, msg.job_id, msg.checkpoint_id, lock=True)
            except repo.NotFound:
                return
            if row.status != CS.IN_PROGRESS.value or row.execution_id != msg.execution_id:
                return
            if permanent:
                self.schedule.never_checkpointable(msg.job_id)
            self._count_failure(s, row, f"declined by the task: {msg.reason}", counts=not permanent)
        log.warning("checkpoint %d of job %s declined: %s", msg.checkpoint_id, msg.job_id, msg.reason)

    def expire(self, job_id: JobId, checkpoint_id: int) -> None:
        self.schedule.settled(job_id, checkpoint_id)
        with self.uow.tx() as s:
            try:
                row = repo.get_checkpoint(s, job_id, checkpoint_id, lock=True)
            except repo.NotFound:
                return
            if row.status != CS.IN_PROGRESS.value:
                return
            self._count_failure(s, row, EXPIRED, counts=True)
            if row.path:
                self.uow.after_commit(partial(discard_files, [row.path], self.settings))
        log.warning("checkpoint %d of job %s expired", checkpoint_id, job_id)

    def _count_failure(self, s, row, cause: str, *, counts: bool) -> None:
        self.fail(s, row, cause)
        self.schedule.settled(row.job_id, row.checkpoint_id)
        if row.kind != "checkpoint" or not counts:
            return  # a failed savepoint never fails the job over (as in Flink)
        job = repo.get_job(s, row.job_id, lock=True)
        failures = (job.checkpoint_failures or 0) + 1
        tolerable = self.config(job).tolerable_failures
        repo.set_checkpoint_failures(s, job, failures)
        if failures > tolerable and job.status == JS.RUNNING.value and row.execution_id:
            repo.set_checkpoint_failures(s, job, 0)
            self.fail_over(
                row.execution_id,
                f"Exceeded checkpoint tolerable failure threshold ({tolerable}): {failures} consecutive "
                f"checkpoint failures; the last one (checkpoint {row.checkpoint_id}): {cause}",
            )
