"""/jobs: list, inspect and cancel jobs (read from the catalog; cancel goes to the JobManager)."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from datetime import datetime
from typing import Annotated, Any, NamedTuple

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from services.dispatcher.deps import (
    CatalogDep,
    ClockDep,
    NowMsDep,
    OverviewCacheDep,
    SessionDep,
    SettingsDep,
    TransportDep,
)
from services.dispatcher.errors import ApiError, error_responses
from services.dispatcher.guards import redaction
from services.dispatcher.schemas import (
    Empty,
    JobConfigInfo,
    JobDetailsInfo,
    JobExceptionsInfoWithHistory,
    JobIdsWithStatusOverview,
    JobVertexDetailsInfo,
    MultipleJobsDetails,
    PositiveInt,
)
from services.dispatcher.views import operations, shapes
from shared import pipeline_databases
from shared.catalog import repository
from shared.job_lineage import Lineages
from shared.messages import CancelJob
from shared.states import JobStatus
from shared.streams import JM_STREAM

log = logging.getLogger(__name__)
router = APIRouter(prefix="/jobs", tags=["jobs"])
_404 = error_responses(404)


_job = operations.get_job


def _tm_hosts(s: Session) -> dict[str, str]:
    return {tm.id: tm.host for tm in repository.list_taskmanagers(s, include_gone=True)}


RUNTIME_MODE = "execution.runtime-mode"  # the one option of a job's configuration the overview reads


class _OverviewJob(NamedTuple):
    """What shapes.job_overview reads of a job, without the rest of its row."""

    id: str
    name: str
    status: str
    created_at: datetime
    end_at: datetime | None
    updated_at: datetime
    config: dict[str, Any] | None  # only RUNTIME_MODE, extracted by the database
    waiting_reason: str | None
    parallelism: int
    deployment: str | None


def overview_answer(s: Session, now_ms: int) -> dict[str, Any]:
    """GET /jobs/overview, newest first, in three queries that load only what the view reads: the
    jobs' columns, their vertices' ids and each vertex's latest attempt (not every attempt)."""
    jobs = repository.job_overview_rows(s, RUNTIME_MODE)
    vertices: dict[str, list[Any]] = defaultdict(list)
    for v in repository.vertex_ids_by_job(s):
        vertices[v.job_id].append(v)
    latest = {ex.vertex_id: ex for ex in repository.latest_attempt_states(s)}
    out = []
    for jid, name, status, created_at, end_at, updated_at, mode, waiting, parallelism, deployment in jobs:
        job = _OverviewJob(
            jid,
            name,
            status,
            created_at,
            end_at,
            updated_at,
            {RUNTIME_MODE: mode} if mode is not None else None,
            waiting,
            parallelism,
            deployment,
        )
        vs = vertices.get(jid, ())
        out.append(shapes.job_overview(job, vs, {v.id: latest[v.id] for v in vs if v.id in latest}, now_ms))
    return {"jobs": out}


