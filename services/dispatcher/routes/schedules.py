"""/jobs/schedules: scheduled submissions (create, list, inspect, pause/resume, delete).

The dispatcher only writes the schedule; the leading JobManager's beat fires it
(services/jobmanager/schedule_beat.py), each tick a normal job in the catalog linked to its
schedule. Registered before the /jobs router, so /jobs/schedules is not read as a job id."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Body, Request

from services.dispatcher.deps import ArtifactLimitsDep, CatalogDep, DefaultRestartDep, NowMsDep, SessionDep, SettingsDep
from services.dispatcher.errors import ApiError, error_responses
from services.dispatcher.guards import redaction
from services.dispatcher.schemas.schedules import (
    ScheduleCreated,
    ScheduleCreateRequest,
    ScheduleDetail,
    ScheduleList,
    ScheduleUpdateRequest,
)
from services.dispatcher.submission import artifacts, checkpoint_dir_option
from services.dispatcher.submission.submitter import check_config, check_entry, resolve_restart_strategy, unknown_jar
from shared import schedules as sch
from shared.catalog import repository
from shared.catalog.models import Schedule, epoch_ms
from shared.catalog.repository import NotFound
from shared.ids import ArtifactId

log = logging.getLogger(__name__)
router = APIRouter(prefix="/jobs/schedules", tags=["schedules"])
_ERRORS = error_responses(400, 404, described={503: "the catalog is unreachable; retry after Retry-After seconds"})
HISTORY = 50


def _unknown_schedule(schedule_id: str) -> ApiError:
    return ApiError.of(
        404,
        f"schedule {schedule_id} not found",
        field="scheduleid",
        expected="the id of a schedule",
        hint="GET /jobs/schedules lists the schedules",
        prefix=False,
    )


def _timing(req: ScheduleCreateRequest) -> sch.Timing:
    if (req.cron is None) == (req.everySeconds is None):
        raise ApiError.of(
            400,
            "give exactly one of cron and everySeconds",
            field="cron",
            expected="a cron expression or an interval in seconds, not both, not neither",
            hint=f'for example "cron": "{sch.CRON_EXAMPLE.split("  ")[0]}" or "everySeconds": 30',
        )
    if req.cron is not None:
        try:
            sch.parse_cron(req.cron)
        except sch.CronError as exc:
            raise ApiError.of(
                400,
                f"cron expression {req.cron[:80]!r} {exc}",
                field="cron",
                expected="5 fields: minute hour day-of-month month day-of-week (UTC)",
                got=req.cron[:80],
                hint=f"for example {sch.CRON_EXAMPLE}",
                prefix=False,
            ) from None
        return sch.Timing(cron=" ".join(req.cron.split()))
    return sch.Timing(every_s=req.everySeconds)


def _at(now_ms: int) -> datetime:
    return datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc)


def _ms(dt: datetime | None) -> int | None:
    return None if dt is None else epoch_ms(dt)


def _view(s, row: Schedule, counts: dict[str, int], latest: dict) -> dict:
    last_job = repository.last_schedule_job(s, row.id)
    newest = latest.get(row.id)
    return {
        "id": row.id,
        "name": row.name,
        "jarId": row.artifact_id,
        "entryClass": row.entry,
        "kind": row.kind,
        "parallelism": row.parallelism,
        "programArgs": list(row.program_args or []),
        "cron": row.cron,
        "everySeconds": row.every_s,
        "overlap": row.overlap,
        "misfireGraceSeconds": row.misfire_grace_s,
        "enabled": row.enabled,
        "createdAt": epoch_ms(row.created_at),
        "nextFire": _ms(row.next_fire_at) if row.enabled else None,
        "lastFire": _ms(row.last_fire_at),
        "lastJobId": last_job.id if last_job is not None else None,
        "lastOutcome": newest.outcome if newest is not None else None,
        "runs": counts.get(row.id, 0),
    }


def _detail(s, row: Schedule) -> dict:
    out = _view(s, row, repository.schedule_run_counts(s), repository.latest_schedule_runs(s, [row.id]))
    out["history"] = [
        {"tick": epoch_ms(r.tick_at), "jobId": r.job_id, "outcome": r.outcome, "time": epoch_ms(r.created_at)}
        for r in repository.schedule_runs(s, row.id, limit=HISTORY)
    ]
    return out


@router.post(
    "",
    status_code=201,
    response_model=ScheduleCreated,
    responses=_ERRORS,
    summary="Create a schedule: run a jar on a cron expression or every N seconds",
)
def create_schedule(
    req: Annotated[ScheduleCreateRequest, Body()],
    catalog: CatalogDep,
    default_restart: DefaultRestartDep,
    now_ms: NowMsDep,
    bounds: ArtifactLimitsDep,
    settings: SettingsDep,
) -> dict:
    timing = _timing(req)
    config = dict(req.config or {})
    check_config(config, settings)
    checkpoint_dir_option.check(config, settings)
    restart = resolve_restart_strategy(req.restartStrategy, config, default_restart)
    kind = req.kind or "pyspark"
    entry = req.entryClass or artifacts.DEFAULT_ENTRY
    # null is the default, as if the field were absent
    overlap = req.overlap or "skip"
    grace = sch.DEFAULT_MISFIRE_GRACE_S if req.misfireGraceSeconds is None else req.misfireGraceSeconds
    enabled = req.enabled is not False
    with catalog.session() as s:
        try:
            art = repository.get_artifact(s, ArtifactId(req.jarId))
        except NotFound:
            raise unknown_jar(req.jarId) from None
    if kind == "pyspark":
        check_entry(catalog, art, entry, config, bounds)
    schedule_id = sch.new_schedule_id()
    with catalog.session() as s:
        repository.create_schedule(
            s,
            id=schedule_id,
            name=req.name or Path(art.name).stem,
            artifact_id=art.id,
            entry=entry,
            kind=kind,
            parallelism=req.parallelism or 1,
            program_args=req.program_args(),
            config=config,
            restart_strategy=restart,
            cron=timing.cron,
            every_s=timing.every_s,
            overlap=overlap,
            misfire_grace_s=grace,
            enabled=enabled,
            next_fire_at=timing.next_after(_at(now_ms)) if enabled else None,
        )
    log.info(
        "created schedule %s (%s) for jar %s: %s",
        schedule_id,
        req.name or art.name,
        art.id,
        f"cron {timing.cron}" if timing.cron else f"every {timing.every_s} s",
    )
    return {"id": schedule_id}


@router.get("", response_model=ScheduleList, summary="List the schedules with their next and last runs")
def list_schedules(request: Request, session: SessionDep) -> dict:
    rows = repository.list_schedules(session)
    counts = repository.schedule_run_counts(session)
    latest = repository.latest_schedule_runs(session, [r.id for r in rows])
    return {"schedules": [_for_caller(request, _view(session, r, counts, latest)) for r in rows]}


def _for_caller(request: Request, view: dict) -> dict:
    """A schedule's arguments may carry secrets: masked for viewers (guards/redaction.py)."""
    return {**view, "programArgs": redaction.for_caller(request, "programArgs", view["programArgs"])}


