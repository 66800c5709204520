"""Every catalog write. One function per entity changes its state, inside the caller's
transaction (`Catalog.session()`), locking the row and refusing what its state machine forbids.

JobManager writes are fenced twice. The `leadership` row holds the newest leader epoch: a leader
claims it when it takes over (`claim_leadership`) and every unit of work locks it and checks its
own epoch just before committing (`check_leadership`), so a deposed leader commits nothing at
all, whichever rows it touched. And a job row remembers the newest epoch that wrote it
(`StaleEpoch` for an older one).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Sequence

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.util import identity_key

from shared.catalog.models import (
    Artifact, CheckpointRow, ExceptionRow, Execution, Job, JobTransition, Leadership, Operation, OutboxEntry, Sequence_,
    TaskManagerRow, Vertex, epoch_ms, utcnow,
)
from shared.errors import CoordinationError, NotFoundError
from shared.states import (
    CheckpointStatus, ExecutionState, IllegalTransition, JobStatus, OperationStatus, check_checkpoint_transition,
    check_execution_transition, check_job_transition,
)


class NotFound(NotFoundError, LookupError):
    pass


def _locked(s: Session) -> set:
    """Identity keys of rows this transaction has already locked (SELECT ... FOR UPDATE)."""
    return s.info.setdefault("headrace_locked", set())


def lock_rows(s: Session, model, ids) -> list:
    """Load and lock many rows in one statement; later get_* calls for them cost no SQL."""
    ids = list(ids)
    if not ids:
        return []
    rows = s.execute(select(model).where(model.id.in_(ids)).with_for_update()).scalars().all()
    _locked(s).update(identity_key(model, r.id) for r in rows)
    pin(s, rows)
    return rows


def pin(s: Session, rows) -> None:
    """The identity map holds rows weakly: keep prefetched ones alive for the transaction."""
    s.info.setdefault("headrace_pinned", []).extend(rows)


def _get(s: Session, model, pk: str, lock: bool):
    key = identity_key(model, pk)
    if not lock or key in _locked(s):  # an unlocked read may use any row already loaded
        row = s.identity_map.get(key)
        if row is not None:
            return row
    q = select(model).where(model.id == pk)
    if lock:
        q = q.with_for_update()
    row = s.execute(q).scalar_one_or_none()
    if row is not None and lock:
        _locked(s).add(key)
    return row


class StaleEpoch(CoordinationError, RuntimeError):
    """A write by a JobManager whose leadership has since passed to a newer epoch."""


# --- leadership ----------------------------------------------------------------------------

LEADERSHIP_ROW = 1


def claim_leadership(s: Session, epoch: int, leader: str) -> None:
    """Make `epoch` the catalog's leader epoch; StaleEpoch if a newer leader claimed it already.
    The row lock waits for a deposed leader's transaction in flight, which then commits before
    the claim (it was still the leader) or fails its own check after it."""
    row = s.execute(select(Leadership).where(Leadership.id == LEADERSHIP_ROW).with_for_update()).scalar_one_or_none()
    if row is None:
        s.add(Leadership(id=LEADERSHIP_ROW, epoch=epoch, leader=leader, since=utcnow()))
        s.flush()
        return
    if row.epoch > epoch:
        raise StaleEpoch(f"the catalog's leader epoch is {row.epoch} ({row.leader}); this JobManager has {epoch}")
    row.epoch, row.leader, row.since = epoch, leader, utcnow()


def check_leadership(s: Session, epoch: int) -> None:
    """Lock the leadership row and raise StaleEpoch unless `epoch` still holds it: the last
    statement of every unit of work of a leader, so the check and the commit are atomic."""
    row = s.execute(select(Leadership.epoch).where(Leadership.id == LEADERSHIP_ROW).with_for_update()).scalar_one_or_none()
    if row != epoch:
        raise StaleEpoch(f"leadership passed to epoch {row}; this JobManager has epoch {epoch}: nothing it "
                         "decided in this unit of work is committed")


def leadership_epoch(s: Session) -> int:
    return int(s.execute(select(Leadership.epoch).where(Leadership.id == LEADERSHIP_ROW)).scalar_one_or_none() or 0)


# --- counters ------------------------------------------------------------------------------


def next_value(s: Session, name: str) -> int:
    row = s.execute(select(Sequence_).where(Sequence_.name == name).with_for_update()).scalar_one_or_none()
    if row is None:
        row = Sequence_(name=name, value=0)
        s.add(row)
        s.flush()
    row.value += 1
    s.flush()
    return row.value


# --- artifacts -----------------------------------------------------------------------------


def create_artifact(s: Session, *, id: str, name: str, path: str, size: int, sha256: str) -> Artifact:
    row = Artifact(id=id, name=name, path=path, size=size, sha256=sha256)
    s.add(row)
    s.flush()
    return row


def get_artifact(s: Session, artifact_id: str) -> Artifact:
    row = s.get(Artifact, artifact_id)
    if row is None:
        raise NotFound(f"artifact {artifact_id} not found")
    return row


def list_artifacts(s: Session) -> Sequence[Artifact]:
    return s.execute(select(Artifact).order_by(Artifact.uploaded_at)).scalars().all()


def delete_artifact(s: Session, artifact_id: str) -> Artifact:
    row = get_artifact(s, artifact_id)
    s.delete(row)
    s.flush()
    return row


# --- jobs ----------------------------------------------------------------------------------


def create_job(
    s: Session, *, id: str, name: str, artifact_id: str | None, entry: str, parallelism: int,
    program_args: list[str], config: dict[str, Any], restart_strategy: dict[str, Any],
    kind: str = "pyspark",
) -> Job:
    now = utcnow()
    job = Job(
        id=id, seq=next_value(s, "job"), name=name, artifact_id=artifact_id, entry=entry,
        parallelism=parallelism, program_args=list(program_args), config=dict(config),
        restart_strategy=dict(restart_strategy), kind=kind, status=JobStatus.INITIALIZING.value,
        created_at=now, updated_at=now,
    )
    s.add(job)
    s.add(JobTransition(job_id=id, from_status=None, to_status=JobStatus.INITIALIZING.value, at=now))
    s.flush()
    return job


def get_job(s: Session, job_id: str, *, lock: bool = False) -> Job:
    row = _get(s, Job, job_id, lock)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    return row


def list_jobs(s: Session, *, statuses: Iterable[JobStatus] | None = None) -> Sequence[Job]:
    q = select(Job).order_by(Job.seq)
    if statuses is not None:
        q = q.where(Job.status.in_([st.value for st in statuses]))
    return s.execute(q).scalars().all()


def transition_job(
    s: Session, job_id: str | Job, target: JobStatus, *, epoch: int | None = None, reason: str | None = None,
    history: list[dict] | None = None,
) -> Job:
    """The only function that changes `jobs.status`. Raises IllegalTransition or StaleEpoch.
    Pass the row itself when the caller already holds it locked, to save a round trip.
    `history`: collect the transition's row there (for `add_job_transitions`, one bulk INSERT
    for many jobs) instead of adding it to the session."""
    job = job_id if isinstance(job_id, Job) else get_job(s, job_id, lock=True)
    job_id = job.id
    if epoch is not None:
        if job.epoch > epoch:
            raise StaleEpoch(f"job {job_id} is owned by epoch {job.epoch}; this writer has {epoch}")
        job.epoch = epoch
    current = JobStatus(job.status)
    if current == target:
        return job
    check_job_transition(current, target)
    now = utcnow()
    job.status = target.value
    job.updated_at = now
    if target.is_terminal:
        job.end_at = now
        job.waiting_reason = None
    row = dict(job_id=job_id, from_status=current.value, to_status=target.value, at=now, reason=reason)
    if history is not None:
        history.append(row)
    else:
        s.add(JobTransition(**row))
    return job


def add_job_transitions(s: Session, rows: list[dict]) -> None:
    if rows:
        s.execute(insert(JobTransition.__table__), rows)


def set_job_waiting_reason(s: Session, job: str | Job, reason: str | None) -> None:
    if isinstance(job, Job):
        if job.waiting_reason != reason:
            job.waiting_reason = reason
        return
    s.execute(update(Job).where(Job.id == job).values(waiting_reason=reason))


def job_transitions(s: Session, job_id: str) -> Sequence[JobTransition]:
    return s.execute(select(JobTransition).where(JobTransition.job_id == job_id).order_by(JobTransition.id)).scalars().all()


def job_state_timestamps(s: Session, job_id: str) -> dict[str, int]:
    """Flink's `timestamps` map: the last time the job entered each state, in epoch ms."""
    return {t.to_status: epoch_ms(t.at) for t in job_transitions(s, job_id)}


