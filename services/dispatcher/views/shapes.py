"""Catalog rows -> Flink REST v1 JSON shapes. Pure functions: rows (or anything with the same
attributes) and the current time in, plain dicts out; no session, no I/O.

Times are epoch milliseconds; -1 means "never" (Flink's convention for start/end times) and 0
means "never entered" in state timestamp maps (Flink's `timestamps`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from shared import job_options
from shared.catalog.models import epoch_ms
from shared.failure_summary import summarize
from shared.ids import VertexId
from shared.states import EXECUTION_STATE_NAMES, JOB_STATE_NAMES, ExecutionState, JobStatus

FLINK_VERSION = "headrace-0.1.0"
FLINK_COMMIT = "unknown"
UNASSIGNED = "(unassigned)"  # Flink's endpoint for a task that has no TaskManager yet
# Flink reports how long a subtask spent in each of these states.
_STATUS_DURATION_STATES = ("CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING")
_NON_TERMINAL_JOB = [s for s in JobStatus if not s.is_terminal]
# Iterating the enum costs more than the rest of a job's overview (called per job and vertex).
_EXECUTION_STATES = EXECUTION_STATE_NAMES


def ms(dt: datetime | None) -> int:
    return epoch_ms(dt)


def _duration(start: int, end: int, now_ms: int) -> int:
    if start < 0:
        return -1
    return max(0, (end if end >= 0 else now_ms) - start)


def _state(ex: Any | None) -> str:
    return ex.state if ex is not None else ExecutionState.CREATED.value


def execution_state_counts(states: Iterable[str]) -> dict[str, int]:
    """Flink's `status-counts`: every ExecutionState name, upper case, with a count."""
    counts = dict.fromkeys(_EXECUTION_STATES, 0)
    for st in states:
        counts[st] = counts.get(st, 0) + 1
    return counts


def task_counts(vertices: Sequence[Any], latest: Mapping[VertexId, Any]) -> dict[str, int]:
    """`tasks` of /jobs/overview: lower-case state names plus `total`. A task is one vertex's
    Spark query (its current attempt); a vertex not yet scheduled counts as created."""
    counts = execution_state_counts(_state(latest.get(v.id)) for v in vertices)
    out = {"total": len(vertices)}
    out.update({k.lower(): v for k, v in counts.items()})
    return out


def max_parallelism(config: Mapping[str, Any] | None, default: int) -> int:
    """The state partition count (Spark's shuffle partitions), fixed at the job's first start."""
    return job_options.state_partitions(config, default)


def job_type(config: Mapping[str, Any] | None) -> str:
    mode = str((config or {}).get("execution.runtime-mode", "STREAMING")).upper()
    return "BATCH" if mode == "BATCH" else "STREAMING"


def waiting_reason(job: Any, latest: Mapping[VertexId, Any]) -> str | None:
    if job.waiting_reason:
        return job.waiting_reason
    for ex in latest.values():
        if getattr(ex, "waiting_reason", None) and not ExecutionState(ex.state).is_terminal:
            return ex.waiting_reason
    return None


def attempts(latest: Mapping[VertexId, Any]) -> int:
    """How many attempts the job's tasks have made (attempt numbers start at 0, as in Flink)."""
    return max((ex.attempt + 1 for ex in latest.values()), default=0)


def restarts(latest: Mapping[VertexId, Any]) -> int:
    """How many times the job's tasks were started again (after a failure, or for a rescale):
    every restart gives each task a new attempt."""
    return max(attempts(latest) - 1, 0)


# --- jobs ----------------------------------------------------------------------------------


def job_ids(jobs: Iterable[Any]) -> dict[str, Any]:
    return {"jobs": [{"id": j.id, "status": j.status} for j in jobs]}


def job_overview(job: Any, vertices: Sequence[Any], latest: Mapping[VertexId, Any], now_ms: int) -> dict[str, Any]:
    start, end = ms(job.created_at), ms(job.end_at)
    return {
        "jid": job.id,
        "name": job.name,
        "state": job.status,
        "start-time": start,
        "end-time": end,
        "duration": _duration(start, end, now_ms),
        "last-modification": ms(job.updated_at),
        "tasks": task_counts(vertices, latest),
        # Flink 2.x's JobDetails carries these; its REST client refuses a job without them.
        "jobType": job_type(job.config),
        "schedulerType": "Default",
        "pending-operators": 0,
        # Headrace extras for the dashboard's job list.
        "waiting-reason": waiting_reason(job, latest),
        "parallelism": job.parallelism,
        "restarts": restarts(latest),
        "deployment": getattr(job, "deployment", None),  # the deployment that started it, if any
    }


