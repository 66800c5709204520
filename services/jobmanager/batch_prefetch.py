"""The rows a stream batch's handlers will touch, loaded and locked up front (JobMaster
.unit_of_work): messages are told apart by their type, not by the fields they happen to have."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy.orm import Session

from shared.catalog import repository as repo
from shared.catalog.models import Execution, Job
from shared.ids import ExecutionId, JobId, TaskManagerId
from shared.messages import (
    CancelJob,
    CheckpointAcknowledged,
    CheckpointDeclined,
    CommandRejected,
    Envelope,
    RequestCheckpoint,
    RequestSavepoint,
    SlotRequestFailed,
    SlotRequestPending,
    SlotsAllocated,
    SubmitJob,
    TaskManagerRegistered,
    TaskProgress,
    TaskStateChanged,
    TaskWaiting,
)

# The messages about one attempt, and those about one job (every message about an attempt is).
ABOUT_EXECUTION = (
    SlotsAllocated,
    SlotRequestPending,
    SlotRequestFailed,
    TaskStateChanged,
    TaskProgress,
    TaskWaiting,
    CommandRejected,
    CheckpointAcknowledged,
    CheckpointDeclined,
)
ABOUT_JOB = (*ABOUT_EXECUTION, SubmitJob, CancelJob, RequestCheckpoint, RequestSavepoint)


def execution_of(body: object) -> ExecutionId | None:
    return body.execution_id if isinstance(body, ABOUT_EXECUTION) else None


def job_of(body: object) -> JobId | None:
    return body.job_id if isinstance(body, ABOUT_JOB) else None


def prefetch(s: Session, envelopes: Sequence[Envelope]) -> tuple[dict[TaskManagerId, list[Execution]], list[JobId]]:
    """Load and lock, in four statements, every row the batch's handlers will touch, so they run
    without a round trip each (executions before jobs: the handlers' lock order). Returns the
    live executions the catalog places on each TaskManager that registers in this batch (one
    statement for all of them: 10,000 registrations after a restart were 10,000 queries), and
    the jobs whose attempts the batch may deploy."""
    bodies = [e.body for e in envelopes]
    deploying = list(dict.fromkeys(b.job_id for b in bodies if isinstance(b, SlotsAllocated)))
    registering = [b.taskmanager_id for b in bodies if isinstance(b, TaskManagerRegistered)]
    live_on: dict[TaskManagerId, list[Execution]] = {tm: [] for tm in registering}
    if registering:
        for ex in repo.live_executions_on_any(s, registering):
            live_on[ex.placed_on()].append(ex)
    executions = repo.lock_rows(s, Execution, {x for b in bodies if (x := execution_of(b))})
    job_ids = {j for b in bodies if (j := job_of(b))} | {e.job_id for e in executions}
    jobs = repo.lock_rows(s, Job, job_ids)
    # Vertices and artifacts only for the deploys: state reports and submissions do not read
    # them, and loading 500 of each per batch of reports cost more than the reports.
    wanted = set(deploying)
    deploying_jobs = [j for j in jobs if j.id in wanted]
    if deploying_jobs:
        repo.pin(s, repo.vertices_of_jobs(s, [j.id for j in deploying_jobs]))
        artifact_ids = {j.artifact_id for j in deploying_jobs if j.artifact_id}
        if artifact_ids:
            repo.pin(s, repo.artifacts_by_ids(s, artifact_ids))
    return live_on, deploying