# --- vertices and executions ---------------------------------------------------------------


def create_vertex(s: Session, *, id: str, job_id: str, name: str, parallelism: int, idx: int = 0) -> Vertex:
    v = Vertex(id=id, job_id=job_id, name=name, parallelism=parallelism, idx=idx)
    s.add(v)
    return v


def add_scheduled_plans(s: Session, vertices: list[dict], executions: list[dict]) -> None:
    """Vertices and their first executions for many jobs, in two bulk INSERTs (Core: thousands
    of new ORM objects cost more to track than to write). Keys: a vertex's columns; an
    execution's id, job_id, vertex_id and attempt. Each execution is created and scheduled at
    once, as create_execution and transition_execution(SCHEDULED) would leave it."""
    if vertices:
        s.execute(insert(Vertex.__table__), vertices)
    if executions:
        check_execution_transition(ExecutionState.CREATED, ExecutionState.SCHEDULED)
        now_ms = epoch_ms(utcnow())
        stamps = {ExecutionState.CREATED.value: now_ms, ExecutionState.SCHEDULED.value: now_ms}
        s.execute(insert(Execution.__table__), [
            dict(e, state=ExecutionState.SCHEDULED.value, timestamps=stamps, slots=[], rows_processed=0)
            for e in executions])


def job_vertices(s: Session, job_id: str) -> Sequence[Vertex]:
    return s.execute(select(Vertex).where(Vertex.job_id == job_id).order_by(Vertex.idx)).scalars().all()