def vertex_summary(vertex: Any, ex: Any | None, max_par: int, now_ms: int) -> dict[str, Any]:
    start = ms(ex.start_at) if ex is not None else -1
    end = ms(ex.end_at) if ex is not None else -1
    return {
        "id": vertex.id,
        "name": vertex.name,
        "maxParallelism": max_par,
        "parallelism": vertex.parallelism,
        "status": _state(ex),
        "start-time": start,
        "end-time": end,
        "duration": _duration(start, end, now_ms),
        "tasks": execution_state_counts([_state(ex)]),
        "metrics": _metrics(ex),
    }


def _metrics(ex: Any | None) -> dict[str, Any]:
    if ex is None:
        return {}
    return {"read-records": int(ex.rows_processed or 0), "read-records-complete": ExecutionState(ex.state).is_terminal}


def job_plan(job: Any, vertices: Sequence[Any]) -> dict[str, Any]:
    return {
        "jid": job.id,
        "name": job.name,
        "type": job_type(job.config),
        "nodes": [
            {
                "id": v.id,
                "parallelism": v.parallelism,
                "operator": "",
                "operator_strategy": "",
                "description": v.name,
                "optimizer_properties": {},
            }
            for v in vertices
        ],
    }


def job_details(
    job: Any,
    vertices: Sequence[Any],
    latest: Mapping[VertexId, Any],
    timestamps: Mapping[str, int],
    *,
    max_par: int,
    now_ms: int,
    last_exception: Any | None = None,
) -> dict[str, Any]:
    """Flink's JobDetailsInfo plus `waiting-reason`, `restart-strategy`, `attempts`, `restarts`,
    `deployment` and `last-failure` (the newest entry of its exception history, summarised)."""
    start, end = ms(job.created_at), ms(job.end_at)
    stamps = dict.fromkeys(JOB_STATE_NAMES, 0)
    stamps.update({k: int(v) for k, v in timestamps.items()})
    return {
        "jid": job.id,
        "name": job.name,
        "isStoppable": False,
        "state": job.status,
        "job-type": job_type(job.config),
        "start-time": start,
        "end-time": end,
        "duration": _duration(start, end, now_ms),
        "maxParallelism": max_par,
        "now": now_ms,
        "timestamps": stamps,
        "vertices": [vertex_summary(v, latest.get(v.id), max_par, now_ms) for v in vertices],
        "status-counts": execution_state_counts(_state(latest.get(v.id)) for v in vertices),
        "plan": job_plan(job, vertices),
        "waiting-reason": waiting_reason(job, latest),
        "restart-strategy": dict(job.restart_strategy or {}),
        "attempts": attempts(latest),
        "restarts": restarts(latest),
        "schedule-id": getattr(job, "schedule_id", None),  # the schedule that started it, if any
        "deployment": getattr(job, "deployment", None),
        "last-failure": last_failure(last_exception),
    }


def exception_summary(row: Any) -> str | None:
    """An exception history entry as one line: its exception's type and message."""
    return summarize(f"{row.exception_name}: {row.stacktrace}")


def last_failure(row: Any | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"summary": exception_summary(row), "timestamp": ms(row.at), "attempt": row.attempt}


def job_config(job: Any) -> dict[str, Any]:
    """Flink's /jobs/:jobid/config (JobConfigInfo)."""
    return {
        "jid": job.id,
        "name": job.name,
        "execution-config": {
            "execution-mode": job_type(job.config),
            "restart-strategy": dict(job.restart_strategy or {}),
            "job-parallelism": job.parallelism,
            "object-reuse-mode": False,
            "user-config": dict(job.config or {}),
            "entry": job.entry,
            "kind": job.kind,
            "program-args": list(job.program_args or []),
            "artifact-id": job.artifact_id,
        },
    }


# --- vertices and attempts -----------------------------------------------------------------


def status_duration(timestamps: Mapping[str, int], current: str, now_ms: int) -> dict[str, int]:
    """Milliseconds spent in each of Flink's pre-terminal states (0 if never entered)."""
    entered = sorted(((int(t), s) for s, t in (timestamps or {}).items()), key=lambda p: p[0])
    out = {s: 0 for s in _STATUS_DURATION_STATES}
    for i, (t, s) in enumerate(entered):
        if s not in out:
            continue
        if i + 1 < len(entered):
            out[s] = max(0, entered[i + 1][0] - t)
        elif s == current and not ExecutionState(current).is_terminal:
            out[s] = max(0, now_ms - t)
    return out


