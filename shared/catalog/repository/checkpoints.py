"""Checkpoints and savepoints: creation, the one function that changes `checkpoints.status`
(`transition_checkpoint`), and the history."""

from __future__ import annotations

from typing import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.catalog.models import CheckpointRow, utcnow
from shared.catalog.repository.rows import NotFound
from shared.ids import ExecutionId, JobId, VertexId
from shared.states import CheckpointStatus, check_checkpoint_transition


def create_checkpoint(s: Session, *, job_id: JobId, checkpoint_id: int, kind: str, execution_id: ExecutionId | None,
                      vertex_id: VertexId | None, request_id: str | None = None, after: str = "continue",
                      path: str | None = None) -> CheckpointRow:
    row = CheckpointRow(job_id=job_id, checkpoint_id=checkpoint_id, kind=kind,
                        status=CheckpointStatus.IN_PROGRESS.value, execution_id=execution_id, vertex_id=vertex_id,
                        request_id=request_id, after=after, trigger_at=utcnow(), path=path, source_offsets=[])
    s.add(row)
    s.flush()
    return row


def get_checkpoint(s: Session, job_id: JobId, checkpoint_id: int, *, lock: bool = False) -> CheckpointRow:
    q = select(CheckpointRow).where(CheckpointRow.job_id == job_id, CheckpointRow.checkpoint_id == checkpoint_id)
    if lock:
        q = q.with_for_update()
    row = s.execute(q).scalar_one_or_none()
    if row is None:
        raise NotFound(f"checkpoint {checkpoint_id} of job {job_id} not found")
    return row


def list_checkpoints(s: Session, job_id: JobId, *, statuses: Iterable[CheckpointStatus] | None = None,
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