def create_execution(s: Session, *, id: str, job_id: str, vertex_id: str, attempt: int,
                     keep_history: int = 16) -> Execution:
    now_ms = epoch_ms(utcnow())
    ex = Execution(id=id, job_id=job_id, vertex_id=vertex_id, attempt=attempt,
                   state=ExecutionState.CREATED.value, timestamps={"CREATED": now_ms}, slots=[])
    s.add(ex)
    # Flink keeps the last 16 prior attempts of each subtask; older terminal ones are pruned.
    cutoff = attempt - keep_history
    if cutoff >= 0:
        s.execute(delete(Execution).where(Execution.vertex_id == vertex_id, Execution.attempt <= cutoff))
    return ex


def get_execution(s: Session, execution_id: str, *, lock: bool = False) -> Execution:
    ex = _get(s, Execution, execution_id, lock)
    if ex is None:
        raise NotFound(f"execution {execution_id} not found")
    return ex


def vertex_executions(s: Session, vertex_id: str) -> Sequence[Execution]:
    return s.execute(select(Execution).where(Execution.vertex_id == vertex_id).order_by(Execution.attempt)).scalars().all()


def job_executions(s: Session, job_id: str) -> Sequence[Execution]:
    return s.execute(select(Execution).where(Execution.job_id == job_id).order_by(Execution.attempt)).scalars().all()


def latest_executions(s: Session, job_id: str) -> dict[str, Execution]:
    """vertex id -> its current (highest) attempt."""
    out: dict[str, Execution] = {}
    for ex in job_executions(s, job_id):
        out[ex.vertex_id] = ex
    return out


