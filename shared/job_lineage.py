"""Which lineage a job belongs to, as the control plane knows it (issue 43.5).

A lineage is the chain of jobs that restore from each other's snapshots (restarts, a job
resumed from a savepoint, a deployment's upgrades and rollbacks); its id is the first job's id.
Sinks are named by it (`<lineage>:<name>`), and it decides whose Redis sink bookkeeping a task
may touch (shared/pipeline_redis.py) and which pipelines database a task gets when the cluster
keeps one per lineage (shared/pipeline_databases.py). The driver used to read it from the
snapshot it restores, a file its own pipeline writes; here it is decided from the catalog
instead: by the JobManager, which hands it to the task in its TaskSpec, and by the dispatcher,
which shows it in a job's details:

- a job started fresh is its own lineage;
- a job started from a snapshot the catalog records (a checkpoint or savepoint of job K) is K's
  lineage;
- a job started from a snapshot the catalog does not know (taken by another cluster, copied in by
  an operator) is the lineage that snapshot names, else its own.

Decided once per job and kept (per process): the answer never changes for a job.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from shared import checkpointing
from shared.catalog import repository as repo
from shared.catalog.models import Job
from shared.checkpoint_storage.layout import local_path, read_metadata
from shared.ids import JobId
from shared.pipeline_redis import LINEAGE_ID

log = logging.getLogger("headrace.jobmanager")
METADATA_FILE = "_metadata"
MAX_DEPTH = 64  # jobs resumed from jobs resumed from ...: far beyond any real chain


class Lineages:
    def __init__(self) -> None:
        self._of: dict[JobId, str] = {}

    def of(self, s: Session, job: Job, depth: int = 0) -> str:
        known = self._of.get(job.id)
        if known is not None:
            return known
        path = (job.config or {}).get(checkpointing.RESTORE_PATH)
        lineage = self.continued(s, path, job.id, depth) if isinstance(path, str) and path else None
        self._of[job.id] = lineage or str(job.id)
        return self._of[job.id]

    def continued(self, s: Session, path: str, job_id: JobId, depth: int = 0) -> str | None:
        """The lineage a job `job_id` starting from the snapshot at `path` continues; None when it
        starts one of its own (the dispatcher asks before the job exists)."""
        if depth >= MAX_DEPTH:
            return None
        owner = _owner(s, path, job_id)
        owner_job = repo.find_job(s, owner) if owner is not None else None
        if owner_job is not None:
            return self.of(s, owner_job, depth + 1)
        return _claimed(path) if owner is None else None


def _variants(path: str) -> list[str]:
    """The ways the catalog may have recorded the snapshot directory `path` names."""
    try:
        p = local_path(path)
    except Exception:  # noqa: BLE001 - not a path of ours: no snapshot row names it
        return [path]
    directory = p.parent if p.name == METADATA_FILE else p
    return list(dict.fromkeys([path, str(directory), f"{directory}/"]))


def _owner(s: Session, path: str, job_id: JobId) -> JobId | None:
    """The job whose snapshot `path` is (not `job_id`'s own claim of it), or None."""
    return repo.snapshot_owner(s, _variants(path), other_than=job_id)


def _claimed(path: str) -> str | None:
    """The lineage a snapshot unknown to the catalog names in its metadata, if a valid one."""
    try:
        claimed = (read_metadata(path).get("lineage") or {}).get("id")
    except Exception as exc:  # noqa: BLE001 - unreadable: the driver reports the restore's failure
        log.info("lineage of snapshot %s not readable (%s): the job starts a lineage of its own", path, exc)
        return None
    return claimed if isinstance(claimed, str) and LINEAGE_ID.fullmatch(claimed) else None
