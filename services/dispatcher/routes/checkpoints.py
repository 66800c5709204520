"""/jobs/{jobid}/checkpoints: Flink's checkpoint statistics, configuration and details from the
catalog's checkpoint rows, and the manual checkpoint trigger with its status resource."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path

from services.dispatcher.deps import CatalogDep, NowMsDep, SessionDep, SettingsDep, TransportDep
from services.dispatcher.errors import ApiError, error_responses
from services.dispatcher.schemas import IntRange
from services.dispatcher.schemas.snapshots import (
    AsynchronousOperationResult,
    CheckpointConfigInfo,
    CheckpointingStatistics,
    CheckpointTriggerRequest,
    TriggerResponse,
)
from services.dispatcher.views import checkpoints, operations, snapshot_sinks
from shared import checkpointing as cp
from shared.catalog import repository
from shared.catalog.repository import NotFound
from shared.messages import RequestCheckpoint
from shared.states import CheckpointStatus

router = APIRouter(prefix="/jobs", tags=["checkpoints"])
_404 = error_responses(404)
_COMPLETED = (CheckpointStatus.COMPLETED, CheckpointStatus.DISCARDED)
SUMMARY_WINDOW = 1000  # completed checkpoints the summary covers (Flink's histograms are windows too)


@router.get(
    "/{jobid}/checkpoints",
    response_model=CheckpointingStatistics,
    responses=_404,
    summary="Checkpoint counts, summary, latest checkpoints and history",
)
def checkpoint_statistics(jobid: str, session: SessionDep, now_ms: NowMsDep) -> dict:
    job = operations.get_job(session, jobid)
    counts = repository.count_job_checkpoints_by_status(session, job.id)
    completed = repository.list_checkpoints(session, job.id, statuses=_COMPLETED, limit=SUMMARY_WINDOW)
    restored = [ex for ex in repository.job_executions(session, job.id) if ex.restored_from]

    def latest(**kw):
        rows = repository.list_checkpoints(session, job.id, limit=1, **kw)
        return rows[0] if rows else None

    stats = checkpoints.checkpointing_statistics(
        counts=counts,
        restored_count=len(restored),
        summary_rows=completed,
        latest_completed=latest(statuses=_COMPLETED, kind="checkpoint"),
        latest_savepoint=latest(statuses=_COMPLETED, kind="savepoint"),
        latest_failed=latest(statuses=[CheckpointStatus.FAILED]),
        restored=checkpoints.restored_statistics(
            max(
                restored,
                key=lambda ex: (ex.attempt, ex.timestamps.get("CREATED", 0) if ex.timestamps else 0),
                default=None,
            ),
            {r.path for r in completed if r.kind == "savepoint" and r.path},
        ),
        history=repository.list_checkpoints(session, job.id, limit=checkpoints.HISTORY_SIZE),
        now_ms=now_ms,
    )
    for item in stats["history"]:  # a Delta sink's table version per checkpoint
        if item.get("status") == "COMPLETED":
            item.update(snapshot_sinks.sink_fields(item.get("external_path")))
    return stats


@router.post(
    "/{jobid}/checkpoints",
    status_code=202,
    response_model=TriggerResponse,
    responses=error_responses(400, 404, 409, 503),
    summary="Trigger a checkpoint now, outside the interval",
)
def trigger_checkpoint(
    jobid: str,
    catalog: CatalogDep,
    transport: TransportDep,
    body: Annotated[CheckpointTriggerRequest | None, Body()] = None,
) -> dict:
    req = body or CheckpointTriggerRequest()

    def build(job, request_id: str):
        params = {"checkpoint_type": req.checkpointType or "CONFIGURED"}
        return params, RequestCheckpoint(job_id=job.id, request_id=request_id)

    request_id = operations.trigger(
        catalog,
        transport,
        jobid=jobid,
        kind="checkpoint",
        action="take a checkpoint",
        build=build,
        trigger_id=req.triggerId,
    )
    return {"request-id": request_id}


@router.get(
    "/{jobid}/checkpoints/config",
    response_model=CheckpointConfigInfo,
    responses=_404,
    summary="The job's effective checkpoint configuration",
)
def checkpoint_config(jobid: str, session: SessionDep, settings: SettingsDep) -> dict:
    job = operations.get_job(session, jobid)
    try:
        cfg = cp.checkpoint_config(job.config, settings.checkpointing, savepoint_dir=str(settings.savepoints))
    except cp.InvalidCheckpointConfig as exc:
        raise ApiError.of(
            409,
            f"job {job.id} has an invalid checkpoint option: {exc}",
            field=exc.field,
            expected=f"a valid value for {exc.field}",
            hint="the option was stored before it was validated; submit the job again with a valid value",
            prefix=False,
        ) from None
    return checkpoints.checkpoint_config_info(cfg, job.config)


@router.get(
    "/{jobid}/checkpoints/details/{checkpointid}",
    responses=_404,
    summary="One checkpoint's statistics, with its task and source offsets",
)
def checkpoint_details(
    jobid: str, checkpointid: Annotated[int, IntRange(0, 2**63 - 1), Path()], session: SessionDep, now_ms: NowMsDep
) -> dict:
    job = operations.get_job(session, jobid)
    try:
        row = repository.get_checkpoint(session, job.id, checkpointid)
    except NotFound:
        raise ApiError.of(
            404,
            f"checkpoint {checkpointid} of job {job.id} not found",
            field="checkpointid",
            expected="the id of one of the job's checkpoints",
            hint=f"GET /jobs/{job.id}/checkpoints lists the recent ones",
            prefix=False,
        ) from None
    out = checkpoints.checkpoint_statistics(row, now_ms, tasks=True)
    return out | snapshot_sinks.sink_fields(row.path) if out.get("status") == "COMPLETED" else out


@router.get(
    "/{jobid}/checkpoints/{triggerid}",
    response_model=AsynchronousOperationResult,
    responses=_404,
    summary="Status of a manual checkpoint: its id once COMPLETED",
)
def checkpoint_status(jobid: str, triggerid: str, session: SessionDep) -> dict:
    return operations.status(
        session, jobid=jobid, triggerid=triggerid, kinds=("checkpoint",), result="checkpoint", what="checkpoint"
    )