def live_executions_on(s: Session, taskmanager_id: str) -> Sequence[Execution]:
    return live_executions_on_any(s, [taskmanager_id])


def live_executions_on_any(s: Session, taskmanager_ids: Sequence[str]) -> list[Execution]:
    terminal = [e.value for e in ExecutionState if e.is_terminal]
    out: list[Execution] = []
    ids = list(dict.fromkeys(taskmanager_ids))
    for i in range(0, len(ids), 1000):
        out.extend(s.execute(select(Execution).where(Execution.taskmanager_id.in_(ids[i:i + 1000]),
                                                     Execution.state.not_in(terminal))).scalars())
    return out


def transition_execution(
    s: Session, execution_id: str | Execution, target: ExecutionState, *, at_ms: int | None = None,
    taskmanager_id: str | None = None, allocation_id: str | None = None,
    slots: list[int] | None = None, failure_cause: str | None = None,
) -> Execution:
    """The only function that changes `executions.state`. Raises IllegalTransition.
    Pass the row itself when the caller already holds it locked, to save a round trip."""
    ex = execution_id if isinstance(execution_id, Execution) else get_execution(s, execution_id, lock=True)
    current = ExecutionState(ex.state)
    if current == target:
        return ex
    check_execution_transition(current, target)
    now = utcnow()
    ex.state = target.value
    ex.timestamps = {**(ex.timestamps or {}), target.value: at_ms or epoch_ms(now)}
    if taskmanager_id is not None:
        ex.taskmanager_id = taskmanager_id
    if allocation_id is not None:
        ex.allocation_id = allocation_id
    if slots is not None:
        ex.slots = list(slots)
    if failure_cause is not None:
        ex.failure_cause = failure_cause
    if target == ExecutionState.DEPLOYING:
        ex.start_at = now
        ex.waiting_reason = None
    if target.is_terminal:
        ex.end_at = now
    return ex


def set_execution_waiting_reason(s: Session, execution: str | Execution, reason: str | None) -> None:
    if isinstance(execution, Execution):
        execution.waiting_reason = reason
        return
    s.execute(update(Execution).where(Execution.id == execution).values(waiting_reason=reason))


def record_progress(s: Session, execution_id: str, *, batch_id: int, rows: int) -> None:
    """Count a committed batch once: a redelivered report (same batch id) or one overtaken by a
    later batch changes nothing."""
    s.execute(
        update(Execution)
        .where(Execution.id == execution_id,
               (Execution.last_batch_id.is_(None)) | (Execution.last_batch_id < batch_id))
        .values(last_batch_id=batch_id, rows_processed=Execution.rows_processed + rows)
    )


def set_restart_state(s: Session, job: Job, state: dict) -> None:
    job.restart_state = state


# --- exceptions ----------------------------------------------------------------------------


def record_exception(
    s: Session, *, job_id: str, exception_name: str, stacktrace: str, execution_id: str | None = None,
    vertex_name: str | None = None, attempt: int | None = None, taskmanager_id: str | None = None,
    keep: int = 16,
) -> ExceptionRow:
    row = ExceptionRow(job_id=job_id, execution_id=execution_id, vertex_name=vertex_name, attempt=attempt,
                       taskmanager_id=taskmanager_id, exception_name=exception_name, stacktrace=stacktrace)
    s.add(row)
    s.flush()
    old = s.execute(select(ExceptionRow.id).where(ExceptionRow.job_id == job_id)
                    .order_by(ExceptionRow.id.desc()).offset(keep)).scalars().all()
    if old:
        s.execute(delete(ExceptionRow).where(ExceptionRow.id.in_(old)))
    return row


def job_exceptions(s: Session, job_id: str) -> Sequence[ExceptionRow]:
    return s.execute(select(ExceptionRow).where(ExceptionRow.job_id == job_id).order_by(ExceptionRow.id.desc())).scalars().all()


# --- TaskManagers --------------------------------------------------------------------------


