"""What the catalog believes against what the cluster runs: a new leader's recovery (claim the
leadership, pick up every unfinished job, decide again what earlier leaders left unsent), a
(re-)registering TaskManager's report (zombies cancelled, attempts it lost failed over), a lost
TaskManager's attempts, and a restarted ResourceManager's slot requests. The rules are in
transitions.py."""

from __future__ import annotations

import logging
import time
from typing import Callable

from sqlalchemy.orm import Session

from services.jobmanager import transitions as tr
from services.jobmanager.ack_timers import AckTimers
from services.jobmanager.context import Context
from services.jobmanager.deployment import Deployment
from services.jobmanager.outbox import CANCEL, CHECKPOINT, DEPLOY, Effect, Outbox
from services.jobmanager.restarts import Restarts
from services.jobmanager.transitions import Fx
from shared.catalog import repository as repo
from shared.catalog.models import Execution
from shared.ids import NO_TASKMANAGER, JobId, TaskManagerId, slot_request_execution
from shared.messages import (
    CancelSlotRequest,
    CancelTask,
    ReleaseSlots,
    ResourceManagerStarted,
    SlotsAllocated,
    TaskManagerLost,
    TaskManagerRegistered,
    TriggerCheckpoint,
)
from shared.states import ExecutionState as ES
from shared.states import JobStatus as JS

log = logging.getLogger("headrace.jobmanager")