def _endpoint(ex: Any, tm_hosts: Mapping[str, str]) -> str:
    if not ex.taskmanager_id:
        return UNASSIGNED
    return tm_hosts.get(ex.taskmanager_id, ex.taskmanager_id)


def subtask(ex: Any, tm_hosts: Mapping[str, str], now_ms: int) -> dict[str, Any]:
    start, end = ms(ex.start_at), ms(ex.end_at)
    return {
        "subtask": 0,
        "status": ex.state,
        "attempt": ex.attempt,
        "endpoint": _endpoint(ex, tm_hosts),
        "taskmanager-id": ex.taskmanager_id,
        "start-time": start,
        "end-time": end,
        "duration": _duration(start, end, now_ms),
        "status-duration": status_duration(ex.timestamps, ex.state, now_ms),
        "status-timestamps": {k: int(v) for k, v in (ex.timestamps or {}).items()},
        "metrics": _metrics(ex),
    }


def attempt(ex: Any, now_ms: int) -> dict[str, Any]:
    start, end = ms(ex.start_at), ms(ex.end_at)
    return {
        "attempt": ex.attempt,
        "execution-id": ex.id,
        "status": ex.state,
        "taskmanager-id": ex.taskmanager_id,
        "slots": list(ex.slots or []),
        "start-time": start,
        "end-time": end,
        "duration": _duration(start, end, now_ms),
        "timestamps": {k: int(v) for k, v in (ex.timestamps or {}).items()},
        "failure-cause": ex.failure_cause,
        "failure-summary": summarize(ex.failure_cause),  # its exception's type and message, one line
        "waiting-reason": ex.waiting_reason,
        # The last micro-batch this attempt committed (Spark's commit is the checkpoint barrier).
        "last-batch-id": ex.last_batch_id,
        "read-records": int(ex.rows_processed or 0),
        # The snapshot this attempt started from (None: a fresh start) and its checkpoint id.
        "restored-from": ex.restored_from,
        "restored-checkpoint-id": ex.restored_checkpoint_id,
    }


def vertex_details(
    vertex: Any, executions: Sequence[Any], tm_hosts: Mapping[str, str], *, max_par: int, now_ms: int, history: int = 16
) -> dict[str, Any]:
    """Flink's JobVertexDetailsInfo: the current attempt as subtask 0, plus every kept attempt."""
    ordered = sorted(executions, key=lambda e: e.attempt)
    current = ordered[-1] if ordered else None
    return {
        "id": vertex.id,
        "name": vertex.name,
        "parallelism": vertex.parallelism,
        "maxParallelism": max_par,
        "now": now_ms,
        "subtasks": [subtask(current, tm_hosts, now_ms)] if current is not None else [],
        "attempts": [attempt(e, now_ms) for e in ordered[-history:]],
    }


# --- exceptions ----------------------------------------------------------------------------


def exceptions(rows: Sequence[Any], tm_hosts: Mapping[str, str], *, limit: int) -> dict[str, Any]:
    """Flink 1.15+ JobExceptionsInfoWithHistory, newest first (rows arrive newest first)."""
    entries = [
        {
            "exceptionName": r.exception_name,
            "stacktrace": r.stacktrace,
            "summary": exception_summary(r),  # Headrace's: the exception's type and message
            "timestamp": ms(r.at),
            "taskName": r.vertex_name,
            "endpoint": tm_hosts.get(r.taskmanager_id, r.taskmanager_id) if r.taskmanager_id else None,
            "taskManagerId": r.taskmanager_id,
            "failureLabels": {},
            "concurrentExceptions": [],
            "attempt": r.attempt,
        }
        for r in rows[:limit]
    ]
    root = entries[0] if entries else None
    return {
        "root-exception": root["stacktrace"] if root else None,
        "timestamp": root["timestamp"] if root else None,
        "all-exceptions": [],
        "truncated": False,
        "exceptionHistory": {"entries": entries, "truncated": len(rows) > limit},
    }


# --- cluster and TaskManagers --------------------------------------------------------------


def cluster_overview(taskmanagers: Sequence[Any], job_counts: Mapping[str, int]) -> dict[str, Any]:
    return {
        "taskmanagers": len(taskmanagers),
        "slots-total": sum(tm.slots_total for tm in taskmanagers),
        "slots-available": sum(tm.slots_free for tm in taskmanagers),
        "jobs-running": sum(job_counts.get(s.value, 0) for s in _NON_TERMINAL_JOB),
        "jobs-finished": job_counts.get(JobStatus.FINISHED.value, 0),
        "jobs-cancelled": job_counts.get(JobStatus.CANCELED.value, 0),
        "jobs-failed": job_counts.get(JobStatus.FAILED.value, 0),
        "flink-version": FLINK_VERSION,
        "flink-commit": FLINK_COMMIT,
    }


