"""Live per-task figures of a job for the dashboard's charts, and Flink's vertex metrics endpoint.

The TaskManagers write each attempt's newest micro-batch figures to Redis on every progress
report (`streams.progress_key`, the same numbers as the headrace_task_* Prometheus series); these
routes read them, so a chart polling every second costs a few Redis reads, never a scrape. They
keep the last ten minutes of each attempt's figures too (`streams.progress_history_key`), which a
chart opened late draws at once (GET /jobs/{id}/progress/history).
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from fastapi import APIRouter, Query

from services.dispatcher.deps import SessionDep, TransportDep
from services.dispatcher.errors import ApiError, error_responses
from services.dispatcher.schemas import JobProgressInfo, MetricValue
from services.dispatcher.schemas.jobs import JobProgressHistory
from services.dispatcher.views import operations
from shared import streams
from shared.catalog import repository
from shared.states import ExecutionState

router = APIRouter(prefix="/jobs", tags=["jobs"])
_404 = error_responses(404)

# Flink's metric name -> (field of the task figures, how subtasks combine)
VERTEX_METRICS: dict[str, tuple[str, str]] = {
    "numRecordsInPerSecond": ("inputRowsPerSecond", "sum"),
    "numRecordsOutPerSecond": ("processedRowsPerSecond", "sum"),
    "batchDurationMs": ("batchDurationMs", "max"),
    "sourceLag": ("sourceLag", "sum"),
}


def _number(raw: Any, kind=float) -> Any:
    if raw is None:
        return None
    try:
        return kind(raw.decode() if isinstance(raw, bytes) else raw)
    except (TypeError, ValueError):
        return None


def _partition_lag(raw: Any) -> dict[str, int] | None:
    """A Kafka source's lag per "topic/partition", as its TaskManager published it."""
    try:
        parsed = json.loads(_text(raw) or "")
    except ValueError:
        return None
    return {str(k): int(v) for k, v in parsed.items()} if isinstance(parsed, dict) else None


def _text(raw: Any) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


def task_figures(execution, fields: dict) -> dict:
    f = {_text(k): v for k, v in fields.items()}
    return {
        "vertexId": execution.vertex_id,
        "subtask": 0,
        "executionId": execution.id,
        "attempt": execution.attempt,
        "taskmanagerId": _text(f.get("taskmanager_id")) or execution.taskmanager_id,
        "batchId": _number(f.get("batch_id"), int),
        "inputRowsPerSecond": _number(f.get("input_rows_per_second")),
        "processedRowsPerSecond": _number(f.get("processed_rows_per_second")),
        "batchDurationMs": _number(f.get("batch_duration_ms"), int),
        "sourceLag": _number(f.get("source_lag")),
        "partitionLag": _partition_lag(f.get("partition_lag")),
        "numInputRows": _number(f.get("num_input_rows"), int),
        "sinkVersion": _number(f.get("sink_version"), int),
        "timestamp": _number(f.get("timestamp"), int),
        "sparkUi": _text(f.get("spark_ui")),
    }


def _current_figures(session, transport, job_id: str, vertex_id: str | None = None) -> list[dict]:
    job = operations.get_job(session, job_id)
    # A crashed TaskManager's hashes outlive its attempts: only live attempts' figures are current.
    # Read from the TaskManager the catalog placed each on: only that one writes under its prefix.
    executions = [
        ex
        for ex in repository.latest_executions(session, job.id).values()
        if (vertex_id is None or ex.vertex_id == vertex_id)
        and not ExecutionState(ex.state).is_terminal
        and ex.taskmanager_id
    ]
    client = transport.redis_client
    if not executions or client is None:
        return []
    try:
        pipe = client.pipeline(transaction=False)
        for ex in executions:
            pipe.hgetall(streams.progress_key(ex.taskmanager_id or "", ex.id))
        answers = pipe.execute()
    except redis.RedisError as exc:
        raise ApiError.of(
            503,
            f"Redis, where the TaskManagers publish task figures, is unavailable: {exc}",
            hint="the Prometheus series headrace_task_* carry the same numbers",
            prefix=False,
        ) from None
    return [task_figures(ex, fields) for ex, fields in zip(executions, answers, strict=True) if fields]


@router.get(
    "/{jobid}/progress",
    response_model=JobProgressInfo,
    responses=_404,
    summary="Newest micro-batch figures of each current attempt of the job (live charts)",
)
def job_progress(jobid: str, session: SessionDep, transport: TransportDep) -> dict:
    return {"tasks": _current_figures(session, transport, jobid)}


