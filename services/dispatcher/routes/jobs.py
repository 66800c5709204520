"""/jobs: list, inspect and cancel jobs (read from the catalog; cancel goes to the JobManager)."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select
from sqlalchemy.orm import Session

from services.dispatcher import operations, views
from services.dispatcher.deps import CatalogDep, NowMsDep, SessionDep, SettingsDep, TransportDep
from services.dispatcher.errors import ApiError
from services.dispatcher.schemas import (
    Empty, ErrorBody, JobConfigInfo, JobDetailsInfo, JobExceptionsInfoWithHistory, JobIdsWithStatusOverview,
    JobVertexDetailsInfo, MultipleJobsDetails, int_at_least,
)
from shared.catalog import repository
from shared.catalog.models import Execution, Vertex
from shared.messages import CancelJob
from shared.states import JobStatus
from shared.streams import JM_STREAM

log = logging.getLogger(__name__)
router = APIRouter(prefix="/jobs", tags=["jobs"])
_404 = {404: {"model": ErrorBody}}


_job = operations.get_job


def _tm_hosts(s: Session) -> dict[str, str]:
    return {tm.id: tm.host for tm in repository.list_taskmanagers(s, include_gone=True)}


def _all_vertices_and_latest(s: Session) -> tuple[dict[str, list[Any]], dict[str, dict[str, Any]]]:
    """Every job's vertices and each vertex's current attempt, in two queries (the overview is
    polled every second; one query per job would not scale with the job history)."""
    vertices: dict[str, list[Any]] = defaultdict(list)
    for v in s.execute(select(Vertex).order_by(Vertex.job_id, Vertex.idx)).scalars():
        vertices[v.job_id].append(v)
    latest: dict[str, dict[str, Any]] = defaultdict(dict)
    for ex in s.execute(select(Execution).order_by(Execution.attempt)).scalars():
        latest[ex.job_id][ex.vertex_id] = ex
    return vertices, latest


@router.get("", response_model=JobIdsWithStatusOverview, summary="Every job's id and status")
def list_jobs(session: SessionDep) -> dict:
    return views.job_ids(repository.list_jobs(session))


@router.get("/overview", response_model=MultipleJobsDetails, summary="Every job with times and task counts, newest first")
def jobs_overview(session: SessionDep, now_ms: NowMsDep) -> dict:
    jobs = repository.list_jobs(session)
    vertices, latest = _all_vertices_and_latest(session)
    return {"jobs": [views.job_overview(j, vertices.get(j.id, []), latest.get(j.id, {}), now_ms)
                     for j in reversed(jobs)]}


@router.get("/{jobid}", response_model=JobDetailsInfo, responses=_404, summary="Details of one job")
def job_details(jobid: str, session: SessionDep, settings: SettingsDep, now_ms: NowMsDep) -> dict:
    job = _job(session, jobid)
    vertices = repository.job_vertices(session, job.id)
    latest = repository.latest_executions(session, job.id)
    return views.job_details(
        job, vertices, latest, repository.job_state_timestamps(session, job.id),
        max_par=views.max_parallelism(job.config, settings.spark_shuffle_partitions), now_ms=now_ms,
    )


@router.get("/{jobid}/config", response_model=JobConfigInfo, responses=_404, summary="A job's configuration")
def job_config(jobid: str, session: SessionDep) -> dict:
    return views.job_config(_job(session, jobid))


@router.get("/{jobid}/vertices/{vertexid}", response_model=JobVertexDetailsInfo, responses=_404,
            summary="A vertex: its current attempt as subtask 0, and the history of attempts")
def vertex_details(jobid: str, vertexid: str, session: SessionDep, settings: SettingsDep, now_ms: NowMsDep) -> dict:
    job = _job(session, jobid)
    vertex = next((v for v in repository.job_vertices(session, job.id) if v.id == vertexid), None)
    if vertex is None:
        raise ApiError.of(404, f"vertex {vertexid!r} not found in job {job.id}", field="vertexid",
                          expected="the id of one of the job's vertices",
                          hint=f"GET /jobs/{job.id} lists its vertices", prefix=False)
    return views.vertex_details(
        vertex, repository.vertex_executions(session, vertex.id), _tm_hosts(session),
        max_par=views.max_parallelism(job.config, settings.spark_shuffle_partitions), now_ms=now_ms,
        history=settings.max_attempts_history,
    )


@router.get("/{jobid}/exceptions", response_model=JobExceptionsInfoWithHistory, responses=_404,
            summary="The job's exception history, newest first")
def job_exceptions(
    jobid: str, session: SessionDep, settings: SettingsDep,
    maxExceptions: Annotated[int_at_least(1) | None, Query(description="at most this many entries")] = None,
) -> dict:
    job = _job(session, jobid)
    limit = min(maxExceptions or settings.exception_history_size, settings.exception_history_size)
    return views.exceptions(repository.job_exceptions(session, job.id), _tm_hosts(session), limit=limit)


@router.patch("/{jobid}", status_code=202, response_model=Empty,
              responses={**_404, 400: {"model": ErrorBody}, 409: {"model": ErrorBody}, 503: {"model": ErrorBody}},
              summary="Cancel a job (mode=cancel)")
def cancel_job(
    jobid: str, catalog: CatalogDep, transport: TransportDep,
    mode: Annotated[str, Query(description="only 'cancel' is supported")] = "cancel",
) -> dict:
    if mode != "cancel":
        raise ApiError.of(400, f"unsupported mode {mode!r}", field="mode", expected="'cancel'", got=mode,
                          hint="use PATCH /jobs/{jobid}?mode=cancel")
    with catalog.session() as s:
        job = _job(s, jobid)
        status = JobStatus(job.status)
    if status.is_terminal:
        raise ApiError.of(409, f"job {job.id} cannot be cancelled: it has already reached the terminal state "
                          f"{status.value}", field="jobid", expected="a job that has not finished, failed or been "
                          "cancelled", got=status.value, prefix=False)
    try:
        transport.publish(JM_STREAM, CancelJob(job_id=job.id))
    except Exception as exc:  # noqa: BLE001 - any transport failure
        raise ApiError.of(503, f"job {job.id} was not cancelled: the JobManager stream is unreachable ({exc})",
                          hint="check that Redis is up (settings.redis_url) and try again") from None
    log.info("cancel requested for job %s (%s)", job.id, status.value)
    return {}