def _resource(cores: float, memory_bytes: int, fraction: float) -> dict[str, Any]:
    return {
        "cpuCores": round(cores * fraction, 3),
        "taskHeapMemory": int(memory_bytes * fraction) // 2**20,  # MB, as Flink reports it
        "taskOffHeapMemory": 0,
        "managedMemory": 0,
        "networkMemory": 0,
        "extendedResources": {},
    }


def taskmanager_info(tm: Any) -> dict[str, Any]:
    free_fraction = tm.slots_free / tm.slots_total if tm.slots_total else 0.0
    return {
        "id": tm.id,
        "path": tm.queue,
        "host": tm.host,
        "dataPort": -1,
        "jmxPort": -1,
        "timeSinceLastHeartbeat": ms(tm.last_heartbeat),
        "slotsNumber": tm.slots_total,
        "freeSlots": tm.slots_free,
        "totalResource": _resource(tm.cores, tm.memory_bytes, 1.0),
        "freeResource": _resource(tm.cores, tm.memory_bytes, free_fraction),
        "hardware": {
            "cpuCores": int(round(tm.cores)),
            "physicalMemory": tm.memory_bytes,
            "freeMemory": int(tm.memory_bytes * free_fraction),
            "managedMemory": 0,
        },
        "memoryConfiguration": {"totalProcessMemory": tm.memory_bytes},
        "blocked": False,
        "last-lost-at": ms(tm.last_lost_at) if tm.last_lost_at else None,
        "last-lost-reason": tm.last_lost_reason,
        # REGISTERED, or LOST (listed with ?include=lost) with why; when: last-lost-at.
        "state": tm.state,
        "lost-reason": tm.lost_reason,
    }


def taskmanager_details(tm: Any, memory: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`memory`: the TaskManager's latest figure per execution (streams.tm_memory_key), shown on
    the slots its task holds."""
    out = taskmanager_info(tm)
    out["allocatedSlots"] = [
        {
            **{k: a.get(k) for k in ("index", "allocation_id", "job_id", "execution_id")},
            "memory": _task_memory((memory or {}).get(a.get("execution_id") or "")),
        }
        for a in (tm.allocations or [])
        if isinstance(a, dict)
    ]
    out["registered"] = ms(tm.registered_at)
    out["metrics"] = {}
    return out


def _task_memory(figure: Any) -> dict[str, Any] | None:
    """One task's memory figure as the TaskManager wrote it; None when absent or not a figure."""
    if not isinstance(figure, dict) or not isinstance(figure.get("used"), int):
        return None
    limit = figure.get("limit")
    return {
        "used": figure["used"],
        "limit": limit if isinstance(limit, int) else None,
        "measure": str(figure.get("measure") or ""),
    }


def taskmanagers(rows: Iterable[Any]) -> dict[str, Any]:
    return {"taskmanagers": [taskmanager_info(tm) for tm in rows]}


# --- jars ----------------------------------------------------------------------------------


def jar_entries(functions: Sequence[str] | None, default: str = "build") -> list[dict[str, Any]]:
    """Entry points of an artifact: its top-level functions, the default entry first."""
    names = list(functions or [])
    if not names:
        return [{"name": default, "description": None}]
    names.sort(key=lambda n: n != default)
    return [{"name": n, "description": None} for n in names]


def jar_file(artifact: Any, functions: Sequence[str] | None) -> dict[str, Any]:
    return {
        "id": artifact.id,
        "name": artifact.name,
        "uploaded": ms(artifact.uploaded_at),
        "entry": jar_entries(functions),
        # Not in Flink's shape: lets a client reuse a jar it already uploaded (headrace deploy apply).
        "sha256": artifact.sha256,
    }


def dashboard_config(
    *,
    refresh_interval_ms: int,
    timezone_name: str,
    timezone_offset_ms: int,
    spark_master: str = "local",
    spark_master_ui: str | None = None,
    kafka_bootstrap_servers: str | None = None,
) -> dict[str, Any]:
    return {
        "spark-master": spark_master,
        "spark-master-ui": spark_master_ui,
        "kafka-bootstrap-servers": kafka_bootstrap_servers,
        "refresh-interval": refresh_interval_ms,
        "timezone-name": timezone_name,
        "timezone-offset": timezone_offset_ms,
        "flink-version": FLINK_VERSION,
        "flink-revision": FLINK_COMMIT,
        "features": {"web-submit": True, "web-cancel": True, "web-rescale": False, "web-history": False},
    }
