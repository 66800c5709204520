"""Checkpoint rows, operations and checkpoint options -> Flink 2.3's REST shapes
(CheckpointingStatistics, CheckpointStatistics, CheckpointConfigInfo, AsynchronousOperationResult).
Pure functions like `shapes.py`'s: rows (or anything with the same attributes) in, plain dicts out.

Headrace takes one snapshot per task (a vertex's Spark query), so every checkpoint has one
subtask; alignment, processed and persisted data do not exist here and are reported as 0.
"""

from __future__ import annotations

import math
import re
from typing import Any, Collection, Iterable, Mapping, Sequence

from services.dispatcher.views.java_throwable import failure_cause
from shared.catalog.models import epoch_ms
from shared.checkpointing import CheckpointConfig
from shared.states import CheckpointStatus, OperationStatus

LONG_MAX = 0x7FFFFFFFFFFFFFFF  # Flink's interval when periodic checkpoints are off
HISTORY_SIZE = 10  # Flink's web.checkpoints.history
SNAPSHOT_FAILURE = "org.apache.flink.runtime.checkpoint.CheckpointException"
OPERATION_FAILURE = "org.apache.flink.util.FlinkException"
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.$]*(?:Error|Exception|Exit|Interrupt|Failure)):\s*(.*)$")


def location_uri(path: str | None) -> str | None:
    """A snapshot path as Flink prints it: `file:/dir/savepoint-…` (Path.toString of a local URI)."""
    if not path:
        return None
    if path.startswith("file:"):
        path = "/" + path[len("file:") :].lstrip("/")
    return f"file:{path}" if path.startswith("/") else path


def _ms(dt) -> int:
    return epoch_ms(dt)


# --- asynchronous operations ----------------------------------------------------------------


def _cause(text: str | None, default_class: str) -> dict[str, Any]:
    """A failure text (a message, or a Python traceback) as Flink's SerializedThrowable JSON."""
    text = (text or "unknown failure").strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()] or [text]
    last = _EXCEPTION_LINE.match(lines[-1])
    if last is not None:
        class_name, message = last.group(1), last.group(2)
    else:
        class_name = default_class
        message = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return failure_cause(class_name, message, text)


def _waiting(wait: Any) -> dict[str, Any] | None:
    """A snapshot request waiting for its task to run (services/jobmanager/snapshot_requests.py):
    why, since when and until when (epoch ms). Not Flink's: its clients read past unknown keys."""
    if not isinstance(wait, dict) or not wait.get("reason"):
        return None
    return {
        "reason": str(wait["reason"]),
        "since": int(float(wait.get("since") or 0) * 1000),
        "deadline": int(float(wait.get("deadline") or 0) * 1000),
    }


def operation_result(op: Any, result: str) -> dict[str, Any]:
    """Flink's AsynchronousOperationResult of one operation row. `result` names the body of a
    finished one: "savepoint" (SavepointInfo: location / failure-cause), "checkpoint"
    (CheckpointInfo: checkpointId / failureCause) or "info" (AsynchronousOperationInfo: {} /
    failure-cause, for disposal and rescaling)."""
    status = OperationStatus(op.status)
    if status == OperationStatus.IN_PROGRESS:
        waiting = _waiting((getattr(op, "params", None) or {}).get("waiting"))
        return {"status": {"id": "IN_PROGRESS"}, "operation": None, **({"waiting": waiting} if waiting else {})}
    failed = status == OperationStatus.FAILED
    if result == "checkpoint":
        body = (
            {"failureCause": _cause(op.failure_cause, SNAPSHOT_FAILURE)}
            if failed
            else {"checkpointId": op.checkpoint_id}
        )
    elif result == "savepoint":
        body = (
            {"failure-cause": _cause(op.failure_cause, SNAPSHOT_FAILURE)}
            if failed
            else {"location": location_uri(op.location)}
        )
    else:
        body = {"failure-cause": _cause(op.failure_cause, OPERATION_FAILURE)} if failed else {}
    # A failed operation is still COMPLETED: the failure is its result (Flink's convention).
    return {"status": {"id": "COMPLETED"}, "operation": body}


# --- statistics -------------------------------------------------------------------------------


def _is_completed(row: Any) -> bool:
    return row.status in (CheckpointStatus.COMPLETED.value, CheckpointStatus.DISCARDED.value)


