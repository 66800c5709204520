"""Vertices and their executions (one per attempt): creation, the one function that changes
`executions.state` (`transition_execution`), progress, and where an attempt restores from."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Sequence

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from shared.catalog.models import Execution, Vertex, epoch_ms, utcnow
from shared.catalog.repository.rows import NotFound, get_row, table_of
from shared.ids import AllocationId, ExecutionId, JobId, TaskManagerId, VertexId
from shared.states import ExecutionState, check_execution_transition


def create_vertex(s: Session, *, id: VertexId, job_id: JobId, name: str, parallelism: int, idx: int = 0) -> Vertex:
    v = Vertex(id=id, job_id=job_id, name=name, parallelism=parallelism, idx=idx)
    s.add(v)
    return v


def add_scheduled_plans(s: Session, vertices: list[dict], executions: list[dict]) -> None:
    """Vertices and their first executions for many jobs, in two bulk INSERTs (Core: thousands
    of new ORM objects cost more to track than to write). Keys: a vertex's columns; an
    execution's id, job_id, vertex_id and attempt. Each execution is created and scheduled at
    once, as create_execution and transition_execution(SCHEDULED) would leave it."""
    if vertices:
        s.execute(insert(table_of(Vertex)), vertices)
    if executions:
        check_execution_transition(ExecutionState.CREATED, ExecutionState.SCHEDULED)
        now_ms = epoch_ms(utcnow())
        stamps = {ExecutionState.CREATED.value: now_ms, ExecutionState.SCHEDULED.value: now_ms}
        s.execute(
            insert(table_of(Execution)),
            [
                dict(e, state=ExecutionState.SCHEDULED.value, timestamps=stamps, slots=[], rows_processed=0)
                for e in executions
            ],
        )


def job_vertices(s: Session, job_id: JobId) -> Sequence[Vertex]:
    return s.execute(select(Vertex).where(Vertex.job_id == job_id).order_by(Vertex.idx)).scalars().all()


def set_vertex_parallelism(s: Session, vertex: Vertex, parallelism: int) -> None:
    vertex.parallelism = parallelism


def create_execution(
    s: Session, *, id: ExecutionId, job_id: JobId, vertex_id: VertexId, attempt: int, keep_history: int = 16
) -> Execution:
    now_ms = epoch_ms(utcnow())
    ex = Execution(
        id=id,
        job_id=job_id,
        vertex_id=vertex_id,
        attempt=attempt,
        state=ExecutionState.CREATED.value,
        timestamps={"CREATED": now_ms},
        slots=[],
    )
    s.add(ex)
    # Flink keeps the last 16 prior attempts of each subtask; older terminal ones are pruned.
    cutoff = attempt - keep_history
    if cutoff >= 0:
        s.execute(delete(Execution).where(Execution.vertex_id == vertex_id, Execution.attempt <= cutoff))
    return ex


def get_execution(s: Session, execution_id: ExecutionId, *, lock: bool = False) -> Execution:
    ex = get_row(s, Execution, execution_id, lock)
    if ex is None:
        raise NotFound(f"execution {execution_id} not found")
    return ex


def vertex_executions(s: Session, vertex_id: VertexId) -> Sequence[Execution]:
    return (
        s.execute(select(Execution).where(Execution.vertex_id == vertex_id).order_by(Execution.attempt)).scalars().all()
    )


def job_executions(s: Session, job_id: JobId) -> Sequence[Execution]:
    return s.execute(select(Execution).where(Execution.job_id == job_id).order_by(Execution.attempt)).scalars().all()


def latest_executions(s: Session, job_id: JobId) -> dict[VertexId, Execution]:
    """vertex id -> its current (highest) attempt."""
    out: dict[VertexId, Execution] = {}
    for ex in job_executions(s, job_id):
        out[ex.vertex_id] = ex
    return out


def live_executions_on(s: Session, taskmanager_id: TaskManagerId) -> Sequence[Execution]:
    return live_executions_on_any(s, [taskmanager_id])


def live_executions_on_any(s: Session, taskmanager_ids: Sequence[TaskManagerId]) -> list[Execution]:
    terminal = [e.value for e in ExecutionState if e.is_terminal]
    out: list[Execution] = []
    ids = list(dict.fromkeys(taskmanager_ids))
    for i in range(0, len(ids), 1000):
        out.extend(
            s.execute(
                select(Execution).where(
                    Execution.taskmanager_id.in_(ids[i : i + 1000]), Execution.state.not_in(terminal)
                )
            ).scalars()
        )
    return out


def live_placements(s: Session, allocation_ids: Iterable[AllocationId]) -> dict[AllocationId, TaskManagerId]:
    """allocation id -> the TaskManager a live attempt holding it is placed on (ids no live attempt
    holds are left out): what a TaskManager's claim to an allocation is checked against."""
    live = [e.value for e in ExecutionState if not e.is_terminal]
    ids = list(set(allocation_ids))
    out: dict[AllocationId, TaskManagerId] = {}
    for i in range(0, len(ids), 1000):
        rows = s.execute(
            select(Execution.allocation_id, Execution.taskmanager_id).where(
                Execution.state.in_(live), Execution.allocation_id.in_(ids[i : i + 1000])
            )
        )
        out.update({a: tm for a, tm in rows if a is not None and tm is not None})
    return out


