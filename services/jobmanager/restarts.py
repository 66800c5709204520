"""Failures, restarts and the end of a job: a failed attempt goes to its job's restart strategy
(restart after the backoff, with every other attempt cancelled, or fail the job); an attempt
that ended well may end its job (FINISHED, CANCELED, or a rescale restart). The rules are in
transitions.py; this room loads the rows, asks, and applies the answer."""

from __future__ import annotations

import logging
from typing import Callable

from sqlalchemy.orm import Session

from services.jobmanager import restore_fallback
from services.jobmanager import transitions as tr
from services.jobmanager.context import Context
from services.jobmanager.deployment import Deployment
from services.jobmanager.outbox import CANCEL
from services.jobmanager.snapshot_requests import rescale_after_finish
from services.jobmanager.transitions import Fx
from shared import restart
from shared.catalog import repository as repo
from shared.catalog.models import Job
from shared.failure_summary import summarize
from shared.ids import ExecutionId, JobId, TaskManagerId, new_execution_id
from shared.messages import CancelSlotRequest, CancelTask, ReleaseSlots
from shared.restart import RestartStrategy
from shared.states import ExecutionState as ES
from shared.states import JobStatus as JS

log = logging.getLogger("headrace.jobmanager")


class Restarts:
    def __init__(self, ctx: Context, deployment: Deployment, arm_ack: Callable[[ExecutionId, ES], None]):
        self.ctx, self.deployment, self.arm_ack = ctx, deployment, arm_ack

    def fail(
        self,
        execution_id: ExecutionId,
        *,
        cause_name: str,
        cause: str,
        expected_tm: TaskManagerId | None,
        release: bool = True,
        silent_for_s: float | None = None,
        still_running: bool = False,
        permanent: bool = False,
    ) -> None:
        """The attempt failed: record why and restart the job or fail it. `still_running`: the
        failure was decided here (a checkpoint failover) while the attempt still runs on its
        TaskManager, so it is cancelled with the others instead of being marked FAILED.
        `permanent`: no restart could help, the job fails whatever its restart strategy."""
        ctx = self.ctx
        release_alloc = None
        restart_in: float | None = None
        cancels: list[tuple[str, CancelTask]] = []
        with ctx.uow.tx() as s:
            try:
                ex = repo.get_execution(s, execution_id, lock=True)
            except repo.NotFound:
                return
            if expected_tm is not None and ex.taskmanager_id and ex.taskmanager_id != expected_tm:
                return
            if ES(ex.state).is_terminal:
                return
            if not still_running:
                repo.transition_execution(s, ex, ES.FAILED, failure_cause=f"{cause_name}: {cause}"[:20000])
                ctx.checkpoints.on_execution_ended(s, ex.job_id, ex.id, ES.FAILED)
                if release:
                    release_alloc = ex.allocation_id
            job = repo.get_job(s, ex.job_id, lock=True)
            if cause_name == restore_fallback.RESTORE_FAILED:  # never the same damaged snapshot again
                cause, permanent = restore_fallback.fall_back(s, ctx.checkpoints, job, ex, cause)
            vertex = next(v for v in repo.job_vertices(s, job.id) if v.id == ex.vertex_id)
            repo.record_exception(
                s,
                job_id=job.id,
                exception_name=cause_name,
                stacktrace=cause,
                execution_id=ex.id,
                vertex_name=vertex.name,
                attempt=ex.attempt,
                taskmanager_id=ex.taskmanager_id,
                keep=ctx.settings.exception_history_size,
            )
            status = JS(job.status)
            can_restart = False
            strategy = None
            if tr.counts_failure(status):
                strategy = self.strategy(job)
                strategy.notify_failure()
                repo.set_restart_state(s, job, strategy.state())
                can_restart = strategy.can_restart()
            decision = tr.on_failure(
                status, can_restart=can_restart, cause_name=cause_name, permanent=permanent, still_running=still_running
            )
            if Fx.SETTLE in decision:
                self.settle(s, job.id)
            if Fx.CANCEL_TASKS in decision:
                cancels = self.cancel_live(s, job.id)
            for target in decision.job:
                repo.transition_job(s, job.id, target, epoch=ctx.epoch, reason=cause_name)
            if Fx.RESTART in decision and strategy is not None:
                restart_in = strategy.backoff_s()
                if silent_for_s is not None:
                    # The backoff separates the restart from the failure, not from its
                    # detection: a TaskManager found dead by a 10 s heartbeat timeout has
                    # been gone for 10 s already, and waiting the backoff again on top would
                    # only delay recovery. (A duration the ResourceManager measured on its
                    # own clock: no two hosts' clocks are compared.)
                    restart_in = max(0.0, restart_in - max(0.0, silent_for_s))
            elif JS.FAILED in decision.job:
                ctx.checkpoints.on_job_terminal(s, job, JS.FAILED)
                log.warning("job %s FAILED: %s", job.id, summarize(f"{cause_name}: {cause}"))
            job_id = job.id
        if release_alloc:
            ctx.uow.emit(ReleaseSlots(allocation_id=release_alloc, reason="FAILED"))
        for queue, cmd in cancels:
            ctx.uow.command(CANCEL, queue, cmd)
        if restart_in is not None:
            log.info("job %s RESTARTING in %.2f s after %s", job_id, restart_in, cause_name)
            self.restart_later(job_id, restart_in)

    def cancel_live(self, s: Session, job_id: JobId) -> list[tuple[str, CancelTask]]:
        """Stop the job's other attempts (a restart is global to the job, like Flink's full
        restart); returns the cancel commands to send after commit."""
        out = []
        for ex in repo.latest_executions(s, job_id).values():
            decision = tr.cancel_attempt(ES(ex.state))
            if decision.execution is not None:
                repo.transition_execution(s, ex, decision.execution)
            if Fx.CANCEL_SLOT_REQUEST in decision:
                self.ctx.uow.emit(CancelSlotRequest(request_id=ex.id))
            if Fx.ARM_ACK_TIMER in decision:
                self.arm_ack(ex.id, ES.CANCELING)
            if Fx.CANCEL_TASK in decision:
                tm = ex.placed_on()  # a task to cancel was deployed somewhere
                out.append(
                    (self.ctx.uow.queue_of(tm, s), CancelTask(taskmanager_id=tm, execution_id=ex.id, job_id=job_id))
                )
        return out

    def settle(self, s: Session, job_id: JobId) -> None:
        """An attempt ended well (FINISHED or CANCELED): maybe the whole job did."""
        ctx = self.ctx
        job = repo.get_job(s, job_id, lock=True)
        latest = list(repo.latest_executions(s, job_id).values())
        decision = tr.settle(JS(job.status), [ES(e.state) for e in latest])
        if JS.FINISHED in decision.job:
            parallelism = rescale_after_finish(s, ctx.checkpoints.store, job)
            if parallelism is not None:
                # The task stopped for a rescale savepoint: start again from it with the new
                # parallelism (the state partition count travels with the savepoint).
                for v in repo.job_vertices(s, job_id):
                    repo.set_vertex_parallelism(s, v, parallelism)
                repo.transition_job(s, job_id, JS.RESTARTING, epoch=ctx.epoch, reason="rescaling")
                self.restart_later(job_id, 0)
                log.info("job %s rescaling to parallelism %d", job_id, parallelism)
                return
        for target in decision.job:
            repo.transition_job(s, job_id, target, epoch=ctx.epoch)
            ctx.checkpoints.on_job_terminal(s, job, target)
            if target == JS.FINISHED:
                log.info("job %s FINISHED", job_id)

    def restart_later(self, job_id: JobId, delay_s: float) -> None:
        self.ctx.timers.call_later(delay_s, lambda: self.restart(job_id))

    def restart(self, job_id: JobId) -> None:
        ctx = self.ctx
        requests = []
        with ctx.uow.tx() as s:
            job = repo.get_job(s, job_id, lock=True)
            if not tr.on_restart_due(JS(job.status)):
                return  # cancelled (or otherwise moved on) during the backoff: cancel wins
            latest = repo.latest_executions(s, job_id)
            rescaling = tr.is_rescaling([ES(e.state) for e in latest.values()])
            for v in repo.job_vertices(s, job_id):
                prev = latest.get(v.id)
                if not tr.restarts_vertex(ES(prev.state) if prev is not None else None, rescaling=rescaling):
                    continue
                ex = repo.create_execution(
                    s,
                    id=new_execution_id(),
                    job_id=job_id,
                    vertex_id=v.id,
                    attempt=(prev.attempt + 1) if prev else 0,
                    keep_history=ctx.settings.max_attempts_history,
                )
                repo.transition_execution(s, ex.id, ES.SCHEDULED)
                requests.append(self.deployment.slot_request(job, v, ex))
            repo.transition_job(s, job_id, JS.RUNNING, epoch=ctx.epoch)
        for r in requests:
            ctx.uow.emit(r)
        log.info("job %s restarted (%d tasks)", job_id, len(requests))

    def strategy(self, job: Job) -> RestartStrategy:
        """Built afresh from the job's row each time: its counters live in the catalog, so a
        rolled-back failure was never counted and a new leader continues the budget."""
        config = job.restart_strategy or self.ctx.settings.restart_strategy
        strategy = restart.build(config, clock=self.ctx.restart_clock)
        strategy.load(job.restart_state or {})
        return strategy
