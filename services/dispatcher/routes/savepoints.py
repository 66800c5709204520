"""Savepoints, stop-with-savepoint, rescaling and savepoint disposal, in Flink 2.3's REST shapes.

The JobManager takes savepoints (`RequestSavepoint`); the dispatcher only records the operation
and reports it. Disposal needs no running job, so the dispatcher does it itself: it is a
directory delete in checkpoint storage.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query

from services.dispatcher.deps import CatalogDep, SessionDep, SettingsDep, TransportDep
from services.dispatcher.errors import ApiError, error_responses
from services.dispatcher.guards import storage_roots
from services.dispatcher.schemas import ErrorBody, Parallelism
from services.dispatcher.schemas.snapshots import (
    AsynchronousOperationResult,
    SavepointDisposalRequest,
    SavepointTriggerRequest,
    StopWithSavepointRequest,
    TriggerResponse,
)
from services.dispatcher.submission import restore
from services.dispatcher.views import operations
from shared import checkpoint_storage, job_options
from shared import checkpointing as cp
from shared.catalog import repository
from shared.catalog.models import Job
from shared.ids import new_request_id
from shared.messages import RequestSavepoint
from shared.settings import Settings
from shared.states import CheckpointStatus, OperationStatus

log = logging.getLogger(__name__)
router = APIRouter(tags=["savepoints"])
_ERRORS = error_responses(400, 404, 409, 503)
SAVEPOINT_KINDS = ("savepoint", "stop")


def default_target(job: Job, settings: Settings) -> str:
    """Where a savepoint goes when the request names no directory: the job's state.savepoints.dir,
    else the cluster's."""
    configured = (job.config or {}).get(cp.SAVEPOINT_DIR)
    if configured:
        return storage_roots.confined(
            restore.local_path(configured, cp.SAVEPOINT_DIR),
            settings,
            field=cp.SAVEPOINT_DIR,
            what="the job's savepoint directory",
        )
    return str(Path(settings.savepoints).absolute())


def _savepoint(
    settings: Settings,
    raw_target: str | None,
    field: str,
    *,
    after: str,
    drain: bool = False,
    format_type: str | None = None,
    parallelism: int | None = None,
) -> operations.Build:
    # A bad path is refused before anything is recorded.
    target = restore.local_path(raw_target, field) if raw_target else None
    if target is not None:
        target = storage_roots.confined(target, settings, field=field, what="savepoint target")

    def build(job: Job, request_id: str) -> tuple[dict[str, Any], RequestSavepoint]:
        partitions = job_options.state_partitions(job.config, settings.spark_shuffle_partitions)
        if parallelism is not None and parallelism > partitions:
            raise ApiError.of(
                400,
                f"job {job.id} has {partitions} state partitions, fixed at its first start: "
                f"parallelism {parallelism} could not use more than {partitions} cores",
                hint=f"rescale to at most {partitions}, or start the pipeline anew with "
                f"pipeline.max-parallelism >= {parallelism}",
                prefix=False,
            )
        directory = target or default_target(job, settings)
        params: dict[str, Any] = {
            "target_directory": directory,
            "after": after,
            "drain": drain,
            "format_type": format_type or "CANONICAL",
        }
        if parallelism is not None:
            params["parallelism"] = parallelism
        return params, RequestSavepoint(
            job_id=job.id,
            request_id=request_id,
            target_directory=directory,
            after=after,
            drain=drain,
            parallelism=parallelism,
        )

    return build


@router.post(
    "/jobs/{jobid}/savepoints",
    status_code=202,
    response_model=TriggerResponse,
    responses=_ERRORS,
    summary="Trigger a savepoint, optionally cancelling the job afterwards",
)
def trigger_savepoint(
    jobid: str,
    settings: SettingsDep,
    catalog: CatalogDep,
    transport: TransportDep,
    body: Annotated[SavepointTriggerRequest | None, Body()] = None,
) -> dict:
    req = body or SavepointTriggerRequest()
    build = _savepoint(
        settings,
        req.target_directory,
        "target-directory",
        after="cancel" if req.cancel_job else "continue",
        format_type=req.formatType,
    )
    request_id = operations.trigger(
        catalog,
        transport,
        jobid=jobid,
        kind="savepoint",
        action="take a savepoint",
        build=build,
        trigger_id=req.triggerId,
    )
    return {"request-id": request_id}


@router.get(
    "/jobs/{jobid}/savepoints/{triggerid}",
    response_model=AsynchronousOperationResult,
    responses={404: {"model": ErrorBody}},
    summary="Status of a savepoint or stop-with-savepoint: its location once COMPLETED",
)
def savepoint_status(jobid: str, triggerid: str, session: SessionDep) -> dict:
    return operations.status(
        session, jobid=jobid, triggerid=triggerid, kinds=SAVEPOINT_KINDS, result="savepoint", what="savepoint"
    )