def execution_states(s: Session, execution_ids: Iterable[ExecutionId]) -> dict[ExecutionId, str]:
    ids = list(set(execution_ids))
    if not ids:
        return {}
    return dict(s.execute(select(Execution.id, Execution.state).where(Execution.id.in_(ids))).all())


def transition_execution(
    s: Session,
    execution_id: ExecutionId | Execution,
    target: ExecutionState,
    *,
    at_ms: int | None = None,
    taskmanager_id: TaskManagerId | None = None,
    allocation_id: AllocationId | None = None,
    slots: list[int] | None = None,
    failure_cause: str | None = None,
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


def set_execution_waiting_reason(s: Session, execution: ExecutionId | Execution, reason: str | None) -> None:
    if isinstance(execution, Execution):
        execution.waiting_reason = reason
        return
    s.execute(update(Execution).where(Execution.id == execution).values(waiting_reason=reason))


def record_progress(s: Session, execution_id: ExecutionId, *, batch_id: int, rows: int) -> None:
    """Count a committed batch once: a redelivered report (same batch id) or one overtaken by a
    later batch changes nothing."""
    s.execute(
        update(Execution)
        .where(Execution.id == execution_id, (Execution.last_batch_id.is_(None)) | (Execution.last_batch_id < batch_id))
        .values(last_batch_id=batch_id, rows_processed=Execution.rows_processed + rows)
    )


def set_execution_restore(s: Session, execution: Execution, *, path: str | None, checkpoint_id: int | None) -> None:
    execution.restored_from = path
    execution.restored_checkpoint_id = checkpoint_id


def find_execution(s: Session, execution_id: ExecutionId) -> Execution | None:
    """The attempt, or None; from the session without SQL when it holds it already (`Session.get`)."""
    return s.get(Execution, execution_id)


def find_vertex(s: Session, vertex_id: VertexId) -> Vertex | None:
    """The vertex, or None; from the session without SQL when it holds it already (`Session.get`)."""
    return s.get(Vertex, vertex_id)


def vertices_of_jobs(s: Session, job_ids: Iterable[JobId]) -> Sequence[Vertex]:
    return s.execute(select(Vertex).where(Vertex.job_id.in_(list(job_ids)))).scalars().all()


def executions_in_states(s: Session, states: Iterable[ExecutionState]) -> Sequence[Execution]:
    """Every attempt of the cluster in one of these states."""
    return s.execute(select(Execution).where(Execution.state.in_([st.value for st in states]))).scalars().all()


def allocation_holder_states(s: Session, allocation_id: AllocationId) -> Sequence[str]:
    """The states of the attempts placed on this allocation (slots)."""
    return s.execute(select(Execution.state).where(Execution.allocation_id == allocation_id)).scalars().all()


def failed_executions_since(s: Session, job_id: JobId, since: datetime) -> Sequence[Execution]:
    """The job's FAILED attempts that ended at or after `since`, the newest first."""
    return (
        s.execute(
            select(Execution)
            .where(
                Execution.job_id == job_id, Execution.state == ExecutionState.FAILED.value, Execution.end_at >= since
            )
            .order_by(Execution.end_at.desc())
        )
        .scalars()
        .all()
    )


def vertex_ids_by_job(s: Session) -> Sequence[Any]:
    """(id, job_id) of every vertex, by job and then in the job's order."""
    return s.execute(select(Vertex.id, Vertex.job_id).order_by(Vertex.job_id, Vertex.idx)).all()


def latest_attempt_states(s: Session) -> Sequence[Any]:
    """(vertex_id, state, waiting_reason, attempt) of every vertex's newest attempt."""
    newest = (
        select(Execution.vertex_id, func.max(Execution.attempt).label("attempt"))
        .group_by(Execution.vertex_id)
        .subquery()
    )
    return s.execute(
        select(Execution.vertex_id, Execution.state, Execution.waiting_reason, Execution.attempt).join(
            newest, (Execution.vertex_id == newest.c.vertex_id) & (Execution.attempt == newest.c.attempt)
        )
    ).all()


def count_executions_by_state(s: Session) -> dict[str, int]:
    return dict(s.execute(select(Execution.state, func.count()).group_by(Execution.state)).all())


def count_restarted_attempts(s: Session) -> int:
    """Attempts beyond each task's first."""
    return s.scalar(select(func.count()).select_from(Execution).where(Execution.attempt > 0)) or 0