def encode(answer: Any) -> bytes:
    """As FastAPI's JSONResponse encodes, but without validating the answer against the response
    model (5 ms per build with 1,000 jobs); tests/integration/test_overview_cache.py checks
    that the two answers are the same."""
    return json.dumps(answer, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


@router.get("", response_model=JobIdsWithStatusOverview, summary="Every job's id and status")
def list_jobs(session: SessionDep) -> dict:
    return shapes.job_ids(repository.list_jobs(session))


# response_model only documents the answer: a Response is sent as it is, unvalidated.
@router.get(
    "/overview", response_model=MultipleJobsDetails, summary="Every job with times and task counts, newest first"
)
async def jobs_overview(catalog: CatalogDep, cache: OverviewCacheDep, clock: ClockDep) -> Response:
    def build() -> bytes:
        with catalog.session() as s:
            return encode(overview_answer(s, clock()))

    # A fresh answer (or the earlier one while another request rebuilds it) is sent from the event
    # loop; otherwise a worker thread runs the rebuild, or waits for it, as its queries block.
    entry = cache.peek()
    if entry is None:
        entry = await run_in_threadpool(cache.get, build)
    # Age (RFC 9111): how old the answer is; it lags the catalog by at most overview_cache_ms.
    return Response(entry.body, media_type="application/json", headers={"Age": str(int(cache.age_s(entry)))})


@router.get("/{jobid}", response_model=JobDetailsInfo, responses=_404, summary="Details of one job")
def job_details(jobid: str, session: SessionDep, settings: SettingsDep, now_ms: NowMsDep) -> dict:
    job = _job(session, jobid)
    vertices = repository.job_vertices(session, job.id)
    latest = repository.latest_executions(session, job.id)
    newest_exception = repository.newest_exception(session, job.id)
    details = shapes.job_details(
        job,
        vertices,
        latest,
        repository.job_state_timestamps(session, job.id),
        max_par=shapes.max_parallelism(job.config, settings.spark_shuffle_partitions),
        now_ms=now_ms,
        last_exception=newest_exception,
    )
    # The JobManager's rule (shared/job_lineage.py): where an operator finds the job's SQL output.
    lineage = Lineages().of(session, job)
    database = pipeline_databases.local_database(settings, lineage, job.config)
    return details | {"lineage": lineage, "pipeline-database": str(database) if database else None}


@router.get("/{jobid}/config", response_model=JobConfigInfo, responses=_404, summary="A job's configuration")
def job_config(jobid: str, request: Request, session: SessionDep) -> dict:
    return redaction.for_caller(request, "", shapes.job_config(_job(session, jobid)))


@router.get(
    "/{jobid}/vertices/{vertexid}",
    response_model=JobVertexDetailsInfo,
    responses=_404,
    summary="A vertex: its current attempt as subtask 0, and the history of attempts",
)
def vertex_details(jobid: str, vertexid: str, session: SessionDep, settings: SettingsDep, now_ms: NowMsDep) -> dict:
    job = _job(session, jobid)
    vertex = next((v for v in repository.job_vertices(session, job.id) if v.id == vertexid), None)
    if vertex is None:
        raise ApiError.of(
            404,
            f"vertex {vertexid!r} not found in job {job.id}",
            field="vertexid",
            expected="the id of one of the job's vertices",
            hint=f"GET /jobs/{job.id} lists its vertices",
            prefix=False,
        )
    return shapes.vertex_details(
        vertex,
        repository.vertex_executions(session, vertex.id),
        _tm_hosts(session),
        max_par=shapes.max_parallelism(job.config, settings.spark_shuffle_partitions),
        now_ms=now_ms,
        history=settings.max_attempts_history,
    )


@router.get(
    "/{jobid}/exceptions",
    response_model=JobExceptionsInfoWithHistory,
    responses=_404,
    summary="The job's exception history, newest first",
)
def job_exceptions(
    jobid: str,
    session: SessionDep,
    settings: SettingsDep,
    maxExceptions: Annotated[PositiveInt | None, Query(description="at most this many entries")] = None,
) -> dict:
    job = _job(session, jobid)
    limit = min(maxExceptions or settings.exception_history_size, settings.exception_history_size)
    return shapes.exceptions(repository.job_exceptions(session, job.id), _tm_hosts(session), limit=limit)


@router.patch(
    "/{jobid}",
    status_code=202,
    response_model=Empty,
    responses=error_responses(400, 404, 409, 503),
    summary="Cancel a job (mode=cancel)",
)
def cancel_job(
    jobid: str,
    catalog: CatalogDep,
    transport: TransportDep,
    mode: Annotated[str, Query(description="only 'cancel' is supported")] = "cancel",
) -> dict:
    if mode != "cancel":
        raise ApiError.of(
            400,
            f"unsupported mode {mode!r}",
            field="mode",
            expected="'cancel'",
            got=mode,
            hint="use PATCH /jobs/{jobid}?mode=cancel",
        )
    with catalog.session() as s:
        job = _job(s, jobid)
        status = JobStatus(job.status)
    if status.is_terminal:
        raise ApiError.of(
            409,
            f"job {job.id} cannot be cancelled: it has already reached the terminal state {status.value}",
            field="jobid",
            expected="a job that has not finished, failed or been cancelled",
            got=status.value,
            prefix=False,
        )
    try:
        transport.publish(JM_STREAM, CancelJob(job_id=job.id))
    except Exception as exc:  # noqa: BLE001 - any transport failure
        raise ApiError.of(
            503,
            f"job {job.id} was not cancelled: the JobManager stream is unreachable ({exc})",
            hint="check that Redis is up (settings.redis_url) and try again",
        ) from None
    log.info("cancel requested for job %s (%s)", job.id, status.value)
    return {}