# The attempts whose history is read: the current ones and those just before (a restart's cause).
HISTORY_ATTEMPTS = 10


def history_point(entry_fields: dict) -> dict:
    f = {_text(k): v for k, v in entry_fields.items()}
    return {
        "timestamp": _number(f.get("timestamp"), int),
        "batchId": _number(f.get("batch_id"), int),
        "inputRowsPerSecond": _number(f.get("input_rows_per_second")),
        "processedRowsPerSecond": _number(f.get("processed_rows_per_second")),
        "batchDurationMs": _number(f.get("batch_duration_ms"), int),
        "sourceLag": _number(f.get("source_lag")),
        "numInputRows": _number(f.get("num_input_rows"), int),
        "sinkVersion": _number(f.get("sink_version"), int),
    }


@router.get(
    "/{jobid}/progress/history",
    response_model=JobProgressHistory,
    responses=_404,
    summary="The last minutes of each recent attempt's figures (what a chart opened now starts with)",
)
def job_progress_history(
    jobid: str,
    session: SessionDep,
    transport: TransportDep,
    seconds: int = Query(
        streams.PROGRESS_HISTORY_S,
        ge=1,
        le=streams.PROGRESS_HISTORY_S,
        description="how far back, at most the history kept (600)",
    ),
) -> dict:
    job = operations.get_job(session, jobid)
    executions = [
        ex for ex in list(repository.job_executions(session, job.id))[-HISTORY_ATTEMPTS:] if ex.taskmanager_id
    ]
    client = transport.redis_client
    if not executions or client is None:
        return {"seconds": seconds, "tasks": []}
    since_ms = int(time.time() * 1000) - seconds * 1000  # entry ids are the batch times in ms
    try:
        pipe = client.pipeline(transaction=False)
        for ex in executions:
            pipe.xrange(
                streams.progress_history_key(ex.taskmanager_id or "", ex.id),
                min=str(since_ms),
                count=streams.PROGRESS_HISTORY_POINTS,
            )
        answers = pipe.execute()
    except redis.RedisError as exc:
        raise ApiError.of(
            503,
            f"Redis, where the TaskManagers keep the figures' history, is unavailable: {exc}",
            hint="the Prometheus series headrace_task_* carry the same numbers",
            prefix=False,
        ) from None
    tasks = []
    for ex, entries in zip(executions, answers, strict=True):
        recent = [fields for _entry_id, fields in entries]
        if recent:
            tasks.append(
                {
                    "vertexId": ex.vertex_id,
                    "subtask": 0,
                    "executionId": ex.id,
                    "attempt": ex.attempt,
                    "points": [p for p in map(history_point, recent) if p["timestamp"] is not None],
                }
            )
    return {"seconds": seconds, "tasks": tasks}


def aggregate(name: str, tasks: list[dict]) -> float | None:
    field, how = VERTEX_METRICS[name]
    values = [t[field] for t in tasks if t.get(field) is not None]
    if not values:
        return None
    return max(values) if how == "max" else sum(values)


@router.get(
    "/{jobid}/vertices/{vertexid}/metrics",
    response_model=list[MetricValue],
    response_model_exclude_none=True,
    responses=_404,
    summary="Flink's vertex metrics: without `get` the names available, with it their values",
)
def vertex_metrics(
    jobid: str,
    vertexid: str,
    session: SessionDep,
    transport: TransportDep,
    get: str | None = Query(None, description="comma-separated metric names"),
) -> list[dict]:
    job = operations.get_job(session, jobid)
    if not any(v.id == vertexid for v in repository.job_vertices(session, job.id)):
        raise ApiError.of(
            404,
            f"vertex {vertexid!r} not found in job {job.id}",
            field="vertexid",
            expected="the id of one of the job's vertices",
            hint=f"GET /jobs/{job.id} lists its vertices",
            prefix=False,
        )
    if get is None:
        return [{"id": name} for name in VERTEX_METRICS]
    wanted = [n.strip() for n in get.split(",") if n.strip()]
    tasks = _current_figures(session, transport, job.id, vertexid)
    out = []
    for name in wanted:
        if name in VERTEX_METRICS:
            value = aggregate(name, tasks)
            if value is not None:
                # Flink answers every value as a string.
                out.append({"id": name, "value": str(int(value) if float(value).is_integer() else value)})
    return out
