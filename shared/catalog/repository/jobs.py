"""Jobs: creation, the one function that changes `jobs.status` (`transition_job`), their
transition history, exceptions, restart and checkpoint-failure counters."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from shared.catalog.models import ExceptionRow, Job, JobTransition, epoch_ms, utcnow
from shared.catalog.repository.rows import NotFound, StaleEpoch, get_row, next_value, table_of
from shared.ids import ArtifactId, ExecutionId, JobId, TaskManagerId
from shared.states import JobStatus, check_job_transition


def create_job(
    s: Session,
    *,
    id: JobId,
    name: str,
    artifact_id: ArtifactId | None,
    entry: str,
    parallelism: int,
    program_args: list[str],
    config: dict[str, Any],
    restart_strategy: dict[str, Any],
    kind: str = "pyspark",
) -> Job:
    now = utcnow()
    job = Job(
        id=id,
        seq=next_value(s, "job"),
        name=name,
        artifact_id=artifact_id,
        entry=entry,
        parallelism=parallelism,
        program_args=list(program_args),
        config=dict(config),
        restart_strategy=dict(restart_strategy),
        kind=kind,
        status=JobStatus.INITIALIZING.value,
        created_at=now,
        updated_at=now,
    )
    s.add(job)
    s.add(JobTransition(job_id=id, from_status=None, to_status=JobStatus.INITIALIZING.value, at=now))
    s.flush()
    return job


def get_job(s: Session, job_id: JobId, *, lock: bool = False) -> Job:
    row = get_row(s, Job, job_id, lock)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    return row


def list_jobs(s: Session, *, statuses: Iterable[JobStatus] | None = None) -> Sequence[Job]:
    q = select(Job).order_by(Job.seq)
    if statuses is not None:
        q = q.where(Job.status.in_([st.value for st in statuses]))
    return s.execute(q).scalars().all()


def transition_job(
    s: Session,
    job_id: JobId | Job,
    target: JobStatus,
    *,
    epoch: int | None = None,
    reason: str | None = None,
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
        s.execute(insert(table_of(JobTransition)), rows)


def set_job_waiting_reason(s: Session, job: JobId | Job, reason: str | None) -> None:
    if isinstance(job, Job):
        if job.waiting_reason != reason:
            job.waiting_reason = reason
        return
    s.execute(update(Job).where(Job.id == job).values(waiting_reason=reason))


def job_transitions(s: Session, job_id: JobId) -> Sequence[JobTransition]:
    return (
        s.execute(select(JobTransition).where(JobTransition.job_id == job_id).order_by(JobTransition.id))
        .scalars()
        .all()
    )


def job_state_timestamps(s: Session, job_id: JobId) -> dict[str, int]:
    """Flink's `timestamps` map: the last time the job entered each state, in epoch ms."""
    return {t.to_status: epoch_ms(t.at) for t in job_transitions(s, job_id)}


def count_jobs_by_status(s: Session) -> dict[str, int]:
    return dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())


def set_restart_state(s: Session, job: Job, state: dict) -> None:
    job.restart_state = state


def set_checkpoint_failures(s: Session, job: Job, value: int) -> None:
    job.checkpoint_failures = value


def record_exception(
    s: Session,
    *,
    job_id: JobId,
    exception_name: str,
    stacktrace: str,
    execution_id: ExecutionId | None = None,
    vertex_name: str | None = None,
    attempt: int | None = None,
    taskmanager_id: TaskManagerId | None = None,
    keep: int = 16,
) -> ExceptionRow:
    row = ExceptionRow(
        job_id=job_id,
        execution_id=execution_id,
        vertex_name=vertex_name,
        attempt=attempt,
        taskmanager_id=taskmanager_id,
        exception_name=exception_name,
        stacktrace=stacktrace,
    )
    s.add(row)
    s.flush()
    old = (
        s.execute(
            select(ExceptionRow.id).where(ExceptionRow.job_id == job_id).order_by(ExceptionRow.id.desc()).offset(keep)
        )
        .scalars()
        .all()
    )
    if old:
        s.execute(delete(ExceptionRow).where(ExceptionRow.id.in_(old)))
    return row


def job_exceptions(s: Session, job_id: JobId) -> Sequence[ExceptionRow]:
    return (
        s.execute(select(ExceptionRow).where(ExceptionRow.job_id == job_id).order_by(ExceptionRow.id.desc()))
        .scalars()
        .all()
    )


def find_job(s: Session, job_id: JobId) -> Job | None:
    """The job, or None; from the session without SQL when it holds it already (`Session.get`)."""
    return s.get(Job, job_id)


def newest_job_epoch(s: Session) -> int:
    """The newest leader epoch that wrote any job (0 with no job)."""
    return int(s.execute(select(func.coalesce(func.max(Job.epoch), 0))).scalar_one())


def job_statuses(s: Session, job_ids: Iterable[JobId]) -> dict[str, str]:
    """The status of each of these jobs that exists (no query for none)."""
    ids = list(job_ids)
    if not ids:
        return {}
    return dict(s.execute(select(Job.id, Job.status).where(Job.id.in_(ids))).all())


def job_overview_rows(s: Session, config_key: str) -> Sequence[Any]:
    """Every job, newest first, with only the columns GET /jobs/overview reads, and of its
    configuration only `config_key` (extracted by the database): (id, name, status, created_at,
    end_at, updated_at, config value, waiting_reason, parallelism, deployment)."""
    return s.execute(
        select(
            Job.id,
            Job.name,
            Job.status,
            Job.created_at,
            Job.end_at,
            Job.updated_at,
            Job.config[config_key].as_string(),
            Job.waiting_reason,
            Job.parallelism,
            Job.deployment,
        ).order_by(Job.seq.desc())
    ).all()


def count_transitions_to(s: Session, status: JobStatus) -> int:
    """How many times any job entered `status` (its transition history)."""
    return s.scalar(select(func.count()).select_from(JobTransition).where(JobTransition.to_status == status.value)) or 0


def newest_exception(s: Session, job_id: JobId) -> ExceptionRow | None:
    return (
        s.execute(select(ExceptionRow).where(ExceptionRow.job_id == job_id).order_by(ExceptionRow.id.desc()).limit(1))
        .scalars()
        .first()
    )
