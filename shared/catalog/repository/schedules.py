"""Schedules (scheduled submissions) and their runs. The dispatcher creates, pauses and deletes
schedules; only the leading JobManager's beat fires them (services/jobmanager/schedule_beat.py),
in a unit of work fenced like any other."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Sequence

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from shared.catalog.models import Job, Schedule, ScheduleRun, utcnow
from shared.catalog.repository.jobs import create_job, get_job
from shared.catalog.repository.rows import NotFound
from shared.ids import JobId


def create_schedule(s: Session, **fields: Any) -> Schedule:
    row = Schedule(created_at=utcnow(), **fields)
    s.add(row)
    s.flush()
    return row


def get_schedule(s: Session, schedule_id: str, *, lock: bool = False) -> Schedule:
    q = select(Schedule).where(Schedule.id == schedule_id)
    if lock:
        q = q.with_for_update()
    row = s.execute(q).scalar_one_or_none()
    if row is None:
        raise NotFound(f"schedule {schedule_id} not found")
    return row


def list_schedules(s: Session) -> Sequence[Schedule]:
    return s.execute(select(Schedule).order_by(Schedule.created_at, Schedule.id)).scalars().all()


def delete_schedule(s: Session, schedule_id: str) -> None:
    """The schedule goes; its runs and their jobs stay (history). A tick still queued will never
    run: it is recorded as skipped_deleted."""
    s.delete(get_schedule(s, schedule_id, lock=True))
    s.execute(
        update(ScheduleRun)
        .where(ScheduleRun.schedule_id == schedule_id, ScheduleRun.outcome == "queued")
        .values(outcome="skipped_deleted")
    )
    s.flush()


def set_schedule_enabled(s: Session, row: Schedule, enabled: bool, next_fire_at: datetime | None) -> None:
    row.enabled = enabled
    row.next_fire_at = next_fire_at


def due_schedules(s: Session, now: datetime) -> Sequence[Schedule]:
    """Enabled schedules whose next tick has come, locked (a dispatcher pausing one waits)."""
    q = (
        select(Schedule)
        .where(Schedule.enabled.is_(True), Schedule.next_fire_at.is_not(None), Schedule.next_fire_at <= now)
        .order_by(Schedule.next_fire_at)
        .with_for_update()
    )
    return s.execute(q).scalars().all()


def advance_schedule(s: Session, row: Schedule, *, next_fire_at: datetime, fired_at: datetime | None) -> None:
    row.next_fire_at = next_fire_at
    if fired_at is not None:
        row.last_fire_at = fired_at


def record_schedule_run(
    s: Session, *, schedule_id: str, tick_at: datetime, outcome: str, job_id: JobId | None = None
) -> ScheduleRun:
    """Flushed at once: a tick recorded already (UNIQUE(schedule_id, tick_at)) raises
    IntegrityError here, inside the caller's unit of work, which then commits nothing."""
    row = ScheduleRun(schedule_id=schedule_id, tick_at=tick_at, outcome=outcome, job_id=job_id, created_at=utcnow())
    s.add(row)
    s.flush()
    return row


def schedule_runs(s: Session, schedule_id: str, *, limit: int | None = 50) -> Sequence[ScheduleRun]:
    q = select(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id).order_by(ScheduleRun.tick_at.desc())
    if limit is not None:
        q = q.limit(limit)
    return s.execute(q).scalars().all()


def schedule_run_counts(s: Session) -> dict[str, int]:
    return dict(s.execute(select(ScheduleRun.schedule_id, func.count()).group_by(ScheduleRun.schedule_id)).all())


def latest_schedule_runs(s: Session, schedule_ids: Iterable[str]) -> dict[str, ScheduleRun]:
    """schedule id -> its newest run (by tick)."""
    ids = list(schedule_ids)
    if not ids:
        return {}
    newest = (
        select(ScheduleRun.schedule_id, func.max(ScheduleRun.tick_at).label("tick"))
        .where(ScheduleRun.schedule_id.in_(ids))
        .group_by(ScheduleRun.schedule_id)
        .subquery()
    )
    rows = (
        s.execute(
            select(ScheduleRun).join(
                newest, (ScheduleRun.schedule_id == newest.c.schedule_id) & (ScheduleRun.tick_at == newest.c.tick)
            )
        )
        .scalars()
        .all()
    )
    return {r.schedule_id: r for r in rows}


def last_schedule_job(s: Session, schedule_id: str) -> Job | None:
    """The job of the schedule's newest run that has one (the run an overlap policy looks at)."""
    job_id = s.execute(
        select(ScheduleRun.job_id)
        .where(ScheduleRun.schedule_id == schedule_id, ScheduleRun.job_id.is_not(None))
        .order_by(ScheduleRun.tick_at.desc())
        .limit(1)
    ).scalar_one_or_none()
    return get_job(s, job_id) if job_id is not None else None


def queued_schedule_runs(s: Session, schedule_id: str | None = None) -> Sequence[ScheduleRun]:
    """Ticks waiting for their schedule's previous run to end (overlap policy `queue`)."""
    q = select(ScheduleRun).where(ScheduleRun.outcome == "queued").order_by(ScheduleRun.tick_at)
    if schedule_id is not None:
        q = q.where(ScheduleRun.schedule_id == schedule_id)
    return s.execute(q).scalars().all()


def set_schedule_run(s: Session, run: ScheduleRun, *, outcome: str, job_id: JobId | None = None) -> None:
    run.outcome = outcome
    if job_id is not None:
        run.job_id = job_id


def create_scheduled_job(s: Session, schedule: Schedule, job_id: JobId) -> Job:
    """A run of `schedule`: the job row POST /jars/{id}/run would insert from the same request
    (INITIALIZING, with its first transition), linked to its schedule."""
    job = create_job(
        s,
        id=job_id,
        name=schedule.name,
        artifact_id=schedule.artifact_id,
        entry=schedule.entry,
        parallelism=schedule.parallelism,
        program_args=list(schedule.program_args or []),
        config=dict(schedule.config or {}),
        restart_strategy=dict(schedule.restart_strategy or {}),
        kind=schedule.kind,
    )
    job.schedule_id = schedule.id
    return job


def due_schedule_ids(s: Session, now: datetime) -> list[str]:
    """The ids of the enabled schedules whose next tick has come, unlocked (`due_schedules` locks)."""
    return [
        row.id
        for row in s.execute(
            select(Schedule.id).where(
                Schedule.enabled.is_(True), Schedule.next_fire_at.is_not(None), Schedule.next_fire_at <= now
            )
        ).all()
    ]
