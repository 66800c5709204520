"""The checkpoint coordinator (Flink's CheckpointCoordinator, on Spark's commit protocol).

A checkpoint of a task is a consistent snapshot of its Spark query at a committed micro-batch:
the coordinator sends `TriggerCheckpoint(n)` to the task's TaskManager; the driver snapshots its
live Spark checkpoint at the first batch committed at or after the batch planned when the
trigger arrived (the commit is the barrier) into `<checkpoints>/<job>/chk-<n>/` and acknowledges
with the batch id, source offsets, size and duration, or declines with a reason.

Per job (options with Flink's names, see shared/checkpointing.py):
  trigger   every `interval` while the job's task is RUNNING, at most `max-concurrent` pending,
            and not within `min-pause` of the last completion; savepoints and manual checkpoints
            come from the REST API at any time.
  complete  ack -> COMPLETED in the catalog, pointer in the store (ZooKeeper in HA mode), the
            oldest completed checkpoints beyond `num-retained` DISCARDED and deleted.
  fail      decline, timeout (`timeout`), or the attempt ending -> FAILED. Declines and timeouts
            of checkpoints count as consecutive failures; beyond `tolerable-failed-checkpoints`
            the job fails over (its restart strategy decides), as in Flink. A task that can never
            checkpoint (a batch query) declines permanently and is no longer triggered.
            (checkpoint_failures.py)
  restore   every attempt starts from the latest completed checkpoint or savepoint (else from the
            submission's `execution.savepoint.path`, else fresh), copied into its own live dir.
  end       FINISHED: the job's checkpoints are deleted; CANCELED: deleted only with
            DELETE_ON_CANCELLATION; FAILED: kept. Savepoints belong to the user and are never
            deleted by the coordinator.

Scheduling state (next trigger time, pending trigger times, checkpoint_schedule.py) is in memory
and rebuilt from the catalog by a new leader; everything else is in the catalog, changed in the
JobManager's unit of work. File deletions run after the transaction committed.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.orm import Session

from services.jobmanager.checkpoint_failures import CheckpointFailures
from services.jobmanager.checkpoint_schedule import Track, TriggerSchedule
from services.jobmanager.checkpoint_store import BatchLatest
from services.jobmanager.snapshot_files import discard_files
from shared import checkpointing
from shared.catalog import repository as repo
from shared.catalog.models import CheckpointRow, Execution, Job
from shared.ids import NO_TASKMANAGER, ExecutionId, JobId, VertexId
from shared.messages import CheckpointAcknowledged, CheckpointDeclined, TriggerCheckpoint
from shared.states import CheckpointStatus as CS
from shared.states import ExecutionState as ES
from shared.states import JobStatus as JS
from shared.states import OperationStatus as OS

if TYPE_CHECKING:
    from services.jobmanager.checkpoint_store import CheckpointStore
    from services.jobmanager.unit_of_work import UnitOfWork
    from shared.clock import Clock
    from shared.settings import Settings

log = logging.getLogger("headrace.jobmanager.checkpoints")

# Failures that are not the checkpoint's fault do not count toward the tolerable failures (as
# Flink's CheckpointFailureManager ignores e.g. a task that is not running).
ABORTED_BY_TASK_END = "the task attempt ended before the checkpoint completed"


class CheckpointPort(Protocol):
    """What the coordinator asks of the job master: send a trigger (after commit), fail an
    attempt over when its checkpoints keep failing, cancel a job after its savepoint."""

    def trigger(self, queue: str, cmd: TriggerCheckpoint) -> None: ...

    def fail_over(self, execution_id: ExecutionId, cause: str) -> None: ...

    def cancel(self, job_id: JobId) -> None: ...


def job_checkpoint_config(job: Job, cluster_default: dict, savepoint_dir: str) -> checkpointing.CheckpointConfig:
    """The job's effective options. A value that passed the dispatcher but cannot be read (an
    older catalog) falls back to the cluster default rather than failing every message."""
    own = dict(job.config or {})
    default = dict(cluster_default or {})
    if job.kind == "noop" and checkpointing.INTERVAL not in own:
        # A no-op task has no state: periodic checkpoints of it would only load the control plane
        # (benchmarks run thousands). Savepoints and an explicit interval still work.
        default.pop(checkpointing.INTERVAL, None)
    try:
        return checkpointing.checkpoint_config(own, default, savepoint_dir=savepoint_dir)
    except checkpointing.InvalidCheckpointConfig as exc:
        log.warning("job %s: ignoring its checkpoint options (%s); using the cluster default", job.id, exc)
        return checkpointing.checkpoint_config({}, default, savepoint_dir=savepoint_dir)


def running_attempt(s: Session, job_id: JobId) -> tuple[Job, Execution] | str:
    """The job and its one RUNNING attempt, locked; else why a snapshot cannot be taken now."""
    try:
        job = repo.get_job(s, job_id, lock=True)
    except repo.NotFound:
        return f"job {job_id} not found"
    if job.status != JS.RUNNING.value:
        return f"job {job_id} is {job.status}: snapshots need a RUNNING job"
    latest = list(repo.latest_executions(s, job_id).values())
    running = [e for e in latest if e.state == ES.RUNNING.value]
    if not latest or len(running) != len(latest):
        states = ", ".join(f"attempt {e.attempt} {e.state}" for e in latest) or "no task yet"
        return f"job {job_id} has no RUNNING task to snapshot ({states}); try again once it runs"
    return job, running[0]


class CheckpointCoordinator:
    TICK_S = 0.2
    CONFIG_CACHE_SIZE = 1024

    def __init__(self, settings: Settings, clock: Clock, uow: UnitOfWork, port: CheckpointPort, store: CheckpointStore):
        self.settings, self.clock, self.uow, self.port = settings, clock, uow, port
        self.store = BatchLatest(store, after_commit=uow.after_commit)
        self.schedule = TriggerSchedule()
        self._next_tick = 0.0
        # Effective options by the job's own (kind, options): read on every submit, deploy and
        # RUNNING report, and most jobs share a few option sets. Frozen values, so sharing is safe.
        self._configs: dict[tuple[str, str], checkpointing.CheckpointConfig] = {}
        self.failures = CheckpointFailures(settings, uow, self.schedule, self.config, port.fail_over)

    # --- configuration and paths -------------------------------------------------------

    def config(self, job: Job) -> checkpointing.CheckpointConfig:
        key = (job.kind or "", json.dumps(job.config or {}, sort_keys=True, default=str))
        cfg = self._configs.get(key)
        if cfg is None:
            if len(self._configs) >= self.CONFIG_CACHE_SIZE:
                self._configs.clear()
            cfg = self._configs[key] = job_checkpoint_config(
                job, self.settings.checkpointing, str(self.settings.savepoints)
            )
        return cfg

    def checkpoint_path(self, job_id: JobId, checkpoint_id: int) -> Path:
        return self.settings.checkpoints / job_id / f"chk-{checkpoint_id}"

    def live_dir(self, job_id: JobId, vertex_id: VertexId, execution_id: ExecutionId) -> Path:
        return self.settings.checkpoints / job_id / vertex_id / "live" / execution_id

    # --- lifecycle hooks (called by the JobMaster inside its unit of work) ---------------

    def restore_point(self, s, job: Job) -> tuple[str | None, int | None]:
        """Latest completed checkpoint or savepoint of the job; else the submission's savepoint
        path (NO_CLAIM: never owned, never deleted); else a fresh start."""
        latest = self.store.latest(s, job.id)
        if latest and latest.get("path"):
            return latest["path"], latest.get("id")
        return self.config(job).restore_path, None

    def on_submitted(self, s, job: Job) -> None:
        """CLAIM mode: the snapshot the job starts from becomes one of its own checkpoints, so
        retention deletes it once newer ones subsume it (NO_CLAIM never touches it)."""
        cfg = self.config(job)
        if not cfg.restore_path or cfg.restore_mode != "CLAIM":
            return
        cid = self.store.next_id(s, job.id)
        row = repo.create_checkpoint(
            s,
            job_id=job.id,
            checkpoint_id=cid,
            kind="checkpoint",
            execution_id=None,
            vertex_id=None,
            path=cfg.restore_path,
        )
        repo.transition_checkpoint(s, row, CS.COMPLETED, failure_cause=None)
        self.store.add(
            s,
            job.id,
            cid,
            {"path": cfg.restore_path, "batch_id": None, "kind": "checkpoint", "at": time.time(), "claimed": True},
        )

    def on_execution_running(self, s, job: Job, ex: Execution) -> None:
        cfg = self.config(job)
        now = self.clock.now()
        if self.schedule.tracks(job.id, ex.id):
            return
        due = now + (cfg.interval_s or 0.0)
        self.schedule.track(job.id, Track(ex.id, ex.vertex_id, ex.taskmanager_id or NO_TASKMANAGER, cfg, next_due=due))

    def on_execution_ended(self, s, job_id: JobId, execution_id: ExecutionId, state: ES) -> None:
        """Pending checkpoints of an attempt that ended can never complete."""
        self.schedule.forget(job_id, execution_id)
        for row in repo.list_checkpoints(s, job_id, statuses=[CS.IN_PROGRESS]):
            if row.execution_id == execution_id:
                cause = f"{ABORTED_BY_TASK_END} ({state.value})"
                self.failures.fail(s, row, cause)
                if row.path:
                    # The driver may have begun writing it; no ack will come to claim it.
                    self.uow.after_commit(partial(self._discard, [row.path]))

    def on_job_terminal(self, s, job: Job, status: JS) -> None:
        self.schedule.forget(job.id)
        for op in repo.job_operations(s, job.id, statuses=[OS.IN_PROGRESS]):
            repo.finish_operation(s, op, OS.FAILED, failure_cause=f"the job reached {status.value} first")
        for row in repo.list_checkpoints(s, job.id, statuses=[CS.IN_PROGRESS]):
            self.failures.fail(s, row, f"the job reached {status.value}")
        cfg = self.config(job)
        delete = status == JS.FINISHED or (status == JS.CANCELED and cfg.retention == "DELETE_ON_CANCELLATION")
        if delete:
            paths = []
            for row in repo.list_checkpoints(s, job.id, statuses=[CS.COMPLETED], kind="checkpoint"):
                if row.path:
                    paths.append(row.path)
                repo.transition_checkpoint(s, row, CS.DISCARDED)
            if paths:
                self.uow.after_commit(lambda: self._discard(paths))
        self.store.remove_job(s, job.id)

    # --- triggering --------------------------------------------------------------------

    def trigger(
        self,
        s: Session,
        job: Job,
        ex: Execution,
        *,
        kind: str,
        request_id: str | None = None,
        target: Path | None = None,
        after: str = "continue",
        drain: bool = False,
    ) -> CheckpointRow:
        """A checkpoint or savepoint of the attempt: its row, and the trigger sent after commit."""
        cid = self.store.next_id(s, job.id)
        target = target or self.checkpoint_path(job.id, cid)
        row = repo.create_checkpoint(
            s,
            job_id=job.id,
            checkpoint_id=cid,
            kind=kind,
            execution_id=ex.id,
            vertex_id=ex.vertex_id,
            request_id=request_id,
            after=after,
            path=str(target),
        )
        cmd = TriggerCheckpoint(
            taskmanager_id=ex.placed_on(),
            job_id=job.id,
            execution_id=ex.id,
            checkpoint_id=cid,
            kind=kind,
            target=str(target),
            stop_after=after in ("stop", "rescale"),
            drain=drain,
        )
        self.port.trigger(self.uow.queue_of(cmd.taskmanager_id, s), cmd)
        if not self.schedule.tracks(job.id, ex.id):
            self.schedule.track(
                job.id, Track(ex.id, ex.vertex_id, cmd.taskmanager_id, self.config(job), next_due=self.clock.now())
            )
        self.schedule.triggered(job.id, cid, self.clock.now())
        return row

    def due(self) -> bool:
        return bool(self.schedule) and self.clock.now() >= self._next_tick

    def tick(self) -> None:
        """Time out old pending checkpoints and trigger periodic ones that are due. Runs in a unit
        of work of its own, every TICK_S while any job is tracked."""
        now = self.clock.now()
        self._next_tick = now + self.TICK_S
        for job_id in self.schedule.jobs():
            for cid in self.schedule.timed_out(job_id, now):
                self.failures.expire(job_id, cid)
            execution_id = self.schedule.take_due(job_id, now)  # after the expiries: one may have failed it over
            if execution_id is None:
                continue
            with self.uow.tx() as s:
                found = running_attempt(s, job_id)
                if isinstance(found, str) or found[1].id != execution_id:
                    continue  # the job moved on; its hooks will update the track
                job, ex = found
                self.trigger(s, job, ex, kind="checkpoint")

    # --- acknowledgements --------------------------------------------------------------

    def on_ack(self, msg: CheckpointAcknowledged) -> None:
        with self.uow.tx() as s:
            try:
                row = repo.get_checkpoint(s, msg.job_id, msg.checkpoint_id, lock=True)
            except repo.NotFound:
                return  # no record, so no path of ours: the message's own path is not trusted
            if row.status != CS.IN_PROGRESS.value or row.execution_id != msg.execution_id:
                if row.status == CS.FAILED.value and row.path:  # late: expired or aborted meanwhile
                    self.uow.after_commit(partial(self._discard, [row.path]))
                return
            if row.path and msg.path != row.path:
                # The snapshot was written where the trigger said, or it is not ours to record
                # (a path recorded here is deleted by retention later).
                log.warning(
                    "checkpoint %d of job %s acknowledged at %s, triggered into %s: recording the trigger's path",
                    msg.checkpoint_id,
                    msg.job_id,
                    msg.path,
                    row.path,
                )
            repo.transition_checkpoint(
                s,
                row,
                CS.COMPLETED,
                path=row.path or msg.path,
                batch_id=msg.batch_id,
                state_size=msg.state_size,
                duration_ms=msg.duration_ms,
                source_offsets=list(msg.source_offsets),
            )
            job = repo.get_job(s, msg.job_id, lock=True)
            self.schedule.completed(job.id, row.checkpoint_id, self.clock.now())
            self.store.add(
                s,
                job.id,
                row.checkpoint_id,
                {"path": row.path, "batch_id": msg.batch_id, "kind": row.kind, "at": time.time()},
            )
            if row.kind == "checkpoint":
                repo.set_checkpoint_failures(s, job, 0)
                self._prune(s, job)
            if row.request_id:
                try:
                    op = repo.get_operation(s, row.request_id, lock=True)
                    repo.finish_operation(s, op, OS.COMPLETED, location=row.path, checkpoint_id=row.checkpoint_id)
                except repo.NotFound:
                    pass
            after = row.after
        log.info(
            "checkpoint %d of job %s completed at batch %d (%d bytes, %d ms)",
            msg.checkpoint_id,
            msg.job_id,
            msg.batch_id,
            msg.state_size,
            msg.duration_ms,
        )
        if after == "cancel":
            self.port.cancel(msg.job_id)

    def _discard(self, paths: list[str]) -> None:
        discard_files(paths, self.settings)

    def _prune(self, s, job: Job) -> None:
        keep = self.config(job).num_retained
        done = repo.list_checkpoints(s, job.id, statuses=[CS.COMPLETED], kind="checkpoint")
        paths = []
        for row in done[keep:]:
            repo.transition_checkpoint(s, row, CS.DISCARDED)
            self.store.remove(s, job.id, row.checkpoint_id)
            if row.path:
                paths.append(row.path)
        if paths:
            self.uow.after_commit(lambda: self._discard(paths))

    def on_decline(self, msg: CheckpointDeclined) -> None:
        self.failures.on_decline(msg)

    def still_pending(self, job_id: JobId, checkpoint_id: int, execution_id: ExecutionId) -> bool:
        """Is checkpoint `checkpoint_id` adopted as pending for that very attempt? (After
        `recover`, which adopts only the pending checkpoints of running attempts.)"""
        return self.schedule.still_pending(job_id, checkpoint_id, execution_id)

    # --- leader change -----------------------------------------------------------------

    def recover(self, s) -> None:
        """A new leader adopts the pending checkpoints of its predecessor (their acks may still
        come) with their original trigger times, and tracks every running attempt again."""
        self.schedule.clear()
        live = repo.list_jobs(s, statuses=[st for st in JS if not st.is_terminal])
        for job in (j for j in live if j.status == JS.RUNNING.value):
            for ex in repo.latest_executions(s, job.id).values():
                if ex.state == ES.RUNNING.value:
                    self.on_execution_running(s, job, ex)
        now_wall = time.time()
        for row in repo.pending_checkpoints(s):
            trigger_at = row.trigger_at.timestamp() if row.trigger_at else now_wall
            age = max(0.0, now_wall - trigger_at)
            if not self.schedule.adopt(row.job_id, row.execution_id, row.checkpoint_id, self.clock.now() - age):
                self.failures.fail(s, row, "its task attempt is no longer running (JobManager change)")
        self.store.reconcile(s, [job.id for job in live])
