"""Asynchronous operations (savepoint, stop, checkpoint, dispose, rescale): the status resources
of Flink's API, each ended once."""

from __future__ import annotations

from typing import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.catalog.models import Operation, utcnow
from shared.catalog.repository.rows import NotFound, get_row
from shared.ids import JobId
from shared.states import OperationStatus


def create_operation(s: Session, *, id: str, kind: str, job_id: JobId | None, params: dict | None = None) -> Operation:
    row = Operation(
        id=id,
        kind=kind,
        job_id=job_id,
        status=OperationStatus.IN_PROGRESS.value,
        params=dict(params or {}),
        created_at=utcnow(),
    )
    s.add(row)
    s.flush()
    return row


def get_operation(s: Session, operation_id: str, *, lock: bool = False) -> Operation:
    row = get_row(s, Operation, operation_id, lock)
    if row is None:
        raise NotFound(f"operation {operation_id} not found")
    return row


def job_operations(
    s: Session, job_id: JobId, *, statuses: Iterable[OperationStatus] | None = None
) -> Sequence[Operation]:
    q = select(Operation).where(Operation.job_id == job_id)
    if statuses is not None:
        q = q.where(Operation.status.in_([st.value for st in statuses]))
    return s.execute(q.order_by(Operation.created_at)).scalars().all()


def in_progress_operations(s: Session) -> Sequence[Operation]:
    """Every operation not ended yet, of any job (a new JobManager leader resumes their waits)."""
    q = select(Operation).where(Operation.status == OperationStatus.IN_PROGRESS.value)
    return s.execute(q.order_by(Operation.created_at)).scalars().all()


def finish_operation(
    s: Session,
    op: Operation,
    status: OperationStatus,
    *,
    location: str | None = None,
    failure_cause: str | None = None,
    checkpoint_id: int | None = None,
) -> Operation:
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
