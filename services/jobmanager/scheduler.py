"""The JobManager's scheduling and failover logic (Flink's JobMaster + DefaultScheduler).

One instance serves every job of the cluster (a session cluster). Handlers are idempotent:
they read the current state from the catalog and refuse what the state machines in
`shared.states` do not allow, so a redelivered message changes nothing.

Fencing: a leader claims the catalog's leadership row when it takes over (`recover`), and every
unit of work checks, just before it commits, that the leadership is still its own (the ZooKeeper
lease not revoked, the row still holding its epoch, under a row lock). A deposed leader that
wakes up mid-batch commits nothing and sends nothing; what it sent before is refused by the
receivers, which accept only the current leader's epoch (shared/leader_epoch.py).

Acknowledgements: a deploy that no TaskManager answers within `deploy_ack_timeout_s` fails the
attempt over; a cancel not confirmed within `cancel_ack_timeout_s` is sent again, and after a
second timeout the attempt is given up as CANCELED (its sinks fence it off anyway).

Flow of one attempt:
  SubmitJob -> job CREATED, plan (vertex + execution attempt 0) -> execution SCHEDULED,
  job RUNNING -> RequestSlots -> SlotsAllocated -> execution DEPLOYING -> DeployTask (Celery,
  the TaskManager's queue) -> TaskStateChanged INITIALIZING/RUNNING/FINISHED|FAILED|CANCELED.
A failure (task error, TaskManager lost, slot request timed out) goes to the job's restart
strategy: restart after its backoff (job RESTARTING, new attempt from the latest completed
checkpoint or savepoint, copied into the attempt's own live directory) or fail the job.
Checkpoints and savepoints: `services/jobmanager/checkpoints.py`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable, Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared import job_options, restart, streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.catalog.models import Artifact, Execution, Job, Vertex
from shared.clock import Clock
from shared.errors import CoordinationError
from shared.ids import new_execution_id, new_vertex_id
from shared.messages import (
    CancelJob, CancelSlotRequest, CancelTask, CheckpointAcknowledged, CheckpointDeclined, CommandRejected, DeployTask,
    Envelope, ReleaseSlots, RequestCheckpoint, RequestSavepoint, RequestSlots, ResourceManagerStarted, SlotRequestFailed,
    SlotRequestPending, SlotsAllocated, SubmitJob, TaskManagerLost, TaskManagerRegistered, TaskProgress,
    TaskStateChanged, TriggerCheckpoint,
)
from shared.settings import Settings
from shared.states import ExecutionState as ES
from shared.states import IllegalTransition, JobStatus as JS
from shared.task_protocol import TaskSpec
from services.jobmanager.checkpoint_store import CatalogCheckpointStore, CheckpointStore
from services.jobmanager.checkpoints import CheckpointCoordinator
from services.jobmanager import restore_fallback
from services.jobmanager.outbox import CANCEL, CHECKPOINT, DEPLOY, STREAM, Effect, Outbox
from services.jobmanager.report_senders import REPORTS, check_report_sender
from services.jobmanager.timers import Timers

log = logging.getLogger("headrace.jobmanager")

# Failures a restart cannot cure: the job fails at once instead of looping through its restarts.
# SinkOwnedError: the sink's target belongs to another lineage; every retry is refused alike.
NON_RECOVERABLE = frozenset({"IncompatibleStateError", "SinkOwnedError"})


def slot_request_timeout(config: dict, default_s: float) -> float:
    """`slot.request.timeout` from a job's config (shared/job_options.py): seconds or a duration
    ("5 min"). A value stored before the dispatcher checked it and unreadable falls back to the
    default rather than failing every message about the job."""
    raw = (config or {}).get(job_options.SLOT_REQUEST_TIMEOUT)
    if raw is None:
        return default_s
    try:
        return job_options.duration_s(raw, positive=True)
    except ValueError:
        log.warning("ignoring unreadable slot.request.timeout %r; using %.0f s", raw, default_s)
        return default_s


class LeadershipLost(CoordinationError, RuntimeError):
    """This JobManager is no longer the leader: its unit of work was rolled back."""


# A DEPLOYING attempt the registering TaskManager does not report may be a deploy still on its
# way (sent just before the registration): leave it to the acknowledgement timer for this long.
DEPLOY_IN_FLIGHT_S = 10.0


class JobMaster:
    def __init__(self, settings: Settings, catalog: Catalog, transport, gateway, clock: Clock, *, epoch: int,
                 checkpoint_store: CheckpointStore | None = None, leader_id: str = "jobmanager",
                 still_leading: Callable[[], bool] = lambda: True, restart_clock: Clock | None = None):
        self.settings, self.catalog, self.transport = settings, catalog, transport
        self.clock, self.epoch = clock, epoch
        self.leader_id, self.still_leading = leader_id, still_leading
        # Failure times stored in the catalog are read by the next leader, on another host:
        # wall-clock seconds there, the injected clock in tests.
        self.restart_clock = restart_clock or clock
        self.timers = Timers(clock)
        self._batch = None  # the session shared by one stream batch (see unit_of_work)
        self._live_on: dict[str, list[Execution]] | None = None  # prefetched per batch
        self._effects: list[Effect] | None = None
        self._post_commit: list[Callable[[], None]] = []
        self._last_fence = 0
        self.checkpoints = CheckpointCoordinator(self, checkpoint_store or CatalogCheckpointStore())
        self.outbox = Outbox(catalog, transport, gateway, sender="jobmanager", epoch=epoch)
        self._safe_batches = 0
        self._queues: dict[str, str] = {}
        self._handlers: dict[type, Callable] = {
            SubmitJob: self.on_submit, CancelJob: self.on_cancel, SlotsAllocated: self.on_slots_allocated,
            SlotRequestPending: self.on_slot_pending, SlotRequestFailed: self.on_slot_request_failed,
            TaskStateChanged: self.on_task_state, TaskManagerLost: self.on_taskmanager_lost,
            TaskManagerRegistered: self.on_taskmanager_registered, TaskProgress: self.on_progress,
            ResourceManagerStarted: self.on_resourcemanager_started, CommandRejected: self.on_command_rejected,
            RequestCheckpoint: self.checkpoints.on_request_checkpoint,
            RequestSavepoint: self.checkpoints.on_request_savepoint,
            CheckpointAcknowledged: self.checkpoints.on_ack, CheckpointDeclined: self.checkpoints.on_decline,
        }

    def handle(self, env: Envelope) -> None:
        handler = self._handlers.get(type(env.body))
        if handler is None:
            log.warning("JobManager ignores %s", env.body.type)
            return
        if isinstance(env.body, REPORTS):
            with self._tx() as s:
                check_report_sender(env, s)  # raises RefusedMessage: dead-lettered by the transport
        handler(env.body)

    # --- unit of work ------------------------------------------------------------------

    @contextlib.contextmanager
    def unit_of_work(self, envelopes: list[Envelope] = ()) -> Iterator[None]:
        """All handlers of one stream batch share one transaction, with the batch's rows
        prefetched; the messages and commands they produce go out only after it committed, and
        the transport acknowledges the batch only after that. One commit and a few bulk
        statements per batch, instead of a dozen round trips per message, is what lets one
        JobManager start thousands of tasks in seconds. After a failed batch the next few give
        each message its own savepoint (see _tx)."""
        try:
            with self.catalog.session() as s:
                self._batch, self._effects, self._post_commit = s, [], []
                self._live_on, deploying = self._prefetch(s, envelopes)
                self.checkpoints.store.prefetch(s, deploying)
                try:
                    if not self._safe_batches:
                        self._submit_together(s, envelopes)
                    yield
                finally:
                    self._batch, self._live_on = None, None
                    self.checkpoints.store.clear()
                # Same transaction as the decisions: they and what they send commit together.
                deleting = self.outbox.write(s, self._effects)
                self._check_leadership(s)
        except Exception:
            # The transport redelivers the whole batch; give each message its own savepoint
            # for a while so one bad message cannot keep failing its neighbours.
            self._safe_batches = 3
            self._effects = None
            self._post_commit = []
            raise
        self.outbox.committed(deleting)
        self._safe_batches = max(0, self._safe_batches - 1)
        effects, self._effects = self._effects or [], None
        self.outbox.deliver(effects)
        post, self._post_commit = self._post_commit, []
        for action in post:
            try:
                action()
            except Exception:  # noqa: BLE001 - housekeeping (file deletion) never undoes a commit
                log.warning("post-commit action failed", exc_info=True)

    @staticmethod
    def _prefetch(s: Session, envelopes: list[Envelope]) -> tuple[dict[str, list[Execution]], list[str]]:
        """Load and lock, in four statements, every row the batch's handlers will touch, so
        they run without a round trip each (executions before jobs: the handlers' lock order).
        Returns the live executions the catalog places on each TaskManager that registers in
        this batch (one statement for all of them: 10,000 registrations after a restart were
        10,000 queries), and the jobs whose attempts the batch may deploy."""
        bodies = [e.body for e in envelopes]
        deploying = list(dict.fromkeys(b.job_id for b in bodies if isinstance(b, SlotsAllocated)))
        registering = [b.taskmanager_id for b in bodies if isinstance(b, TaskManagerRegistered)]
        live_on: dict[str, list[Execution]] = {tm: [] for tm in registering}
        if registering:
            for ex in repo.live_executions_on_any(s, registering):
                live_on[ex.taskmanager_id].append(ex)
        executions = repo.lock_rows(s, Execution, {b.execution_id for b in bodies if hasattr(b, "execution_id")})
        job_ids = {b.job_id for b in bodies if hasattr(b, "job_id")} | {e.job_id for e in executions}
        jobs = repo.lock_rows(s, Job, job_ids)
        # Vertices and artifacts only for the deploys: state reports and submissions do not read
        # them, and loading 500 of each per batch of reports cost more than the reports.
        wanted = set(deploying)
        deploying_jobs = [j for j in jobs if j.id in wanted]
        if deploying_jobs:
            repo.pin(s, s.execute(select(Vertex).where(Vertex.job_id.in_([j.id for j in deploying_jobs]))).scalars().all())
            artifact_ids = {j.artifact_id for j in deploying_jobs if j.artifact_id}
            if artifact_ids:
                repo.pin(s, s.execute(select(Artifact).where(Artifact.id.in_(artifact_ids))).scalars().all())
        return live_on, deploying

    def _check_leadership(self, s: Session) -> None:
        """The last statement before a commit: still the leader? (lease, then the catalog row
        under lock, so nobody can take over between the check and the commit)."""
        if not self.still_leading():
            raise LeadershipLost(f"leadership of epoch {self.epoch} was revoked: nothing of this unit of work "
                                 "is committed")
        try:
            repo.check_leadership(s, self.epoch)
        except repo.StaleEpoch as exc:
            raise LeadershipLost(str(exc)) from None

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Session]:
        if self._batch is None:
            with self.catalog.session() as s:
                yield s
                self._check_leadership(s)
        elif self._safe_batches:
            mark = len(self._effects)
            try:
                with self._batch.begin_nested():
                    yield self._batch
            except Exception:
                del self._effects[mark:]  # what a rolled-back handler meant to send is void
                raise
        else:
            yield self._batch

    def _emit(self, body) -> None:
        self._effect(Outbox.effect(STREAM, streams.RM_STREAM, body))

    def _command(self, kind: str, queue: str, cmd) -> None:
        execution_id = cmd.spec["execution_id"] if isinstance(cmd, DeployTask) else cmd.execution_id
        self._effect(Outbox.effect(kind, queue, cmd, execution_id))

    def trigger_command(self, queue: str, cmd: TriggerCheckpoint) -> None:
        self._command(CHECKPOINT, queue, cmd)

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once the unit of work committed (dropped if it rolls back): side effects
        outside the catalog and Redis, such as deleting discarded snapshot directories."""
        if self._effects is None:
            action()
        else:
            self._post_commit.append(action)

    def fail_over_for_checkpoints(self, execution_id: str, cause: str) -> None:
        # The task itself still runs: it is cancelled like the job's other attempts, and its
        # slots return only when its TaskManager confirms (a restart must not be deployed into
        # a slot the old attempt still occupies).
        self._fail_execution(execution_id, cause_name="CheckpointException", cause=cause, expected_tm=None,
                             still_running=True)

    def _effect(self, effect: Effect) -> None:
        if self._effects is None:
            self.outbox.deliver([effect])  # outside a unit of work (unit tests drive timers so)
        else:
            self._effects.append(effect)

    # --- recovery ----------------------------------------------------------------------

    def recover(self) -> None:
        """After a (re)start: claim the leadership in the catalog and pick up every job this
        leader must drive to a terminal state. What earlier leaders left in the outbox is not
        sent as it is: it is decided again from the catalog (`_redecide`)."""
        with self._tx() as s:
            repo.claim_leadership(s, self.epoch, self.leader_id)
            live = repo.list_jobs(s, statuses=[st for st in JS if not st.is_terminal])
            todo = [(j.id, JS(j.status)) for j in live]
            self.checkpoints.recover(s)
            inherited = self.outbox.take_over(s)
            self._redecide(s, inherited)
            self._resend_unacknowledged(s)
        for job_id, status in todo:
            if status == JS.INITIALIZING:
                self.on_submit(SubmitJob(job_id=job_id))
            elif status == JS.RESTARTING:
                self.timers.call_later(0, lambda j=job_id: self._restart(j))
            elif status == JS.CANCELLING:
                self.on_cancel(CancelJob(job_id=job_id))
            elif status in (JS.RUNNING, JS.CREATED):
                self._rerequest_scheduled(job_id)
        if todo:
            log.info("recovered %d unfinished jobs", len(todo))

    def _redecide(self, s: Session, inherited: list[Effect]) -> None:
        """Entries an earlier leader committed but perhaps never sent. Deploys, cancels and slot
        requests are re-derived from the executions' states (`_resend_unacknowledged`,
        `_rerequest_scheduled`); a release or a cancelled slot request still right by the catalog
        goes out under this epoch, and so does a checkpoint trigger whose checkpoint is still pending
        for the same attempt (lost, it would block the next checkpoints until its timeout)."""
        for e in inherited:
            body = e.body
            if isinstance(body, ReleaseSlots):
                holders = s.execute(select(Execution.state).where(Execution.allocation_id == body.allocation_id)).scalars()
                if all(ES(st).is_terminal for st in holders):
                    self._emit(body)
            elif isinstance(body, CancelSlotRequest):
                try:
                    if repo.get_execution(s, body.request_id).state != ES.SCHEDULED.value:
                        self._emit(body)
                except repo.NotFound:
                    self._emit(body)
            elif isinstance(body, TriggerCheckpoint):
                # Still pending and its attempt still the one running: the trigger is still right
                # (the driver serves each checkpoint id once).
                if self.checkpoints.still_pending(body.job_id, body.checkpoint_id, body.execution_id):
                    self._command(CHECKPOINT, self._queue_of(body.taskmanager_id, s), body)

    def _resend_unacknowledged(self, s: Session) -> None:
        """Deploys and cancels no TaskManager has confirmed yet: sent again under this epoch
        (TaskManagers ignore a deploy of an attempt they run and a cancel of one they do not),
        with fresh acknowledgement timers."""
        rows = s.execute(select(Execution).where(Execution.state.in_([ES.DEPLOYING.value, ES.CANCELING.value]))).scalars()
        for ex in rows:
            if ex.state == ES.DEPLOYING.value:
                job = repo.get_job(s, ex.job_id)
                if job.status != JS.RUNNING.value or not ex.taskmanager_id:
                    continue
                queue = self._queue_of(ex.taskmanager_id, s)
                alloc = SlotsAllocated(request_id=ex.id, job_id=ex.job_id, execution_id=ex.id,
                                       allocation_id=ex.allocation_id or "", taskmanager_id=ex.taskmanager_id,
                                       queue=queue, slot_indices=tuple(ex.slots or ()))
                self._command(DEPLOY, queue, self._deploy_command(s, job, ex, alloc, choose_restore=False))
                self._arm_ack_timer(ex.id, ES.DEPLOYING)
            else:
                self._command(CANCEL, self._queue_of(ex.taskmanager_id, s),
                              CancelTask(taskmanager_id=ex.taskmanager_id or "", execution_id=ex.id, job_id=ex.job_id))
                self._arm_ack_timer(ex.id, ES.CANCELING)

    # --- acknowledgement timers ----------------------------------------------------------

    def _arm_ack_timer(self, execution_id: str, state: ES, *, resent: bool = False) -> None:
        timeout = self.settings.deploy_ack_timeout_s if state == ES.DEPLOYING else self.settings.cancel_ack_timeout_s
        self.timers.call_later(timeout, lambda: self._ack_timed_out(execution_id, state, timeout, resent))

    def _ack_timed_out(self, execution_id: str, state: ES, timeout: float, resent: bool) -> None:
        with self._tx() as s:
            try:
                ex = repo.get_execution(s, execution_id, lock=True)
            except repo.NotFound:
                return
            if ex.state != state.value:
                return  # acknowledged (or moved on) in time
            tm, job_id = ex.taskmanager_id, ex.job_id
        if state == ES.DEPLOYING:
            self._fail_execution(execution_id, cause_name="DeploymentTimeoutException",
                                 cause=f"TaskManager {tm} did not acknowledge the deployment within {timeout:g} s "
                                       "(deploy_ack_timeout_s): the command was lost or refused; failing over",
                                 expected_tm=None)
        elif not resent:
            log.warning("cancel of %s not confirmed by %s within %g s; sending it again", execution_id, tm, timeout)
            self._command(CANCEL, self._queue_of(tm), CancelTask(taskmanager_id=tm or "", execution_id=execution_id,
                                                                job_id=job_id))
            self._arm_ack_timer(execution_id, ES.CANCELING, resent=True)
        else:
            self._give_up_cancel(execution_id, f"TaskManager {tm} did not confirm the cancellation within "
                                               f"{2 * timeout:g} s (cancel_ack_timeout_s, sent twice)")

    def _give_up_cancel(self, execution_id: str, why: str) -> None:
        """CANCELING -> CANCELED without the TaskManager's word: its slots go back, and its sinks
        refuse whatever the task may still write (fenced by the next attempt's token)."""
        release = None
        with self._tx() as s:
            ex = repo.get_execution(s, execution_id, lock=True)
            if ex.state != ES.CANCELING.value:
                return
            repo.transition_execution(s, ex, ES.CANCELED, failure_cause=why)
            repo.record_exception(s, job_id=ex.job_id, exception_name="CancelTimeoutException", stacktrace=why,
                                  execution_id=ex.id, attempt=ex.attempt, taskmanager_id=ex.taskmanager_id,
                                  keep=self.settings.exception_history_size)
            release = ex.allocation_id
            self.checkpoints.on_execution_ended(s, ex.job_id, ex.id, ES.CANCELED)
            self._after_terminal(s, ex.job_id)
        log.warning("%s: %s", execution_id, why)
        if release:
            self._emit(ReleaseSlots(allocation_id=release, reason="cancel not confirmed"))

    def on_command_rejected(self, msg: CommandRejected) -> None:
        if not msg.execution_id:
            log.warning("TaskManager %s rejected a %s command: %s", msg.taskmanager_id, msg.command or "unreadable",
                        msg.reason)
            return
        if msg.command == "CancelTask":
            self._give_up_cancel(msg.execution_id, f"TaskManager {msg.taskmanager_id} rejected the cancel: {msg.reason}")
        elif msg.command in (None, "DeployTask"):
            self._fail_execution(msg.execution_id, cause_name="CommandRejected",
                                 cause=f"TaskManager {msg.taskmanager_id} rejected the deployment: {msg.reason}",
                                 expected_tm=msg.taskmanager_id)
        else:
            log.warning("TaskManager %s rejected %s for %s: %s", msg.taskmanager_id, msg.command, msg.execution_id,
                        msg.reason)

    def on_resourcemanager_started(self, msg: ResourceManagerStarted) -> None:
        with self._tx() as s:
            job_ids = [j.id for j in repo.list_jobs(s, statuses=[JS.RUNNING])]
        for job_id in job_ids:
            self._rerequest_scheduled(job_id)

    def _rerequest_scheduled(self, job_id: str) -> None:
        requests = []
        with self._tx() as s:
            job = repo.get_job(s, job_id)
            latest = repo.latest_executions(s, job_id)
            for v in repo.job_vertices(s, job_id):
                ex = latest.get(v.id)
                if ex is not None and ex.state == ES.SCHEDULED.value:
                    requests.append(self._slot_request(job, v, ex))
        for r in requests:
            self._emit(r)

    # --- submission and scheduling -----------------------------------------------------

    def on_submit(self, msg: SubmitJob) -> None:
        with self._tx() as s:
            try:
                job = repo.get_job(s, msg.job_id, lock=True)
            except repo.NotFound:
                log.warning("SubmitJob for unknown job %s", msg.job_id)
                return
            if job.status != JS.INITIALIZING.value:
                return  # a redelivered submission
            repo.transition_job(s, job, JS.CREATED, epoch=self.epoch)
            self.checkpoints.on_submitted(s, job)
            vertex = repo.create_vertex(s, id=new_vertex_id(), job_id=job.id, name=job.name,
                                        parallelism=job.parallelism)
            ex = repo.create_execution(s, id=new_execution_id(), job_id=job.id, vertex_id=vertex.id, attempt=0,
                                       keep_history=self.settings.max_attempts_history)
            request = self._schedule(s, job, vertex, ex)
        log.info("job %s (%s) submitted, parallelism %d", job.id, job.name, job.parallelism)
        self._emit(request)

    def _submit_together(self, s: Session, envelopes: list[Envelope]) -> None:
        """The batch's submissions, set-based: what `on_submit` does for each job, with the
        vertices, executions and state history of all of them written in three bulk INSERTs.
        2,000 submissions at once spent most of their time in the ORM's bookkeeping of the
        10,000 new objects. A submission is taken here only if no earlier message of the batch
        concerns its job, so handling it first changes nothing; `on_submit` then finds the job
        RUNNING and does nothing, as for a redelivered submission. Not in the savepoint-per-message
        batches after a failure (see unit_of_work): there every message goes alone."""
        mentioned: set[str] = set()
        first: list[str] = []
        for env in envelopes:
            job_id = getattr(env.body, "job_id", None)
            if isinstance(env.body, SubmitJob) and job_id not in mentioned:
                first.append(job_id)
            if job_id:
                mentioned.add(job_id)
        history: list[dict] = []
        vertices, executions, requests = [], [], []
        for job_id in dict.fromkeys(first):
            try:
                job = repo.get_job(s, job_id, lock=True)  # prefetched and locked: no SQL
            except repo.NotFound:
                continue  # on_submit logs it
            if job.status != JS.INITIALIZING.value:
                continue
            repo.transition_job(s, job, JS.CREATED, epoch=self.epoch, history=history)
            self.checkpoints.on_submitted(s, job)
            vertex_id, execution_id = new_vertex_id(), new_execution_id()
            vertices.append(dict(id=vertex_id, job_id=job.id, name=job.name, idx=0, parallelism=job.parallelism))
            executions.append(dict(id=execution_id, job_id=job.id, vertex_id=vertex_id, attempt=0))
            repo.transition_job(s, job, JS.RUNNING, epoch=self.epoch, history=history)
            requests.append(self._request(job, job.parallelism, execution_id))
            log.info("job %s (%s) submitted, parallelism %d", job.id, job.name, job.parallelism)
        repo.add_scheduled_plans(s, vertices, executions)
        repo.add_job_transitions(s, history)
        for r in requests:
            self._emit(r)

    def _schedule(self, s, job: Job, vertex: Vertex, ex: Execution) -> RequestSlots:
        repo.transition_execution(s, ex, ES.SCHEDULED)
        repo.transition_job(s, job, JS.RUNNING, epoch=self.epoch)
        return self._slot_request(job, vertex, ex)

    def _slot_request(self, job: Job, vertex: Vertex, ex: Execution) -> RequestSlots:
        return self._request(job, vertex.parallelism, ex.id)

    def _request(self, job: Job, parallelism: int, execution_id: str) -> RequestSlots:
        timeout = slot_request_timeout(job.config, self.settings.slot_request_timeout_s)
        return RequestSlots(request_id=execution_id, job_id=job.id, execution_id=execution_id, slots=parallelism,
                            timeout_s=timeout, submitted_seq=job.seq)

    def on_slot_pending(self, msg: SlotRequestPending) -> None:
        with self._tx() as s:
            try:
                repo.set_execution_waiting_reason(s, repo.get_execution(s, msg.execution_id, lock=True), msg.reason)
                repo.set_job_waiting_reason(s, repo.get_job(s, msg.job_id, lock=True), msg.reason)
            except repo.NotFound:
                pass

    def on_slots_allocated(self, msg: SlotsAllocated) -> None:
        deploy: DeployTask | None = None
        with self._tx() as s:
            try:
                ex = repo.get_execution(s, msg.execution_id, lock=True)
                job = repo.get_job(s, msg.job_id)
            except repo.NotFound:
                ex = None
            if ex is not None and ex.state == ES.DEPLOYING.value and ex.allocation_id == msg.allocation_id:
                # redelivered: send again, the TaskManager dedups
                deploy = self._deploy_command(s, job, ex, msg, choose_restore=False)
            elif ex is not None and ex.state == ES.SCHEDULED.value and job.status == JS.RUNNING.value:
                repo.transition_execution(s, ex, ES.DEPLOYING, taskmanager_id=msg.taskmanager_id,
                                          allocation_id=msg.allocation_id, slots=list(msg.slot_indices))
                repo.set_job_waiting_reason(s, job, None)
                deploy = self._deploy_command(s, job, ex, msg, choose_restore=True)
        if deploy is None:
            # Nobody wants these slots any more (cancelled or failed meanwhile): give them back.
            self._emit(ReleaseSlots(allocation_id=msg.allocation_id,
                                                                   reason="execution no longer scheduled"))
            return
        self._command(DEPLOY, msg.queue, deploy)
        self._arm_ack_timer(msg.execution_id, ES.DEPLOYING)
        log.info("deploying %s attempt of job %s to %s slots %s", msg.execution_id, msg.job_id,
                 msg.taskmanager_id, list(msg.slot_indices))

    def _deploy_command(self, s, job: Job, ex: Execution, msg: SlotsAllocated, *, choose_restore: bool) -> DeployTask:
        vertex = s.get(Vertex, ex.vertex_id)  # prefetched with the batch: no SQL
        artifact = s.get(Artifact, job.artifact_id) if job.artifact_id else None
        artifact_path = artifact.path if artifact is not None else None
        if choose_restore:
            restore_from, restore_id = self.checkpoints.restore_point(s, job)
            repo.set_execution_restore(s, ex, path=restore_from, checkpoint_id=restore_id)
        else:  # a redelivered deploy: the restore point chosen the first time
            restore_from, restore_id = ex.restored_from, ex.restored_checkpoint_id
        spec = TaskSpec(
            job_id=job.id, job_name=job.name, vertex_id=vertex.id, execution_id=ex.id, attempt=ex.attempt,
            parallelism=vertex.parallelism, kind=job.kind if job.kind in ("pyspark", "noop") else "pyspark",
            artifact_path=artifact_path, entry=job.entry, program_args=tuple(job.program_args or ()),
            checkpoint_dir=str(self.checkpoints.live_dir(job.id, vertex.id, ex.id)),
            restore_from=restore_from, restore_checkpoint_id=restore_id,
            allow_non_restored_state=self.checkpoints.config(job).allow_non_restored_state,
            artifact_sha256=artifact.sha256 if artifact is not None else None, fence_token=self._next_fence(),
            catalog_url=self.settings.pipeline_catalog_url or "",
            redis_url=self.settings.pipeline_redis_url or self.settings.redis_url,
            config=dict(job.config or {}),
        )
        self._queues[msg.taskmanager_id] = msg.queue
        return DeployTask(taskmanager_id=msg.taskmanager_id, allocation_id=msg.allocation_id,
                          slot_indices=msg.slot_indices, spec=spec.model_dump())

    def _next_fence(self) -> int:
        """Wall-clock microseconds, strictly increasing within this process: across JobManagers
        (a new leader, another cluster a job moved to) the clock keeps it growing, since the next
        attempt of a lineage is deployed seconds after the previous one, far beyond clock skew."""
        self._last_fence = max(time.time_ns() // 1000, self._last_fence + 1)
        return self._last_fence

    def on_slot_request_failed(self, msg: SlotRequestFailed) -> None:
        self._fail_execution(msg.execution_id, cause_name="NoResourceAvailableException", cause=msg.reason,
                             expected_tm=None, permanent=msg.permanent)

    # --- task reports ------------------------------------------------------------------

    def on_task_state(self, msg: TaskStateChanged) -> None:
        if msg.state == ES.FAILED:
            self._fail_execution(msg.execution_id, cause_name=msg.failure_name or "TaskFailure",
                                 cause=msg.failure_cause or "task failed", expected_tm=msg.taskmanager_id)
            return
        release = None
        with self._tx() as s:
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
            if msg.state == ES.RUNNING:
                job = repo.get_job(s, ex.job_id)
                if job.status == JS.RUNNING.value:
                    self.checkpoints.on_execution_running(s, job, ex)
            if msg.state.is_terminal:
                release = ex.allocation_id
                self.checkpoints.on_execution_ended(s, ex.job_id, ex.id, msg.state)
                self._after_terminal(s, ex.job_id)
        if release:
            self._emit(ReleaseSlots(allocation_id=release, reason=msg.state.value))

    def _after_terminal(self, s, job_id: str) -> None:
        """An attempt ended well (FINISHED or CANCELED): maybe the whole job did."""
        job = repo.get_job(s, job_id, lock=True)
        latest = list(repo.latest_executions(s, job_id).values())
        if any(not ES(e.state).is_terminal for e in latest):
            return
        if job.status == JS.CANCELLING.value:
            repo.transition_job(s, job_id, JS.CANCELED, epoch=self.epoch)
            self.checkpoints.on_job_terminal(s, job, JS.CANCELED)
        elif job.status == JS.RUNNING.value and all(e.state == ES.FINISHED.value for e in latest):
            parallelism = self.checkpoints.rescale_after_finish(s, job)
            if parallelism is not None:
                # The task stopped for a rescale savepoint: start again from it with the new
                # parallelism (the state partition count travels with the savepoint).
                for v in repo.job_vertices(s, job_id):
                    repo.set_vertex_parallelism(s, v, parallelism)
                repo.transition_job(s, job_id, JS.RESTARTING, epoch=self.epoch, reason="rescaling")
                self.timers.call_later(0, lambda: self._restart(job_id))
                log.info("job %s rescaling to parallelism %d", job_id, parallelism)
                return
            repo.transition_job(s, job_id, JS.FINISHED, epoch=self.epoch)
            self.checkpoints.on_job_terminal(s, job, JS.FINISHED)
            log.info("job %s FINISHED", job_id)

    def on_progress(self, msg: TaskProgress) -> None:
        with self._tx() as s:
            repo.record_progress(s, msg.execution_id, batch_id=msg.batch_id, rows=msg.num_input_rows)

    # --- failures and restarts ---------------------------------------------------------

    def on_taskmanager_lost(self, msg: TaskManagerLost) -> None:
        with self._tx() as s:
            victims = [e.id for e in repo.live_executions_on(s, msg.taskmanager_id)]
        for ex_id in victims:
            self._fail_execution(ex_id, cause_name="TaskManagerLost", cause=msg.reason,
                                 expected_tm=msg.taskmanager_id, release=False, silent_for_s=msg.silent_for_s)

    def on_taskmanager_registered(self, msg: TaskManagerRegistered) -> None:
        """Reconcile what a (re-)registering TaskManager runs with what the catalog believes,
        both ways: what it runs that we gave up on is cancelled; what the catalog places on it
        that it does not report is gone (it restarted, or the ResourceManager lost track) and
        fails over now rather than staying RUNNING with nothing running it."""
        zombies, lost, gone_cancels = [], [], []
        reported = {r.execution_id for r in msg.running}
        tm = msg.taskmanager_id
        with self._tx() as s:
            for report in msg.running:
                try:
                    ex = repo.get_execution(s, report.execution_id, lock=True)
                except repo.NotFound:
                    zombies.append(report)
                    continue
                if ES(ex.state).is_terminal or ex.taskmanager_id != tm:
                    zombies.append(report)  # we gave up on it (e.g. TaskManager was frozen)
                elif report.state == ES.RUNNING and ex.state in (ES.DEPLOYING.value, ES.INITIALIZING.value):
                    repo.transition_execution(s, ex.id, ES.RUNNING)
            now_ms = time.time() * 1000
            for ex in self._live_executions_on(s, tm):
                if ex.id in reported:
                    continue
                deployed_ms = (ex.timestamps or {}).get(ES.DEPLOYING.value, 0)
                if ex.state == ES.DEPLOYING.value and now_ms - deployed_ms < DEPLOY_IN_FLIGHT_S * 1000:
                    continue  # the deploy may still be on its way: its acknowledgement timer decides
                (gone_cancels if ex.state == ES.CANCELING.value else lost).append(ex.id)
        for z in zombies:
            log.warning("cancelling zombie task %s on %s", z.execution_id, tm)
            self._command(CANCEL, self._queue_of(tm),
                          CancelTask(taskmanager_id=tm, execution_id=z.execution_id, job_id=z.job_id))
            if z.allocation_id:
                # The re-registration brought its slots back as allocated; nobody else will free them.
                self._emit(ReleaseSlots(allocation_id=z.allocation_id, reason="zombie task cancelled"))
        for ex_id in lost:
            log.warning("TaskManager %s registered without %s, which the catalog places on it: failing over", tm, ex_id)
            self._fail_execution(ex_id, cause_name="TaskLostException",
                                 cause=f"TaskManager {tm} registered again without this task (it restarted or lost "
                                       "it): nothing runs it any more", expected_tm=tm)
        for ex_id in gone_cancels:
            self._give_up_cancel(ex_id, f"TaskManager {tm} registered again without this task: it is gone")

    def _live_executions_on(self, s: Session, tm: str) -> list[Execution]:
        """From the batch's prefetch when it has them, re-checked: an earlier handler of the
        same batch may have ended an attempt or moved it (one it placed here just now is
        DEPLOYING, which the caller leaves to its acknowledgement timer anyway)."""
        prefetched = self._live_on.get(tm) if self._live_on is not None else None
        if prefetched is None:
            return list(repo.live_executions_on(s, tm))
        return [ex for ex in prefetched if ex.taskmanager_id == tm and not ES(ex.state).is_terminal]

    def _fail_execution(self, execution_id: str, *, cause_name: str, cause: str, expected_tm: str | None,
                        release: bool = True, silent_for_s: float | None = None, still_running: bool = False,
                        permanent: bool = False) -> None:
        """The attempt failed: record why and restart the job or fail it. `still_running`: the
        failure was decided here (a checkpoint failover) while the attempt still runs on its
        TaskManager, so it is cancelled with the others instead of being marked FAILED.
        `permanent`: no restart could help, the job fails whatever its restart strategy."""
        release_alloc = None
        restart_in: float | None = None
        cancels: list[tuple[str, CancelTask]] = []
        with self._tx() as s:
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
                self.checkpoints.on_execution_ended(s, ex.job_id, ex.id, ES.FAILED)
                if release:
                    release_alloc = ex.allocation_id
            job = repo.get_job(s, ex.job_id, lock=True)
            if cause_name == restore_fallback.RESTORE_FAILED:  # never the same damaged snapshot again
                cause, permanent = restore_fallback.fall_back(s, self.checkpoints, job, ex, cause)
            vertex = next(v for v in repo.job_vertices(s, job.id) if v.id == ex.vertex_id)
            repo.record_exception(s, job_id=job.id, exception_name=cause_name, stacktrace=cause,
                                  execution_id=ex.id, vertex_name=vertex.name, attempt=ex.attempt,
                                  taskmanager_id=ex.taskmanager_id, keep=self.settings.exception_history_size)
            if job.status == JS.CANCELLING.value:
                if not still_running:
                    self._after_terminal(s, job.id)
            elif job.status == JS.RUNNING.value:
                strategy = self._strategy(job)
                strategy.notify_failure()
                repo.set_restart_state(s, job, strategy.state())
                cancels = self._cancel_live(s, job.id)
                if strategy.can_restart() and cause_name not in NON_RECOVERABLE and not permanent:
                    repo.transition_job(s, job.id, JS.RESTARTING, epoch=self.epoch, reason=cause_name)
                    restart_in = strategy.backoff_s()
                    if silent_for_s is not None:
                        # The backoff separates the restart from the failure, not from its
                        # detection: a TaskManager found dead by a 10 s heartbeat timeout has
                        # been gone for 10 s already, and waiting the backoff again on top would
                        # only delay recovery. (A duration the ResourceManager measured on its
                        # own clock: no two hosts' clocks are compared.)
                        restart_in = max(0.0, restart_in - max(0.0, silent_for_s))
                else:
                    repo.transition_job(s, job.id, JS.FAILING, epoch=self.epoch, reason=cause_name)
                    repo.transition_job(s, job.id, JS.FAILED, epoch=self.epoch, reason=cause_name)
                    self.checkpoints.on_job_terminal(s, job, JS.FAILED)
                    log.warning("job %s FAILED: %s", job.id, cause.splitlines()[-1] if cause else cause_name)
            job_id = job.id
        if release_alloc:
            self._emit(ReleaseSlots(allocation_id=release_alloc, reason="FAILED"))
        for queue, cmd in cancels:
            self._command(CANCEL, queue, cmd)
        if restart_in is not None:
            log.info("job %s RESTARTING in %.2f s after %s", job_id, restart_in, cause_name)
            self.timers.call_later(restart_in, lambda: self._restart(job_id))

    def _cancel_live(self, s, job_id: str) -> list[tuple[str, CancelTask]]:
        """Stop the job's other attempts (a restart is global to the job, like Flink's full
        restart); returns the cancel commands to send after commit. Attempts already CANCELING
        get the command again: it may have been lost with a TaskManager or a JobManager."""
        out = []
        for ex in repo.latest_executions(s, job_id).values():
            state = ES(ex.state)
            if state.is_terminal:
                continue
            if state in (ES.CREATED, ES.SCHEDULED):
                repo.transition_execution(s, ex.id, ES.CANCELED)
                self._emit(CancelSlotRequest(request_id=ex.id))
            else:
                if state != ES.CANCELING:
                    repo.transition_execution(s, ex, ES.CANCELING)
                    self._arm_ack_timer(ex.id, ES.CANCELING)
                out.append((self._queue_of(ex.taskmanager_id, s),
                            CancelTask(taskmanager_id=ex.taskmanager_id, execution_id=ex.id, job_id=job_id)))
        return out

    def _queue_of(self, taskmanager_id: str, s=None) -> str:
        """The Celery queue of a TaskManager: learned from slot offers, else from the catalog."""
        if taskmanager_id not in self._queues and s is not None:
            try:
                self._queues[taskmanager_id] = repo.get_taskmanager(s, taskmanager_id).queue
            except repo.NotFound:
                pass
        return self._queues.get(taskmanager_id, streams.tm_queue(taskmanager_id))

    def _restart(self, job_id: str) -> None:
        requests = []
        with self._tx() as s:
            job = repo.get_job(s, job_id, lock=True)
            if job.status != JS.RESTARTING.value:
                return  # cancelled (or otherwise moved on) during the backoff: cancel wins
            latest = repo.latest_executions(s, job_id)
            # A job RESTARTING with every task FINISHED is being rescaled: all of them start again.
            rescaling = bool(latest) and all(e.state == ES.FINISHED.value for e in latest.values())
            for v in repo.job_vertices(s, job_id):
                prev = latest.get(v.id)
                if prev is not None and prev.state == ES.FINISHED.value and not rescaling:
                    continue
                ex = repo.create_execution(s, id=new_execution_id(), job_id=job_id, vertex_id=v.id,
                                           attempt=(prev.attempt + 1) if prev else 0,
                                           keep_history=self.settings.max_attempts_history)
                repo.transition_execution(s, ex.id, ES.SCHEDULED)
                requests.append(self._slot_request(job, v, ex))
            repo.transition_job(s, job_id, JS.RUNNING, epoch=self.epoch)
        for r in requests:
            self._emit(r)
        log.info("job %s restarted (%d tasks)", job_id, len(requests))

    def _strategy(self, job: Job) -> restart.RestartStrategy:
        """Built afresh from the job's row each time: its counters live in the catalog, so a
        rolled-back failure was never counted and a new leader continues the budget."""
        config = job.restart_strategy or self.settings.restart_strategy
        strategy = restart.build(config, clock=self.restart_clock)
        strategy.load(job.restart_state or {})
        return strategy

    # --- cancel ------------------------------------------------------------------------

    def on_cancel(self, msg: CancelJob) -> None:
        cancels = []
        with self._tx() as s:
            try:
                job = repo.get_job(s, msg.job_id, lock=True)
            except repo.NotFound:
                return
            status = JS(job.status)
            if status.is_terminal:
                return
            if status == JS.INITIALIZING:
                repo.transition_job(s, job.id, JS.CANCELED, epoch=self.epoch)
                self.checkpoints.on_job_terminal(s, job, JS.CANCELED)
                return
            if status != JS.CANCELLING:
                repo.transition_job(s, job.id, JS.CANCELLING, epoch=self.epoch)
            cancels = self._cancel_live(s, job.id)
            self._after_terminal(s, job.id)
        for queue, cmd in cancels:
            self._command(CANCEL, queue, cmd)
        log.info("cancelling job %s (%d running tasks)", msg.job_id, len(cancels))