def register_taskmanager(s: Session, *, id: str, host: str, queue: str, slots_total: int, slots_free: int,
                         cores: float, memory_bytes: int, allocations: list[dict]) -> TaskManagerRow:
    row = s.get(TaskManagerRow, id)
    now = utcnow()
    if row is None:
        row = TaskManagerRow(id=id, registered_at=now)
        s.add(row)
    row.host, row.queue, row.state = host, queue, "REGISTERED"
    row.slots_total, row.slots_free, row.cores, row.memory_bytes = slots_total, slots_free, cores, memory_bytes
    row.allocations, row.last_heartbeat, row.lost_reason = allocations, now, None
    s.flush()
    return row


def register_taskmanagers(s: Session, rows: list[dict]) -> None:
    """`register_taskmanager` for many at once: one SELECT, one bulk INSERT, one executemany
    UPDATE (10,000 TaskManagers registering after a ResourceManager restart cost 20,000 round
    trips one by one). Each row: the keyword arguments of register_taskmanager."""
    if not rows:
        return
    now = utcnow()
    ids = [r["id"] for r in rows]
    existing: set[str] = set()
    for i in range(0, len(ids), 1000):
        existing.update(s.execute(select(TaskManagerRow.id).where(TaskManagerRow.id.in_(ids[i:i + 1000]))).scalars())
    values = [dict(r, state="REGISTERED", last_heartbeat=now, lost_reason=None) for r in rows]
    new = [dict(v, registered_at=now) for v in values if v["id"] not in existing]
    old = [v for v in values if v["id"] in existing]
    if new:
        s.execute(insert(TaskManagerRow), new)
    if old:
        s.execute(update(TaskManagerRow), old)


def update_taskmanager_slots(s: Session, rows: list[dict]) -> None:
    """Free slot counts and allocations of many TaskManagers (keys: id, slots_free, allocations)
    in one executemany: when thousands of tasks start at once, an UPDATE statement each was half
    of the ResourceManager's time."""
    if rows:
        s.execute(update(TaskManagerRow), rows)


def touch_taskmanagers(s: Session, last_seen: dict[str, datetime]) -> None:
    """Heartbeat times of many TaskManagers in one executemany (an UPDATE each would cost
    thousands of round trips per second at scale)."""
    if last_seen:
        s.execute(update(TaskManagerRow), [{"id": tm_id, "last_heartbeat": at} for tm_id, at in last_seen.items()])


def mark_taskmanager_gone(s: Session, taskmanager_id: str, *, state: str, reason: str) -> None:
    s.execute(update(TaskManagerRow).where(TaskManagerRow.id == taskmanager_id)
              .values(state=state, lost_reason=reason, slots_free=0, allocations=[]))


def list_taskmanagers(s: Session, *, include_gone: bool = False) -> Sequence[TaskManagerRow]:
    q = select(TaskManagerRow).order_by(TaskManagerRow.id)
    if not include_gone:
        q = q.where(TaskManagerRow.state == "REGISTERED")
    return s.execute(q).scalars().all()


def get_taskmanager(s: Session, taskmanager_id: str) -> TaskManagerRow:
    row = s.get(TaskManagerRow, taskmanager_id)
    if row is None:
        raise NotFound(f"taskmanager {taskmanager_id} not found")
    return row


def add_outbox(s: Session, entries: list[dict]) -> None:
    """One bulk INSERT for every effect of a unit of work (keys: the OutboxEntry columns)."""
    if entries:
        s.execute(insert(OutboxEntry), entries)


def pending_outbox(s: Session, *, limit: int | None = 1000) -> Sequence[OutboxEntry]:
    return s.execute(select(OutboxEntry).order_by(OutboxEntry.seq).limit(limit)).scalars().all()


def delete_outbox(s: Session, ids: Iterable[str]) -> None:
    ids = list(ids)
    for i in range(0, len(ids), 1000):
        s.execute(delete(OutboxEntry).where(OutboxEntry.id.in_(ids[i:i + 1000])))


