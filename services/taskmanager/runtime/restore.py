"""Where a streaming attempt starts: its lineage (which sink writer it is) and its live
checkpoint, restored from a snapshot after the compatibility check (plan_signature.py) and after
every sink fenced off older attempts."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared import checkpoint_storage as storage
from shared import job_options, restore_failure
from shared.task_protocol import TaskSpec

from . import grants
from .driver_io import PhaseLog


def sql_conf_keys(config: dict) -> dict[str, str]:
    """The `spark.sql.*` options of a job's configuration, with its state partition count chosen
    by Flink's name (pipeline.max-parallelism) or by the latency mode as Spark's shuffle
    partitions."""
    out = {k: str(v) for k, v in (config or {}).items() if isinstance(k, str) and k.startswith("spark.sql.")}
    partitions = job_options.chosen_state_partitions(config)
    if partitions is not None:
        out["spark.sql.shuffle.partitions"] = str(partitions)
    return out


def prepare_streaming(
    spec: TaskSpec, handle: Any, live: Path, restored_meta: dict | None, lineage: dict, phases: PhaseLog
) -> int:
    """Restore the snapshot (if any) into this attempt's fresh live directory and fence the
    sinks; returns the Spark batch id the attempt resumes after (-1: a fresh start).

    A two-phase sink may have committed a newer checkpoint of this job than the one restored
    (the acknowledgement of its snapshot was lost with the driver): it says so, and that
    snapshot, complete on disk before the sink committed, is restored instead."""
    from .connectors import SinkOwner
    from .connectors.sinks import SinkAheadOfRestore

    owner = SinkOwner(lineage=lineage["id"], job_id=spec.job_id, generation=lineage["generation"])
    early = None
    if handle.on_early_fence is not None and _has_snapshot(spec.restore_from, restored_meta):
        early = EarlyFencing(handle.on_early_fence, lineage["fence"], owner)
    restored_batch = _restore(spec, handle, live, spec.restore_from, restored_meta, phases)
    if early is not None:
        early.result()
    handle.restored_sink = (restored_meta or {}).get("sink")  # what the sink recorded in the snapshot
    try:
        # The owner lets each sink refuse a target another lineage owns (connectors/ownership.py).
        handle.prepare(lineage["fence"], restored_batch, owner=owner)
    except SinkAheadOfRestore as ahead:
        try:
            source = grants.readable(ahead.path)  # through the TaskManager: it is root's
            meta = storage.read_metadata(source)
            restore_failure.verify(source, meta)
        except Exception as exc:  # noqa: BLE001 - whatever keeps it from being read, it cannot be used
            print(
                f"{ahead}, but that checkpoint cannot be read ({type(exc).__name__}: {exc}): going on from batch "
                f"{restored_batch}; the batches after it are written to the sink again",
                flush=True,
            )
            handle.prepare(lineage["fence"], restored_batch, owner=owner)  # the sink takes it as a rewind now
            return restored_batch
        print(f"{ahead}: restoring that checkpoint instead, so that nothing is written twice", flush=True)
        shutil.rmtree(live, ignore_errors=True)
        restored_batch = _restore(spec, handle, live, source, meta, phases)
        handle.restored_sink = meta.get("sink")
        handle.prepare(lineage["fence"], restored_batch, owner=owner)
    return restored_batch


class EarlyFencing:
    """A sink's fencing steps that need no restored batch, on a thread of their own while the
    snapshot is restored: each is a network round trip, the restore is file copies. If the
    restore fails, the thread is left to end by itself (its calls are bounded) and the task fails
    with the restore's error."""

    JOIN_TIMEOUT_S = 600.0  # above the sink's own bound on its broker calls

    def __init__(self, fence_early: Callable[[int, Any], None], fence: int, owner: Any) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(fence_early, fence, owner), name="early-sink-fencing", daemon=True
        )
        self._thread.start()

    def _run(self, fence_early: Callable[[int, Any], None], fence: int, owner: Any) -> None:
        try:
            fence_early(fence, owner)
        except BaseException as exc:  # noqa: BLE001 - handed to the task's thread by result()
            self._error = exc

    def result(self) -> None:
        """Wait for the fencing; raise what it raised."""
        self._thread.join(self.JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            raise TimeoutError(f"fencing the sinks did not end within {self.JOIN_TIMEOUT_S:.0f} s")
        if self._error is not None:
            raise self._error


def _has_snapshot(source: str | None, meta: dict | None) -> bool:
    return source is not None and meta is not None and int(meta.get("spark", {}).get("batch_id", -1)) >= 0


def _restore(spec: TaskSpec, handle: Any, live: Path, source: str | None, meta: dict | None, phases: PhaseLog) -> int:
    """Copy the snapshot at `source` (metadata `meta`) into `live` after the compatibility
    check; the batch it restores (-1: none)."""
    if not _has_snapshot(source, meta):
        return -1
    assert source is not None and meta is not None
    from .plan_signature import check_before_start

    phases.announce(f"restoring the snapshot {source}")
    drop = check_before_start(
        handle.df,
        meta,
        shuffle_partitions=job_options.explicit_state_partitions(spec.config),
        allow_non_restored_state=spec.allow_non_restored_state,
        output_mode=handle.output_mode,
    )
    with restore_failure.restoring(source):
        restore_failure.verify(source, meta)
        storage.restore(source, live, drop_operators=drop)
    restored_batch = int(meta["spark"]["batch_id"])
    print(f"restored {source} (batch {restored_batch}) into {live}", flush=True)
    return restored_batch