@router.post(
    "/jobs/{jobid}/stop",
    status_code=202,
    response_model=TriggerResponse,
    responses=_ERRORS,
    summary="Stop the job with a savepoint (it ends FINISHED); poll /jobs/{jobid}/savepoints/{request-id}",
)
def stop_with_savepoint(
    jobid: str,
    settings: SettingsDep,
    catalog: CatalogDep,
    transport: TransportDep,
    body: Annotated[StopWithSavepointRequest | None, Body()] = None,
) -> dict:
    req = body or StopWithSavepointRequest()
    build = _savepoint(
        settings,
        req.targetDirectory,
        "targetDirectory",
        after="stop",
        drain=bool(req.drain),
        format_type=req.formatType,
    )
    request_id = operations.trigger(
        catalog, transport, jobid=jobid, kind="stop", action="be stopped", build=build, trigger_id=req.triggerId
    )
    return {"request-id": request_id}


@router.patch(
    "/jobs/{jobid}/rescaling",
    response_model=TriggerResponse,
    responses=_ERRORS,
    summary="Rescale: stop with a savepoint and run again from it with another parallelism",
)
def trigger_rescaling(
    jobid: str,
    settings: SettingsDep,
    catalog: CatalogDep,
    transport: TransportDep,
    parallelism: Annotated[Parallelism, Query(description="the new parallelism")],
) -> dict:
    build = _savepoint(settings, None, "parallelism", after="rescale", parallelism=parallelism)
    request_id = operations.trigger(catalog, transport, jobid=jobid, kind="rescale", action="be rescaled", build=build)
    return {"request-id": request_id}


@router.get(
    "/jobs/{jobid}/rescaling/{triggerid}",
    response_model=AsynchronousOperationResult,
    responses={404: {"model": ErrorBody}},
    summary="Status of a rescaling",
)
def rescaling_status(jobid: str, triggerid: str, session: SessionDep) -> dict:
    return operations.status(
        session, jobid=jobid, triggerid=triggerid, kinds=("rescale",), result="info", what="rescaling"
    )


@router.post(
    "/savepoint-disposal",
    response_model=TriggerResponse,
    responses=_ERRORS,
    summary="Delete a savepoint or retained checkpoint; poll /savepoint-disposal/{request-id}",
)
def dispose_savepoint(
    body: Annotated[SavepointDisposalRequest, Body()], catalog: CatalogDep, settings: SettingsDep
) -> dict:
    path = restore.local_path(body.savepoint_path, "savepoint-path")
    request_id = new_request_id()
    with catalog.session() as s:
        # Refused before a row is written or a file renamed: only what the catalog records.
        path = storage_roots.known_snapshot(s, path, settings, field="savepoint-path")
        repository.create_operation(s, id=request_id, kind="dispose", job_id=None, params={"path": path})
    try:
        resolved = str(checkpoint_storage.resolve_snapshot(path))
        checkpoint_storage.dispose(resolved)
    except (checkpoint_storage.SnapshotError, OSError, ValueError) as exc:
        # Flink's contract: the trigger succeeds and the status resource reports the failure.
        operations.finish(catalog, request_id, OperationStatus.FAILED, failure_cause=f"cannot dispose of {path}: {exc}")
        log.info("disposal %s of %s failed: %s", request_id, path, exc)
        return {"request-id": request_id}
    with catalog.session() as s:
        discarded = _discard_rows(s, {path, resolved})
        repository.finish_operation(
            s, repository.get_operation(s, request_id, lock=True), OperationStatus.COMPLETED, location=resolved
        )
    log.info("disposed of %s (%d catalog record(s) discarded)", resolved, discarded)
    return {"request-id": request_id}


def _discard_rows(s, paths: set[str]) -> int:
    """Mark the completed snapshots recorded at these paths DISCARDED: their files are gone."""
    candidates = {p.rstrip("/") for p in paths} | {p.rstrip("/") + "/" for p in paths}
    candidates |= {f"file:{p}" for p in set(candidates)} | {f"file://{p}" for p in set(candidates)}
    rows = repository.lock_completed_snapshots(s, candidates)
    for row in rows:
        repository.transition_checkpoint(s, row, CheckpointStatus.DISCARDED)
    return len(rows)


@router.get(
    "/savepoint-disposal/{triggerid}",
    response_model=AsynchronousOperationResult,
    responses={404: {"model": ErrorBody}},
    summary="Status of a savepoint disposal",
)
def disposal_status(triggerid: str, session: SessionDep) -> dict:
    return operations.status(
        session, jobid=None, triggerid=triggerid, kinds=("dispose",), result="info", what="savepoint disposal"
    )