def execution_states(s: Session, execution_ids: Iterable[str]) -> dict[str, str]:
    ids = list(set(execution_ids))
    if not ids:
        return {}
    return dict(s.execute(select(Execution.id, Execution.state).where(Execution.id.in_(ids))).all())


def count_jobs_by_status(s: Session) -> dict[str, int]:
    return dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())


# --- checkpoints and savepoints --------------------------------------------------------------


def create_checkpoint(s: Session, *, job_id: str, checkpoint_id: int, kind: str, execution_id: str | None,
                      vertex_id: str | None, request_id: str | None = None, after: str = "continue",
                      path: str | None = None) -> CheckpointRow:
    row = CheckpointRow(job_id=job_id, checkpoint_id=checkpoint_id, kind=kind,
                        status=CheckpointStatus.IN_PROGRESS.value, execution_id=execution_id, vertex_id=vertex_id,
                        request_id=request_id, after=after, trigger_at=utcnow(), path=path, source_offsets=[])
    s.add(row)
    s.flush()
    return row


def get_checkpoint(s: Session, job_id: str, checkpoint_id: int, *, lock: bool = False) -> CheckpointRow:
    q = select(CheckpointRow).where(CheckpointRow.job_id == job_id, CheckpointRow.checkpoint_id == checkpoint_id)
    if lock:
        q = q.with_for_update()
    row = s.execute(q).scalar_one_or_none()
    if row is None:
        raise NotFound(f"checkpoint {checkpoint_id} of job {job_id} not found")
    return row


def list_checkpoints(s: Session, job_id: str, *, statuses: Iterable[CheckpointStatus] | None = None,
                     kind: str | None = None, newest_first: bool = True, limit: int | None = None
                     ) -> Sequence[CheckpointRow]:
    q = select(CheckpointRow).where(CheckpointRow.job_id == job_id)
    if statuses is not None:
        q = q.where(CheckpointRow.status.in_([st.value for st in statuses]))
    if kind is not None:
        q = q.where(CheckpointRow.kind == kind)
    order = CheckpointRow.checkpoint_id.desc() if newest_first else CheckpointRow.checkpoint_id
    q = q.order_by(order)
    if limit is not None:
        q = q.limit(limit)
    return s.execute(q).scalars().all()


def pending_checkpoints(s: Session) -> Sequence[CheckpointRow]:
    """Every IN_PROGRESS checkpoint of the cluster (a new leader adopts or fails them)."""
    return s.execute(select(CheckpointRow).where(CheckpointRow.status == CheckpointStatus.IN_PROGRESS.value)
                     ).scalars().all()


def transition_checkpoint(s: Session, row: CheckpointRow, target: CheckpointStatus, *,
                          failure_cause: str | None = None, path: str | None = None, batch_id: int | None = None,
                          state_size: int | None = None, duration_ms: int | None = None,
                          source_offsets: list | None = None) -> CheckpointRow:
    """The only function that changes `checkpoints.status`. Raises IllegalTransition."""
    current = CheckpointStatus(row.status)
    if current == target:
        return row
    check_checkpoint_transition(current, target)
    row.status = target.value
    if target == CheckpointStatus.COMPLETED:
        row.ack_at = utcnow()
    if failure_cause is not None:
        row.failure_cause = failure_cause[:20000]
    if path is not None:
        row.path = path
    if batch_id is not None:
        row.batch_id = batch_id
    if state_size is not None:
        row.state_size = state_size
    if duration_ms is not None:
        row.duration_ms = duration_ms
    if source_offsets is not None:
        row.source_offsets = list(source_offsets)
    return row


def set_checkpoint_failures(s: Session, job: Job, value: int) -> None:
    job.checkpoint_failures = value


def set_execution_restore(s: Session, execution: Execution, *, path: str | None, checkpoint_id: int | None) -> None:
    execution.restored_from = path
    execution.restored_checkpoint_id = checkpoint_id