@router.get(
    "/{scheduleid}", response_model=ScheduleDetail, responses=_ERRORS, summary="One schedule and its newest 50 ticks"
)
def get_schedule(scheduleid: str, request: Request, session: SessionDep) -> dict:
    try:
        row = repository.get_schedule(session, scheduleid)
    except NotFound:
        raise _unknown_schedule(scheduleid) from None
    return _for_caller(request, _detail(session, row))


@router.patch("/{scheduleid}", response_model=ScheduleDetail, responses=_ERRORS, summary="Pause or resume a schedule")
def update_schedule(
    scheduleid: str, req: Annotated[ScheduleUpdateRequest, Body()], catalog: CatalogDep, now_ms: NowMsDep
) -> dict:
    with catalog.session() as s:
        try:
            row = repository.get_schedule(s, scheduleid, lock=True)
        except NotFound:
            raise _unknown_schedule(scheduleid) from None
        if req.enabled != row.enabled:
            # Resumed from the next tick after now: what fell while it was paused is not run.
            nxt = sch.Timing(cron=row.cron, every_s=row.every_s).next_after(_at(now_ms)) if req.enabled else None
            repository.set_schedule_enabled(s, row, req.enabled, nxt)
            log.info("schedule %s %s", scheduleid, "resumed" if req.enabled else "paused")
        return _detail(s, row)


@router.delete("/{scheduleid}", responses=_ERRORS, summary="Delete a schedule (its runs and their jobs stay)")
def delete_schedule(scheduleid: str, catalog: CatalogDep) -> dict:
    with catalog.session() as s:
        try:
            repository.delete_schedule(s, scheduleid)
        except NotFound:
            raise _unknown_schedule(scheduleid) from None
    log.info("deleted schedule %s", scheduleid)
    return {}
