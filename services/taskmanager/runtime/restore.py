"""Where a streaming attempt starts: its lineage (which sink writer it is) and its live
checkpoint, restored from a snapshot after the compatibility check (plan_signature.py) and after
every sink fenced off older attempts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared import checkpoint_storage as storage
from shared import job_options, restore_failure
from shared.task_protocol import TaskSpec

from .driver_io import PhaseLog


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
    return {"id": lin_id, "generation": generation, "fence": spec.fence_token or spec.attempt}


def sql_conf_keys(config: dict) -> dict[str, str]:
    """The `spark.sql.*` options of a job's configuration, with its state partition count chosen
    by Flink's name (pipeline.max-parallelism) or by the latency mode as Spark's shuffle
    partitions."""
    out = {k: str(v) for k, v in (config or {}).items() if isinstance(k, str) and k.startswith("spark.sql.")}
    partitions = job_options.chosen_state_partitions(config)
    if partitions is not None:
        out["spark.sql.shuffle.partitions"] = str(partitions)
    return out


def prepare_streaming(spec: TaskSpec, handle: Any, live: Path, restored_meta: dict | None, lineage: dict,
                      phases: PhaseLog) -> int:
    """Restore the snapshot (if any) into this attempt's fresh live directory and fence the
    sinks; returns the Spark batch id the attempt resumes after (-1: a fresh start)."""
    restored_batch = -1
    meta = restored_meta
    if meta is not None and int(meta.get("spark", {}).get("batch_id", -1)) >= 0:
        from .plan_signature import check_before_start

        phases.announce(f"restoring the snapshot {spec.restore_from}")
        assert spec.restore_from is not None  # restored_meta was read from it
        drop = check_before_start(handle.df, meta,
                                  shuffle_partitions=job_options.explicit_state_partitions(spec.config),
                                  allow_non_restored_state=spec.allow_non_restored_state,
                                  output_mode=handle.output_mode)
        with restore_failure.restoring(spec.restore_from):
            restore_failure.verify(spec.restore_from, meta)
            storage.restore(spec.restore_from, live, drop_operators=drop)
        restored_batch = int(meta["spark"]["batch_id"])
        print(f"restored {spec.restore_from} (batch {restored_batch}) into {live}", flush=True)
    prepare = getattr(handle, "prepare", None)
    if prepare is not None:
        from .connectors import SinkOwner

        # The owner lets each sink refuse a target another lineage owns (connectors/ownership.py).
        prepare(lineage["fence"], restored_batch, owner=SinkOwner(
            lineage=lineage["id"], job_id=spec.job_id, generation=lineage["generation"]))
    return restored_batch