def set_vertex_parallelism(s: Session, vertex: Vertex, parallelism: int) -> None:
    vertex.parallelism = parallelism


# --- asynchronous operations (savepoint, stop, checkpoint, dispose, rescale) -----------------


def create_operation(s: Session, *, id: str, kind: str, job_id: str | None, params: dict | None = None) -> Operation:
    row = Operation(id=id, kind=kind, job_id=job_id, status=OperationStatus.IN_PROGRESS.value,
                    params=dict(params or {}), created_at=utcnow())
    s.add(row)
    s.flush()
    return row


def get_operation(s: Session, operation_id: str, *, lock: bool = False) -> Operation:
    row = _get(s, Operation, operation_id, lock)
    if row is None:
        raise NotFound(f"operation {operation_id} not found")
    return row


def job_operations(s: Session, job_id: str, *, statuses: Iterable[OperationStatus] | None = None
                   ) -> Sequence[Operation]:
    q = select(Operation).where(Operation.job_id == job_id)
    if statuses is not None:
        q = q.where(Operation.status.in_([st.value for st in statuses]))
    return s.execute(q.order_by(Operation.created_at)).scalars().all()


def finish_operation(s: Session, op: Operation, status: OperationStatus, *, location: str | None = None,
                     failure_cause: str | None = None, checkpoint_id: int | None = None) -> Operation:
    """The only function that ends an operation; an operation ends once (later calls are no-ops)."""
    if op.status != OperationStatus.IN_PROGRESS.value:
        return op
    op.status = status.value
    op.done_at = utcnow()
    if location is not None:
        op.location = location
    if failure_cause is not None:
        op.failure_cause = failure_cause[:20000]
    if checkpoint_id is not None:
        op.checkpoint_id = checkpoint_id
    return op


def set_operation_checkpoint(s: Session, op: Operation, checkpoint_id: int) -> None:
    op.checkpoint_id = checkpoint_id


# --- schedules (scheduled submissions) -------------------------------------------------------
# The dispatcher creates, pauses and deletes schedules; only the leading JobManager's beat fires
# them (services/jobmanager/schedule_beat.py), in a unit of work fenced like any other.


def create_schedule(s: Session, **fields: Any) -> "Schedule":
    row = Schedule(created_at=utcnow(), **fields)
    s.add(row)
    s.flush()
    return row


def get_schedule(s: Session, schedule_id: str, *, lock: bool = False) -> "Schedule":
    q = select(Schedule).where(Schedule.id == schedule_id)
    if lock:
        q = q.with_for_update()
    row = s.execute(q).scalar_one_or_none()
    if row is None:
        raise NotFound(f"schedule {schedule_id} not found")
    return row


def list_schedules(s: Session) -> Sequence["Schedule"]:
    return s.execute(select(Schedule).order_by(Schedule.created_at, Schedule.id)).scalars().all()


def delete_schedule(s: Session, schedule_id: str) -> None:
    """The schedule goes; its runs and their jobs stay (history). A tick still queued will never
    run: it is recorded as skipped_deleted."""
    s.delete(get_schedule(s, schedule_id, lock=True))
    s.execute(update(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id, ScheduleRun.outcome == "queued")
              .values(outcome="skipped_deleted"))
    s.flush()


def set_schedule_enabled(s: Session, row: "Schedule", enabled: bool, next_fire_at: datetime | None) -> None:
    row.enabled = enabled
    row.next_fire_at = next_fire_at


def due_schedules(s: Session, now: datetime) -> Sequence["Schedule"]:
    """Enabled schedules whose next tick has come, locked (a dispatcher pausing one waits)."""
    q = (select(Schedule).where(Schedule.enabled.is_(True), Schedule.next_fire_at.is_not(None),
                                Schedule.next_fire_at <= now)
         .order_by(Schedule.next_fire_at).with_for_update())
    return s.execute(q).scalars().all()


