"""The JobManager's job master (Flink's JobMaster + DefaultScheduler): the entry point of every
message the JobManager receives, and the handlers of a job's way from submission to its running
tasks. One instance serves every job of the cluster (a session cluster).

The rooms it wires together, each in its module:
  unit_of_work.py    the fenced catalog transaction, the outbox, the after-commit effects
  transitions.py     the rules: (state, event) -> (new states, effects), decided without I/O
  deployment.py      slot requests and deploy commands
  restarts.py        failures, the restart strategy, the end of a job
  submission.py      a job's submission: its plan and its slot request, one by one or a batch's together
  ack_timers.py      unacknowledged deploys and cancels
  reconciliation.py  a new leader's recovery, (re-)registering and lost TaskManagers
  checkpoint_coordinator.py  the checkpoint coordinator (through a narrow port: trigger, fail over, cancel)
  snapshot_requests.py  the REST API's checkpoints, savepoints, stops and rescales

Handlers are idempotent: they read the current state from the catalog and refuse what the state
machines in `shared.states` do not allow, so a redelivered message changes nothing.

Flow of one attempt:
  SubmitJob -> job CREATED, plan (vertex + execution attempt 0) -> execution SCHEDULED,
  job RUNNING -> RequestSlots -> SlotsAllocated -> execution DEPLOYING -> DeployTask (Celery,
  the TaskManager's queue) -> TaskStateChanged INITIALIZING/RUNNING/FINISHED|FAILED|CANCELED.
A failure (task error, TaskManager lost, slot request timed out) goes to the job's restart
strategy: restart after its backoff (job RESTARTING, new attempt from the latest completed
checkpoint or savepoint, copied into the attempt's own live directory) or fail the job.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, Sequence

from services.jobmanager import transitions as tr
from services.jobmanager.ack_timers import AckTimers
from services.jobmanager.batch_prefetch import prefetch
from services.jobmanager.checkpoint_coordinator import CheckpointCoordinator
from services.jobmanager.checkpoint_store import CatalogCheckpointStore, CheckpointStore
from services.jobmanager.context import Context
from services.jobmanager.deployment import Deployment
from services.jobmanager.outbox import CANCEL, CHECKPOINT, DEPLOY, Outbox
from services.jobmanager.pipeline_redis_users import PipelineRedisUsers
from services.jobmanager.reconciliation import Reconciliation
from services.jobmanager.redis_key_claims import RedisKeyClaims
from services.jobmanager.report_senders import REPORTS, check_report_sender
from services.jobmanager.restarts import Restarts
from services.jobmanager.slot_request_watch import SlotRequestWatch
from services.jobmanager.snapshot_requests import SnapshotRequests
from services.jobmanager.submission import Submissions
from services.jobmanager.timers import Timers
from services.jobmanager.transitions import Fx
from services.jobmanager.unit_of_work import UnitOfWork
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.clock import Clock
from shared.ids import ExecutionId, JobId
from shared.messages import (
    CancelJob,
    CheckpointAcknowledged,
    CheckpointDeclined,
    CommandRejected,
    DeployTask,
    Envelope,
    RedisKeysClaimed,
    ReleaseSlots,
    RequestCheckpoint,
    RequestSavepoint,
    ResourceManagerStarted,
    SlotRequestFailed,
    SlotRequestPending,
    SlotsAllocated,
    SubmitJob,
    TaskManagerLost,
    TaskManagerRegistered,
    TaskProgress,
    TaskStateChanged,
    TaskWaiting,
    TriggerCheckpoint,
)
from shared.settings import Settings
from shared.states import ExecutionState as ES
from shared.states import IllegalTransition
from shared.states import JobStatus as JS

log = logging.getLogger("headrace.jobmanager")


class _CheckpointPort:
    """What the checkpoint coordinator may ask of the job master."""

    def __init__(self, master: "JobMaster"):
        self._master = master

    def trigger(self, queue: str, cmd: TriggerCheckpoint) -> None:
        self._master.uow.command(CHECKPOINT, queue, cmd)

    def fail_over(self, execution_id: ExecutionId, cause: str) -> None:
        self._master.fail_over_for_checkpoints(execution_id, cause)

    def cancel(self, job_id: JobId) -> None:
        self._master.on_cancel(CancelJob(job_id=job_id))


class JobMaster:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        transport: Any,
        gateway: Any,
        clock: Clock,
        *,
        epoch: int,
        checkpoint_store: CheckpointStore | None = None,
        leader_id: str = "jobmanager",
        still_leading: Callable[[], bool] = lambda: True,
        restart_clock: Clock | None = None,
        pipeline_users: PipelineRedisUsers | None = None,
    ):
        self.settings, self.catalog, self.transport = settings, catalog, transport
        self.clock, self.epoch = clock, epoch
        self.timers = Timers(clock)
        self.outbox = Outbox(catalog, transport, gateway, sender="jobmanager", epoch=epoch)
        self.uow = UnitOfWork(catalog, self.outbox, epoch=epoch, still_leading=still_leading)
        self.checkpoints = CheckpointCoordinator(
            settings, clock, self.uow, _CheckpointPort(self), checkpoint_store or CatalogCheckpointStore()
        )
        ctx = Context(settings, self.uow, self.checkpoints, self.timers, epoch, restart_clock or clock)
        self.snapshots = SnapshotRequests(ctx)
        self.deployment = Deployment(settings, self.checkpoints, pipeline_users)
        self.submissions = Submissions(ctx, self.deployment)
        self.restarts = Restarts(ctx, self.deployment, arm_ack=lambda ex, state: self.acks.arm(ex, state))
        self.acks = AckTimers(ctx, self.restarts)
        self.slot_watch = SlotRequestWatch(
            ctx,
            clock,
            lambda ex, cause: self.restarts.fail(
                ex, cause_name="NoResourceAvailableException", cause=cause, expected_tm=None
            ),
        )
        self.deployment.on_request = self.slot_watch.sent
        self.redis_claims = RedisKeyClaims(settings, self.uow, self.deployment, pipeline_users, self.restarts.fail)
        self.reconciliation = Reconciliation(
            ctx,
            self.outbox,
            self.deployment,
            self.restarts,
            self.acks,
            leader_id=leader_id,
            submit=lambda job_id: self.on_submit(SubmitJob(job_id=job_id)),
            cancel=lambda job_id: self.on_cancel(CancelJob(job_id=job_id)),
        )
        rec = self.reconciliation
        self._handlers: dict[type, Callable[[Any], None]] = {
            SubmitJob: self.on_submit,
            CancelJob: self.on_cancel,
            SlotsAllocated: self.on_slots_allocated,
            SlotRequestPending: self.on_slot_pending,
            SlotRequestFailed: self.on_slot_request_failed,
            TaskStateChanged: self.on_task_state,
            TaskProgress: self.on_progress,
            TaskWaiting: self.on_waiting,
            TaskManagerLost: rec.on_taskmanager_lost,
            TaskManagerRegistered: rec.on_taskmanager_registered,
            ResourceManagerStarted: rec.on_resourcemanager_started,
            CommandRejected: self.acks.on_command_rejected,
            RequestCheckpoint: self.snapshots.on_request_checkpoint,
            RequestSavepoint: self.snapshots.on_request_savepoint,
            CheckpointAcknowledged: self.checkpoints.on_ack,
            CheckpointDeclined: self.checkpoints.on_decline,
            RedisKeysClaimed: self.redis_claims.on_claimed,
        }

    def handle(self, env: Envelope) -> None:
        handler = self._handlers.get(type(env.body))
        if handler is None:
            log.warning("JobManager ignores %s", env.body.type)
            return
        if isinstance(env.body, REPORTS):
            with self.uow.tx() as s:
                check_report_sender(env, s)  # raises RefusedMessage: dead-lettered by the transport
        handler(env.body)

    @contextlib.contextmanager
    def unit_of_work(self, envelopes: Sequence[Envelope] = ()) -> Iterator[None]:
        """All handlers of one stream batch share one unit of work (unit_of_work.py), with the
        batch's rows prefetched. One commit and a few bulk statements per batch, instead of a
        dozen round trips per message, is what lets one JobManager start thousands of tasks in
        seconds."""
        with self.uow.batch() as s:
            self.reconciliation.live_on, deploying = prefetch(s, envelopes)
            self.checkpoints.store.prefetch(s, deploying)
            try:
                if self.uow.grouping:
                    self.submissions.submit_together(s, envelopes)
                yield
            finally:
                self.reconciliation.live_on = None
                self.checkpoints.store.clear()

    def recover(self) -> None:
        """After a (re)start: see Reconciliation.recover; then the snapshot requests that wait
        for their task to run are watched again."""
        self.reconciliation.recover()
        self.snapshots.recover()

    def fail_over_for_checkpoints(self, execution_id: ExecutionId, cause: str) -> None:
        # The task itself still runs: it is cancelled like the job's other attempts, and its
        # slots return only when its TaskManager confirms (a restart must not be deployed into
        # a slot the old attempt still occupies).
        self.restarts.fail(
            execution_id, cause_name="CheckpointException", cause=cause, expected_tm=None, still_running=True
        )

    # --- submission (submission.py) and slot answers ----------------------------------

    def on_submit(self, msg: SubmitJob) -> None:
        self.submissions.submit(msg)

    def on_slot_pending(self, msg: SlotRequestPending) -> None:
        self.slot_watch.answered(msg.execution_id, pending=True)
        with self.uow.tx() as s:
            try:
                repo.set_execution_waiting_reason(s, repo.get_execution(s, msg.execution_id, lock=True), msg.reason)
                repo.set_job_waiting_reason(s, repo.get_job(s, msg.job_id, lock=True), msg.reason)
            except repo.NotFound:
                pass

    def on_slots_allocated(self, msg: SlotsAllocated) -> None:
        self.slot_watch.answered(msg.execution_id, pending=False)
        deploy: DeployTask | None = None
        with self.uow.tx() as s:
            try:
                ex = repo.get_execution(s, msg.execution_id, lock=True)
                job = repo.get_job(s, msg.job_id)
                decision = tr.on_slots_allocated(
                    ES(ex.state), same_allocation=ex.allocation_id == msg.allocation_id, job=JS(job.status)
                )
            except repo.NotFound:
                decision = tr.on_slots_allocated(None, same_allocation=False, job=None)
            if decision.execution is not None:
                repo.transition_execution(
                    s,
                    ex,
                    decision.execution,
                    taskmanager_id=msg.taskmanager_id,
                    allocation_id=msg.allocation_id,
                    slots=list(msg.slot_indices),
                )
                repo.set_job_waiting_reason(s, job, None)
            clash = self.redis_claims.declared_clash(s, job) if Fx.DEPLOY in decision else None
            if clash is None and (Fx.DEPLOY in decision or Fx.REDEPLOY in decision):
                deploy = self.deployment.command(s, job, ex, msg, choose_restore=Fx.DEPLOY in decision)
                self.uow.learn_queue(msg.taskmanager_id, msg.queue)
        if clash is not None:  # never deployed: the attempt fails here and its slots go back
            self.redis_claims.refuse(msg.execution_id, clash, deployed=False)
            return
        if deploy is None:
            # Nobody wants these slots any more (cancelled or failed meanwhile): give them back.
            self.uow.emit(ReleaseSlots(allocation_id=msg.allocation_id, reason="execution no longer scheduled"))
            return
        self.uow.command(DEPLOY, msg.queue, deploy)
        self.acks.arm(msg.execution_id, ES.DEPLOYING)
        log.info(
            "deploying %s attempt of job %s to %s slots %s",
            msg.execution_id,
            msg.job_id,
            msg.taskmanager_id,
            list(msg.slot_indices),
        )

    def on_slot_request_failed(self, msg: SlotRequestFailed) -> None:
        self.slot_watch.answered(msg.execution_id, pending=False)
        self.restarts.fail(
            msg.execution_id,
            cause_name="NoResourceAvailableException",
            cause=msg.reason,
            expected_tm=None,
            permanent=msg.permanent,
        )

    # --- task reports ------------------------------------------------------------------

    def on_task_state(self, msg: TaskStateChanged) -> None:
        if msg.state == ES.FAILED:
            self.restarts.fail(
                msg.execution_id,
                cause_name=msg.failure_name or "TaskFailure",
                cause=msg.failure_cause or "task failed",
                expected_tm=msg.taskmanager_id,
            )
            return
        release = None
        with self.uow.tx() as s:
            try:
                ex = repo.get_execution(s, msg.execution_id, lock=True)
            except repo.NotFound:
                return
            if ex.taskmanager_id and ex.taskmanager_id != msg.taskmanager_id:
                return  # a report from a TaskManager that no longer owns this attempt
            try:
                repo.transition_execution(s, ex, msg.state, at_ms=int(msg.at * 1000))
            except IllegalTransition as exc:
                log.debug("ignoring %s for %s: %s", msg.state.value, ex.id, exc)
                return
            job = repo.get_job(s, ex.job_id) if msg.state == ES.RUNNING else None
            decision = tr.on_task_report(msg.state, job=JS(job.status) if job is not None else None)
            if Fx.TRACK_CHECKPOINTS in decision and job is not None:
                self.checkpoints.on_execution_running(s, job, ex)
            if Fx.SETTLE in decision:
                release = ex.allocation_id
                self.checkpoints.on_execution_ended(s, ex.job_id, ex.id, msg.state)
                self.restarts.settle(s, ex.job_id)
        if release:
            self.uow.emit(ReleaseSlots(allocation_id=release, reason=msg.state.value))

    def on_progress(self, msg: TaskProgress) -> None:
        with self.uow.tx() as s:
            repo.record_progress(s, msg.execution_id, batch_id=msg.batch_id, rows=msg.num_input_rows)

    def on_waiting(self, msg: TaskWaiting) -> None:
        """A RUNNING attempt waits for something outside Headrace (a SQL sink's database): its
        waiting reason says so until the task reports it goes on (reason None)."""
        with self.uow.tx() as s:
            try:
                ex = repo.get_execution(s, msg.execution_id, lock=True)
            except repo.NotFound:
                return
            if ES(ex.state) == ES.RUNNING:
                repo.set_execution_waiting_reason(s, ex, msg.reason)

    # --- cancel ------------------------------------------------------------------------

    def on_cancel(self, msg: CancelJob) -> None:
        cancels = []
        with self.uow.tx() as s:
            try:
                job = repo.get_job(s, msg.job_id, lock=True)
            except repo.NotFound:
                return
            decision = tr.on_cancel(JS(job.status))
            for target in decision.job:
                repo.transition_job(s, job.id, target, epoch=self.epoch)
                if target.is_terminal:
                    self.checkpoints.on_job_terminal(s, job, target)
            if Fx.CANCEL_TASKS not in decision:
                return
            cancels = self.restarts.cancel_live(s, job.id)
            self.restarts.settle(s, job.id)
        for queue, cmd in cancels:
            self.uow.command(CANCEL, queue, cmd)
        log.info("cancelling job %s (%d running tasks)", msg.job_id, len(cancels))