class Reconciliation:
    def __init__(
        self,
        ctx: Context,
        outbox: Outbox,
        deployment: Deployment,
        restarts: Restarts,
        acks: AckTimers,
        *,
        leader_id: str,
        submit: Callable[[JobId], None],
        cancel: Callable[[JobId], None],
    ):
        self.ctx, self.outbox, self.deployment = ctx, outbox, deployment
        self.restarts, self.acks = restarts, acks
        self.leader_id, self.submit, self.cancel = leader_id, submit, cancel
        # The batch's prefetch (JobMaster.unit_of_work).
        self.live_on: dict[TaskManagerId, list[Execution]] | None = None

    # --- a new leader ------------------------------------------------------------------

    def recover(self) -> None:
        """After a (re)start: claim the leadership in the catalog and pick up every job this
        leader must drive to a terminal state. What earlier leaders left in the outbox is not
        sent as it is: it is decided again from the catalog (`_redecide`)."""
        ctx = self.ctx
        with ctx.uow.tx() as s:
            repo.claim_leadership(s, ctx.epoch, self.leader_id)
            ctx.uow.learn_queues(s)  # whose report streams to read
            live = repo.list_jobs(s, statuses=[st for st in JS if not st.is_terminal])
            todo = [(j.id, JS(j.status)) for j in live]
            ctx.checkpoints.recover(s)
            inherited = self.outbox.take_over(s)
            self._redecide(s, inherited)
            self._resend_unacknowledged(s)
        for job_id, status in todo:
            action = tr.on_recover(status)
            if action == Fx.SUBMIT:
                self.submit(job_id)
            elif action == Fx.RESTART:
                self.restarts.restart_later(job_id, 0)
            elif action == Fx.CANCEL_TASKS:
                self.cancel(job_id)
            elif action == Fx.REQUEST_SLOTS:
                self.rerequest_scheduled(job_id)
        if todo:
            log.info("recovered %d unfinished jobs", len(todo))

    def _redecide(self, s: Session, inherited: list[Effect]) -> None:
        """Entries an earlier leader committed but perhaps never sent. Deploys, cancels and slot
        requests are re-derived from the executions' states (`_resend_unacknowledged`,
        `rerequest_scheduled`); a release or a cancelled slot request still right by the catalog
        goes out under this epoch, and so does a checkpoint trigger whose checkpoint is still pending
        for the same attempt (lost, it would block the next checkpoints until its timeout)."""
        uow = self.ctx.uow
        for e in inherited:
            body = e.body
            if isinstance(body, ReleaseSlots):
                holders = repo.allocation_holder_states(s, body.allocation_id)
                if all(ES(st).is_terminal for st in holders):
                    uow.emit(body)
            elif isinstance(body, CancelSlotRequest):
                try:
                    if repo.get_execution(s, slot_request_execution(body.request_id)).state != ES.SCHEDULED.value:
                        uow.emit(body)
                except repo.NotFound:
                    uow.emit(body)
            elif isinstance(body, TriggerCheckpoint):
                # Still pending and its attempt still the one running: the trigger is still right
                # (the driver serves each checkpoint id once).
                if self.ctx.checkpoints.still_pending(body.job_id, body.checkpoint_id, body.execution_id):
                    uow.command(CHECKPOINT, uow.queue_of(body.taskmanager_id, s), body)

    def _resend_unacknowledged(self, s: Session) -> None:
        """Deploys and cancels no TaskManager has confirmed yet: sent again under this epoch
        (TaskManagers ignore a deploy of an attempt they run and a cancel of one they do not),
        with fresh acknowledgement timers."""
        uow = self.ctx.uow
        for ex in repo.executions_in_states(s, [ES.DEPLOYING, ES.CANCELING]):
            if ex.state == ES.DEPLOYING.value:
                job = repo.get_job(s, ex.job_id)
                if job.status != JS.RUNNING.value or not ex.taskmanager_id:
                    continue
                queue = uow.queue_of(ex.taskmanager_id, s)
                alloc = SlotsAllocated(
                    request_id=ex.id,
                    job_id=ex.job_id,
                    execution_id=ex.id,
                    allocation_id=ex.allocation_id or "",
                    taskmanager_id=ex.taskmanager_id,
                    queue=queue,
                    slot_indices=tuple(ex.slots or ()),
                )
                uow.learn_queue(ex.taskmanager_id, queue)
                uow.command(DEPLOY, queue, self.deployment.command(s, job, ex, alloc, choose_restore=False))
                self.acks.arm(ex.id, ES.DEPLOYING)
            else:
                tm = ex.taskmanager_id or NO_TASKMANAGER
                uow.command(
                    CANCEL, uow.queue_of(tm, s), CancelTask(taskmanager_id=tm, execution_id=ex.id, job_id=ex.job_id)
                )
                self.acks.arm(ex.id, ES.CANCELING)

    # --- the ResourceManager and the TaskManagers --------------------------------------

    def on_resourcemanager_started(self, msg: ResourceManagerStarted) -> None:
        with self.ctx.uow.tx() as s:
            job_ids = [j.id for j in repo.list_jobs(s, statuses=[JS.RUNNING])]
        for job_id in job_ids:
            self.rerequest_scheduled(job_id)

    def rerequest_scheduled(self, job_id: JobId) -> None:
        requests = []
        with self.ctx.uow.tx() as s:
            job = repo.get_job(s, job_id)
            latest = repo.latest_executions(s, job_id)
            for v in repo.job_vertices(s, job_id):
                ex = latest.get(v.id)
                if ex is not None and ex.state == ES.SCHEDULED.value:
                    requests.append(self.deployment.slot_request(job, v, ex))
        for r in requests:
            self.ctx.uow.emit(r)

    def on_taskmanager_lost(self, msg: TaskManagerLost) -> None:
        with self.ctx.uow.tx() as s:
            victims = [e.id for e in repo.live_executions_on(s, msg.taskmanager_id)]
        for ex_id in victims:
            self.restarts.fail(
                ex_id,
                cause_name="TaskManagerLost",
                cause=msg.reason,
                expected_tm=msg.taskmanager_id,
                release=False,
                silent_for_s=msg.silent_for_s,
            )

    def on_taskmanager_registered(self, msg: TaskManagerRegistered) -> None:
        """Reconcile what a (re-)registering TaskManager runs with what the catalog believes,
        both ways: what it runs that we gave up on is cancelled; what the catalog places on it
        that it does not report is gone (it restarted, or the ResourceManager lost track) and
        fails over now rather than staying RUNNING with nothing running it."""
        uow = self.ctx.uow
        zombies, lost, gone_cancels = [], [], []
        reported = {r.execution_id for r in msg.running}
        tm = msg.taskmanager_id
        elsewhere: dict = {}
        with uow.tx() as s:
            # A claim to an allocation the catalog places on another TaskManager is never released
            # on this one's word: those slots hold that one's running task (issue 43.6).
            claimed = [r.allocation_id for r in msg.running if r.allocation_id]
            if claimed:
                elsewhere = {a: where for a, where in repo.live_placements(s, claimed).items() if where != tm}
            for report in msg.running:
                try:
                    ex: Execution | None = repo.get_execution(s, report.execution_id, lock=True)
                except repo.NotFound:
                    ex = None
                fx = tr.reported_attempt(
                    ES(ex.state) if ex is not None else None,
                    held_here=ex is not None and ex.taskmanager_id == tm,
                    reported=report.state,
                )
                if fx == Fx.CANCEL_TASK:
                    zombies.append(report)
                elif fx == Fx.PROMOTE and ex is not None:
                    repo.transition_execution(s, ex.id, ES.RUNNING)
            now_ms = time.time() * 1000
            for ex in self._live_executions_on(s, tm):
                if ex.id in reported:
                    continue
                deployed_ms = (ex.timestamps or {}).get(ES.DEPLOYING.value, 0)
                fx = tr.unreported_attempt(ES(ex.state), deployed_s_ago=(now_ms - deployed_ms) / 1000)
                if fx == Fx.GIVE_UP_CANCEL:
                    gone_cancels.append(ex.id)
                elif fx == Fx.FAIL_OVER:
                    lost.append(ex.id)
        for z in zombies:
            log.warning("cancelling zombie task %s on %s", z.execution_id, tm)
            uow.command(
                CANCEL, uow.queue_of(tm), CancelTask(taskmanager_id=tm, execution_id=z.execution_id, job_id=z.job_id)
            )
            if z.allocation_id in elsewhere:
                log.warning(
                    "TaskManager %s reports allocation %s, which the catalog places on %s: not released",
                    tm,
                    z.allocation_id,
                    elsewhere[z.allocation_id],
                )
            elif z.allocation_id:
                # The re-registration brought its slots back as allocated; nobody else will free them.
                uow.emit(ReleaseSlots(allocation_id=z.allocation_id, reason="zombie task cancelled"))
        for ex_id in lost:
            log.warning("TaskManager %s registered without %s, which the catalog places on it: failing over", tm, ex_id)
            self.restarts.fail(
                ex_id,
                cause_name="TaskLostException",
                cause=f"TaskManager {tm} registered again without this task (it restarted or lost "
                "it): nothing runs it any more",
                expected_tm=tm,
            )
        for ex_id in gone_cancels:
            self.acks.give_up_cancel(ex_id, f"TaskManager {tm} registered again without this task: it is gone")

    def _live_executions_on(self, s: Session, tm: TaskManagerId) -> list[Execution]:
        """From the batch's prefetch when it has them, re-checked: an earlier handler of the
        same batch may have ended an attempt or moved it (one it placed here just now is
        DEPLOYING, which the caller leaves to its acknowledgement timer anyway)."""
        prefetched = self.live_on.get(tm) if self.live_on is not None else None
        if prefetched is None:
            return list(repo.live_executions_on(s, tm))
        return [ex for ex in prefetched if ex.taskmanager_id == tm and not ES(ex.state).is_terminal]