def advance_schedule(s: Session, row: "Schedule", *, next_fire_at: datetime, fired_at: datetime | None) -> None:
    row.next_fire_at = next_fire_at
    if fired_at is not None:
        row.last_fire_at = fired_at


def record_schedule_run(s: Session, *, schedule_id: str, tick_at: datetime, outcome: str,
                        job_id: str | None = None) -> "ScheduleRun":
    """Flushed at once: a tick recorded already (UNIQUE(schedule_id, tick_at)) raises
    IntegrityError here, inside the caller's unit of work, which then commits nothing."""
    row = ScheduleRun(schedule_id=schedule_id, tick_at=tick_at, outcome=outcome, job_id=job_id, created_at=utcnow())
    s.add(row)
    s.flush()
    return row


def schedule_runs(s: Session, schedule_id: str, *, limit: int | None = 50) -> Sequence["ScheduleRun"]:
    q = select(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id).order_by(ScheduleRun.tick_at.desc())
    if limit is not None:
        q = q.limit(limit)
    return s.execute(q).scalars().all()


def schedule_run_counts(s: Session) -> dict[str, int]:
    return dict(s.execute(select(ScheduleRun.schedule_id, func.count()).group_by(ScheduleRun.schedule_id)).all())


def latest_schedule_runs(s: Session, schedule_ids: Iterable[str]) -> dict[str, "ScheduleRun"]:
    """schedule id -> its newest run (by tick)."""
    ids = list(schedule_ids)
    if not ids:
        return {}
    newest = (select(ScheduleRun.schedule_id, func.max(ScheduleRun.tick_at).label("tick"))
              .where(ScheduleRun.schedule_id.in_(ids)).group_by(ScheduleRun.schedule_id).subquery())
    rows = s.execute(select(ScheduleRun).join(newest, (ScheduleRun.schedule_id == newest.c.schedule_id)
                                              & (ScheduleRun.tick_at == newest.c.tick))).scalars().all()
    return {r.schedule_id: r for r in rows}


def last_schedule_job(s: Session, schedule_id: str) -> Job | None:
    """The job of the schedule's newest run that has one (the run an overlap policy looks at)."""
    job_id = s.execute(select(ScheduleRun.job_id).where(ScheduleRun.schedule_id == schedule_id,
                                                        ScheduleRun.job_id.is_not(None))
                       .order_by(ScheduleRun.tick_at.desc()).limit(1)).scalar_one_or_none()
    return get_job(s, job_id) if job_id is not None else None


def queued_schedule_runs(s: Session, schedule_id: str | None = None) -> Sequence["ScheduleRun"]:
    """Ticks waiting for their schedule's previous run to end (overlap policy `queue`)."""
    q = select(ScheduleRun).where(ScheduleRun.outcome == "queued").order_by(ScheduleRun.tick_at)
    if schedule_id is not None:
        q = q.where(ScheduleRun.schedule_id == schedule_id)
    return s.execute(q).scalars().all()


def set_schedule_run(s: Session, run: "ScheduleRun", *, outcome: str, job_id: str | None = None) -> None:
    run.outcome = outcome
    if job_id is not None:
        run.job_id = job_id


def create_scheduled_job(s: Session, schedule: "Schedule", job_id: str) -> Job:
    """A run of `schedule`: the job row POST /jars/{id}/run would insert from the same request
    (INITIALIZING, with its first transition), linked to its schedule."""
    job = create_job(s, id=job_id, name=schedule.name, artifact_id=schedule.artifact_id, entry=schedule.entry,
                     parallelism=schedule.parallelism, program_args=list(schedule.program_args or []),
                     config=dict(schedule.config or {}), restart_strategy=dict(schedule.restart_strategy or {}),
                     kind=schedule.kind)
    job.schedule_id = schedule.id
    return job


from shared.catalog.models import Schedule, ScheduleRun  # noqa: E402 - appended with this section


__all__ = [name for name in dir() if not name.startswith("_")] + ["IllegalTransition"]
