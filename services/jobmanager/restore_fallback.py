"""Restarts that can help: an attempt whose snapshot could not be restored does not restart from
it again (shared/restore_failure.py says how the driver tells such a failure apart).

  * a checkpoint (or a savepoint the job took) that failed to restore is marked in the catalog,
    DISCARDED with "restore failed: <reason>" (its files stay for inspection, retention never
    touches them), and leaves the checkpoint store: the next attempt starts from the previous
    retained checkpoint, or else from the savepoint the job was submitted with;
  * nothing older to fall back to: the job fails (permanently) rather than start over from
    nothing, which would re-read its sources from the start behind the operator's back;
  * the savepoint the job was submitted to start from is never silently replaced: the job fails
    with the reason.
The job's exception history says which snapshot failed, why, and where the restart starts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from shared import restore_failure
from shared.catalog import repository as repo
from shared.catalog.models import Execution, Job
from shared.states import CheckpointStatus as CS

if TYPE_CHECKING:
    from services.jobmanager.checkpoint_coordinator import CheckpointCoordinator

log = logging.getLogger("headrace.jobmanager")

RESTORE_FAILED = restore_failure.NAME


def reason_of(cause: str) -> str:
    """The driver's message from the traceback text of its FAILED report."""
    marker = f"{RESTORE_FAILED}: "
    for line in reversed((cause or "").splitlines()):
        if marker in line:
            return line.split(marker, 1)[1].strip()
    lines = [line for line in (cause or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no reason given"


def fall_back(s, checkpoints: "CheckpointCoordinator", job: Job, ex: Execution, cause: str) -> tuple[str, bool]:
    """Called in the failing attempt's unit of work: mark what failed, choose what comes next.
    Returns the cause to record (a summary line, then the driver's traceback) and whether the
    failure is permanent (the job fails instead of restarting)."""
    reason = reason_of(cause)
    failed_id, failed_path = ex.restored_checkpoint_id, ex.restored_from
    if failed_id is None:
        summary = (
            f"the savepoint {failed_path} the job was submitted to start from could not be restored "
            f"({reason}); the job fails rather than start without it: repair or replace the savepoint and "
            f"submit the job again"
        )
        return _log(job, summary, cause, permanent=True)
    try:
        row = repo.get_checkpoint(s, job.id, failed_id, lock=True)
    except repo.NotFound:
        row = None
    what = f"{row.kind if row is not None else 'checkpoint'} {failed_id}"
    if row is not None and row.status == CS.COMPLETED.value:
        repo.transition_checkpoint(s, row, CS.DISCARDED, failure_cause=f"restore failed: {reason}")
    checkpoints.store.remove(s, job.id, failed_id)
    next_path, next_id = checkpoints.restore_point(s, job)
    if next_path is None or next_path == failed_path:
        summary = (
            f"{what} could not be restored ({reason}), and the job has no older retained checkpoint to "
            f"fall back to: it fails rather than start over from nothing; submit it again from a "
            f"savepoint, or without one to start afresh"
        )
        return _log(job, summary, cause, permanent=True)
    where = f"checkpoint {next_id}" if next_id is not None else f"the savepoint it was submitted with ({next_path})"
    summary = f"{what} could not be restored ({reason}); restarting from {where}"
    return _log(job, summary, cause, permanent=False)


def _log(job: Job, summary: str, cause: str, *, permanent: bool) -> tuple[str, bool]:
    log.warning("job %s: %s", job.id, summary)
    return f"{summary}\n\n{cause}", permanent
