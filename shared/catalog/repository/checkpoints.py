"""Checkpoints and savepoints: creation, the one function that changes `checkpoints.status`
(`transition_checkpoint`), and the history."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Collection, Iterable, Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shared.catalog.models import CheckpointRow, Job, utcnow
from shared.catalog.repository.rows import NotFound
from shared.ids import ExecutionId, JobId, VertexId
from shared.states import CheckpointStatus, JobStatus, check_checkpoint_transition


def create_checkpoint(
    s: Session,
    *,
    job_id: JobId,
    checkpoint_id: int,
    kind: str,
    execution_id: ExecutionId | None,
    vertex_id: VertexId | None,
    request_id: str | None = None,
    after: str = "continue",
    path: str | None = None,
) -> CheckpointRow:
    row = CheckpointRow(
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        kind=kind,
        status=CheckpointStatus.IN_PROGRESS.value,
        execution_id=execution_id,
        vertex_id=vertex_id,
        request_id=request_id,
        after=after,
        trigger_at=utcnow(),
        path=path,
        source_offsets=[],
    )
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


def list_checkpoints(
    s: Session,
    job_id: JobId,
    *,
    statuses: Iterable[CheckpointStatus] | None = None,
    kind: str | None = None,
    newest_first: bool = True,
    limit: int | None = None,
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
    return (
        s.execute(select(CheckpointRow).where(CheckpointRow.status == CheckpointStatus.IN_PROGRESS.value))
        .scalars()
        .all()
    )


def transition_checkpoint(
    s: Session,
    row: CheckpointRow,
    target: CheckpointStatus,
    *,
    failure_cause: str | None = None,
    path: str | None = None,
    batch_id: int | None = None,
    state_size: int | None = None,
    duration_ms: int | None = None,
    source_offsets: list | None = None,
) -> CheckpointRow:
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


# --- reads of many jobs' snapshots ---------------------------------------------------------------

_COMPLETED = CheckpointStatus.COMPLETED.value
CHUNK = 1000  # job ids per IN list


def completed_checkpoints_of(s: Session, job_ids: Sequence[JobId]) -> list[CheckpointRow]:
    """The COMPLETED checkpoints of these jobs, in no particular order (one query per CHUNK jobs)."""
    out: list[CheckpointRow] = []
    for i in range(0, len(job_ids), CHUNK):
        out.extend(
            s.execute(
                select(CheckpointRow).where(
                    CheckpointRow.job_id.in_(job_ids[i : i + CHUNK]), CheckpointRow.status == _COMPLETED
                )
            ).scalars()
        )
    return out


def completed_pointer_rows(s: Session, job_ids: Sequence[JobId]) -> list[Any]:
    """(job_id, checkpoint_id, path, kind, batch_id) of these jobs' COMPLETED checkpoints, in no
    particular order (one query per CHUNK jobs)."""
    out: list[Any] = []
    for i in range(0, len(job_ids), CHUNK):
        out.extend(
            s.execute(
                select(
                    CheckpointRow.job_id,
                    CheckpointRow.checkpoint_id,
                    CheckpointRow.path,
                    CheckpointRow.kind,
                    CheckpointRow.batch_id,
                ).where(CheckpointRow.job_id.in_(job_ids[i : i + CHUNK]), CheckpointRow.status == _COMPLETED)
            ).all()
        )
    return out


def max_checkpoint_id(s: Session, job_id: JobId) -> int:
    """The highest checkpoint id the job used, in any status (0: none yet)."""
    return s.execute(select(func.max(CheckpointRow.checkpoint_id)).where(CheckpointRow.job_id == job_id)).scalar() or 0


def count_job_checkpoints_by_status(s: Session, job_id: JobId) -> dict[str, int]:
    return dict(
        s.execute(
            select(CheckpointRow.status, func.count())
            .where(CheckpointRow.job_id == job_id)
            .group_by(CheckpointRow.status)
        ).all()
    )


def newest_snapshot_path(s: Session, job_id: JobId) -> str | None:
    """The path of the job's newest COMPLETED checkpoint or savepoint that has one."""
    return s.execute(
        select(CheckpointRow.path)
        .where(CheckpointRow.job_id == job_id, CheckpointRow.status == _COMPLETED, CheckpointRow.path.is_not(None))
        .order_by(CheckpointRow.checkpoint_id.desc())
        .limit(1)
    ).scalar()


