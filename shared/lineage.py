"""Which sink writer an attempt is: its lineage, from the snapshot it restores.

The driver names its sinks by it (services/taskmanager/runtime/restore.py), and the TaskManager
decides by it who may have a files sink's directory (services/taskmanager/tasks/storage.py,
tasks/sink_claims.py), on the snapshot metadata it trusts: one rule for both.
"""

from __future__ import annotations

from shared.task_protocol import TaskSpec

__all__ = ["lineage_of"]


def lineage_of(spec: TaskSpec, restored: dict | None) -> dict:
    """Which sink writer this attempt is. Sinks are named by lineage (the first job of a chain
    of jobs that resumed from each other's savepoints), so a job resumed from a savepoint takes
    over its predecessor's sinks, rewinds them to the savepoint and fences the predecessor off.
    The fence token is the JobManager's (it grows with every deployed attempt of any job)."""
    lineage = (restored or {}).get("lineage") or {}
    if restored is None or not lineage.get("id"):
        lin_id, generation = spec.job_id, 0
    elif restored.get("job_id") == spec.job_id:
        lin_id, generation = lineage["id"], int(lineage.get("generation", 0))
    else:
        lin_id, generation = lineage["id"], int(lineage.get("generation", 0)) + 1
    # The control plane's word wins over the snapshot's (a file the pipeline itself writes): its
    # Redis user reaches only that lineage's sink bookkeeping (shared/pipeline_redis.py).
    return {"id": spec.lineage_id or lin_id, "generation": generation, "fence": spec.fence_token or spec.attempt}