def _checkpoint_type(row: Any) -> str:
    if row.kind != "savepoint":
        return "CHECKPOINT"
    # Stop-with-savepoint is Flink's synchronous savepoint: the task does not go on afterwards.
    return "SYNC_SAVEPOINT" if row.after in ("stop", "rescale") else "SAVEPOINT"


def checkpoint_statistics(row: Any, now_ms: int, *, tasks: bool = False) -> dict[str, Any]:
    """Flink's CheckpointStatistics of one row (completed, failed or in_progress)."""
    trigger = _ms(row.trigger_at)
    completed = _is_completed(row)
    failed = row.status == CheckpointStatus.FAILED.value
    ack = _ms(row.ack_at) if row.ack_at is not None else -1
    if row.duration_ms is not None:
        duration = int(row.duration_ms)
    elif completed and ack >= 0:
        duration = max(0, ack - trigger)
    elif not completed and not failed:
        duration = max(0, now_ms - trigger)
    else:
        duration = 0
    size = int(row.state_size or 0)
    status = "COMPLETED" if completed else row.status
    out: dict[str, Any] = {
        "className": "completed" if completed else ("failed" if failed else "in_progress"),
        "id": int(row.checkpoint_id),
        "status": status,
        "is_savepoint": row.kind == "savepoint",
        "savepointFormat": "CANONICAL" if row.kind == "savepoint" else None,
        "trigger_timestamp": trigger,
        "latest_ack_timestamp": ack,
        "checkpointed_size": size,
        "state_size": size,
        "end_to_end_duration": duration,
        "alignment_buffered": 0,
        "processed_data": 0,
        "persisted_data": 0,
        "num_subtasks": 1,
        "num_acknowledged_subtasks": 1 if completed else 0,
        "checkpoint_type": _checkpoint_type(row),
        "tasks": {},
        # Headrace: the Spark micro-batch the snapshot holds (its barrier).
        "batch_id": row.batch_id,
    }
    if completed:
        out["external_path"] = location_uri(row.path)
        out["discarded"] = row.status == CheckpointStatus.DISCARDED.value
        if row.failure_cause:  # discarded because it could not be restored (restore_fallback.py)
            out["failure_message"] = row.failure_cause
    elif failed:
        out["failure_timestamp"] = trigger + duration if duration else (ack if ack >= 0 else trigger)
        out["failure_message"] = row.failure_cause
    if tasks and row.vertex_id:
        out["tasks"] = {
            row.vertex_id: {
                k: out[k]
                for k in (
                    "id",
                    "status",
                    "latest_ack_timestamp",
                    "checkpointed_size",
                    "state_size",
                    "end_to_end_duration",
                    "alignment_buffered",
                    "processed_data",
                    "persisted_data",
                    "num_subtasks",
                    "num_acknowledged_subtasks",
                )
            }
        }
    if tasks:
        out["source_offsets"] = list(row.source_offsets or [])
        out["execution_id"] = row.execution_id
    return out


def _percentile(ordered: Sequence[int], q: float) -> float:
    """Flink's (Commons Math) percentile estimate, R-6: position q * (n + 1)."""
    n = len(ordered)
    if n == 0:
        return 0.0
    pos = q * (n + 1)
    if pos < 1:
        return float(ordered[0])
    if pos >= n:
        return float(ordered[-1])
    low = math.floor(pos)
    return float(ordered[low - 1] + (pos - low) * (ordered[low] - ordered[low - 1]))