def newest_checkpoint_ack(s: Session, job_id: JobId) -> datetime | None:
    """When the job's newest COMPLETED checkpoint of a running attempt (not a disposal's record)
    was acknowledged."""
    return s.execute(
        select(func.max(CheckpointRow.ack_at)).where(
            CheckpointRow.job_id == job_id, CheckpointRow.status == _COMPLETED, CheckpointRow.execution_id.is_not(None)
        )
    ).scalar()


# --- snapshots by path ------------------------------------------------------------------------------


def snapshot_owner(s: Session, paths: Collection[str], *, other_than: JobId) -> JobId | None:
    """The job, other than `other_than`, whose checkpoint recorded at one of `paths` was
    triggered first (any status), or None."""
    q = (
        select(CheckpointRow.job_id)
        .where(CheckpointRow.path.in_(paths), CheckpointRow.job_id != other_than)
        .order_by(CheckpointRow.trigger_at)
        .limit(1)
    )
    return s.execute(q).scalar()


def is_completed_snapshot(s: Session, paths: Collection[str]) -> bool:
    """Whether a COMPLETED checkpoint or savepoint is recorded at one of `paths`."""
    return (
        s.execute(
            select(CheckpointRow.job_id)
            .where(CheckpointRow.path.in_(paths), CheckpointRow.status == _COMPLETED)
            .limit(1)
        ).first()
        is not None
    )


def lock_completed_snapshots(s: Session, paths: Collection[str]) -> Sequence[CheckpointRow]:
    """The COMPLETED checkpoints recorded at one of `paths`, locked (SELECT ... FOR UPDATE)."""
    return (
        s.execute(
            select(CheckpointRow)
            .where(CheckpointRow.path.in_(paths), CheckpointRow.status == _COMPLETED)
            .with_for_update()
        )
        .scalars()
        .all()
    )


# --- cluster-wide figures (GET /metrics) -----------------------------------------------------------


def count_checkpoints_by_kind_and_status(s: Session) -> Sequence[Any]:
    """(kind, status, count) of every checkpoint and savepoint."""
    return s.execute(
        select(CheckpointRow.kind, CheckpointRow.status, func.count()).group_by(
            CheckpointRow.kind, CheckpointRow.status
        )
    ).all()


def completed_durations_by_kind(s: Session) -> Sequence[Any]:
    """(kind, how many have a duration, the sum of their durations in ms) of COMPLETED ones."""
    return s.execute(
        select(
            CheckpointRow.kind,
            func.count(CheckpointRow.duration_ms),
            func.coalesce(func.sum(CheckpointRow.duration_ms), 0),
        )
        .where(CheckpointRow.status == _COMPLETED)
        .group_by(CheckpointRow.kind)
    ).all()


def newest_completed_of_running_jobs(s: Session) -> Sequence[Any]:
    """(job_id, duration_ms, state_size) of each RUNNING job's newest COMPLETED checkpoint."""
    newest = (
        select(CheckpointRow.job_id, func.max(CheckpointRow.checkpoint_id).label("cid"))
        .join(Job, Job.id == CheckpointRow.job_id)
        .where(Job.status == JobStatus.RUNNING.value, CheckpointRow.status == _COMPLETED)
        .group_by(CheckpointRow.job_id)
        .subquery()
    )
    return s.execute(
        select(CheckpointRow.job_id, CheckpointRow.duration_ms, CheckpointRow.state_size).join(
            newest, (newest.c.job_id == CheckpointRow.job_id) & (newest.c.cid == CheckpointRow.checkpoint_id)
        )
    ).all()