def stats_summary(values: Iterable[int]) -> dict[str, Any]:
    """Flink's StatsSummaryDto; all zeros when there is nothing to summarise."""
    ordered = sorted(int(v) for v in values)
    if not ordered:
        return {"min": 0, "max": 0, "avg": 0, "p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "p999": 0.0}
    return {
        "min": ordered[0],
        "max": ordered[-1],
        "avg": sum(ordered) // len(ordered),
        "p50": _percentile(ordered, 0.5),
        "p90": _percentile(ordered, 0.9),
        "p95": _percentile(ordered, 0.95),
        "p99": _percentile(ordered, 0.99),
        "p999": _percentile(ordered, 0.999),
    }


def restored_statistics(execution: Any | None, savepoint_paths: Collection[str] = frozenset()) -> dict[str, Any] | None:
    """Flink's RestoredCheckpointStatistics of the latest attempt that started from a snapshot."""
    if execution is None or not execution.restored_from:
        return None
    path = execution.restored_from
    stamps = execution.timestamps or {}
    when = int(
        stamps.get("INITIALIZING") or stamps.get("DEPLOYING") or stamps.get("CREATED") or _ms(execution.start_at)
    )
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return {
        "id": int(execution.restored_checkpoint_id) if execution.restored_checkpoint_id is not None else -1,
        "restore_timestamp": when,
        "is_savepoint": path in savepoint_paths or name.startswith("savepoint-"),
        "external_path": location_uri(path),
    }


def checkpointing_statistics(
    *,
    counts: Mapping[str, int],
    restored_count: int,
    summary_rows: Sequence[Any],
    latest_completed: Any | None,
    latest_savepoint: Any | None,
    latest_failed: Any | None,
    restored: dict[str, Any] | None,
    history: Sequence[Any],
    now_ms: int,
) -> dict[str, Any]:
    """Flink's CheckpointingStatistics. `counts` maps CheckpointStatus values to row counts;
    `summary_rows` are the completed rows the summary is computed over (a bounded window, as
    Flink's histograms are); `history` is newest first."""
    completed = counts.get(CheckpointStatus.COMPLETED.value, 0) + counts.get(CheckpointStatus.DISCARDED.value, 0)
    in_progress = counts.get(CheckpointStatus.IN_PROGRESS.value, 0)
    failed = counts.get(CheckpointStatus.FAILED.value, 0)
    sizes = [int(r.state_size or 0) for r in summary_rows]
    durations = [checkpoint_statistics(r, now_ms)["end_to_end_duration"] for r in summary_rows]
    zeros = [0] * len(summary_rows)
    summary = {
        "checkpointed_size": stats_summary(sizes),
        "state_size": stats_summary(sizes),
        "end_to_end_duration": stats_summary(durations),
        "alignment_buffered": stats_summary(zeros),
        "processed_data": stats_summary(zeros),
        "persisted_data": stats_summary(zeros),
    }
    return {
        "counts": {
            "restored": restored_count,
            "total": completed + in_progress + failed,
            "in_progress": in_progress,
            "completed": completed,
            "failed": failed,
        },
        "summary": summary,
        "latest": {
            "completed": checkpoint_statistics(latest_completed, now_ms) if latest_completed is not None else None,
            "savepoint": checkpoint_statistics(latest_savepoint, now_ms) if latest_savepoint is not None else None,
            "failed": checkpoint_statistics(latest_failed, now_ms) if latest_failed is not None else None,
            "restored": restored,
        },
        "history": [checkpoint_statistics(r, now_ms) for r in history],
    }


# --- configuration ----------------------------------------------------------------------------


def _state_backend(job_config: Mapping[str, Any] | None) -> str:
    provider = str((job_config or {}).get("spark.sql.streaming.stateStore.providerClass") or "")
    if not provider or provider.endswith("HDFSBackedStateStoreProvider"):
        return "hashmap"  # Spark's default store keeps state on the heap, like Flink's hashmap backend
    if "RocksDB" in provider:
        return "rocksdb"
    return provider.rsplit(".", 1)[-1]


def checkpoint_config_info(cfg: CheckpointConfig, job_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Flink's CheckpointConfigInfo, plus `options`: the effective options under Flink's names."""
    return {
        "mode": "exactly_once",
        "interval": int(round(cfg.interval_s * 1000)) if cfg.interval_s is not None else LONG_MAX,
        "timeout": int(round(cfg.timeout_s * 1000)),
        "min_pause": int(round(cfg.min_pause_s * 1000)),
        "max_concurrent": cfg.max_concurrent,
        "externalization": {"enabled": True, "delete_on_cancellation": cfg.retention == "DELETE_ON_CANCELLATION"},
        "state_backend": _state_backend(job_config),
        "checkpoint_storage": "FileSystemCheckpointStorage",
        "unaligned_checkpoints": False,
        "tolerable_failed_checkpoints": cfg.tolerable_failures,
        "aligned_checkpoint_timeout": 0,
        "checkpoints_after_tasks_finish": True,
        "state_changelog_enabled": False,
        "changelog_periodic_materialization_interval": 0,
        "changelog_storage": "memory",
        "options": cfg.as_flink(),
    }
