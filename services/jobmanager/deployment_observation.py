"""What the deployments' reconciler (services/jobmanager/deployment_reconciler.py) observes of a
deployment before it decides: its row, its job and that job's attempts, failures, checkpoints and
snapshots, its pending step's operation and the specs of its stable and blocked generations, read
from the catalog into shared/deployments.py's `Observed`. Read only, inside the reconciler's unit of
work (the row is locked by then); the rules that judge it are shared/deployments.py's `decide`.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy.orm import Session

from shared import deployments as dep
from shared.catalog import repository as repo
from shared.catalog.models import DeploymentRow
from shared.catalog.repository import deployments as deployments_repo
from shared.deployment_rollback import INFRASTRUCTURE_FAILURES
from shared.failure_summary import summarize
from shared.states import ExecutionState as ES
from shared.states import JobStatus as JS


def observe(s: Session, row: DeploymentRow, now: float) -> dep.Observed:
    """The deployment as the catalog holds it at `now` (wall-clock seconds)."""
    job = _job_view(s, row, now) if row.job_id else None
    pending = row.pending or None
    operation = None
    if pending and pending.get("op"):
        try:
            op = repo.get_operation(s, pending["op"])
            done_ago = now - _seconds(op.done_at) if op.done_at else None
            operation = dep.OperationView(op.id, op.status, op.location, op.failure_cause, done_ago)
        except repo.NotFound:
            operation = dep.OperationView(pending["op"], "FAILED", failure="its operation row is gone")
    generations = (row.stable_generation, row.blocked_generation)
    stable_spec, blocked_spec = (_generation_spec(s, row.name, g) for g in generations)
    spec = dep.DeploymentSpec.from_record(row.spec)
    deployed_ago = now - _seconds(row.deployed_at) if row.deployed_at else None
    last_periodic = _seconds(row.last_periodic_savepoint_at or row.deployed_at) if row.deployed_at else now
    savepoint_due = bool(spec.savepoint_interval_s) and now - last_periodic >= (spec.savepoint_interval_s or 0)
    return dep.Observed(
        generation=row.generation,
        spec=spec,
        lifecycle=dep.Lifecycle(row.lifecycle) if row.lifecycle else None,
        job=job,
        job_generation=row.job_generation,
        stable_generation=row.stable_generation,
        stable_spec=stable_spec,
        rollback_point=row.rollback_point,
        last_savepoint=row.last_savepoint,
        blocked_generation=row.blocked_generation,
        pending=pending,
        operation=operation,
        deployed_s_ago=deployed_ago,
        deleting=row.deleting,
        delete_with_savepoint=row.delete_with_savepoint,
        rollback_requested=row.rollback_requested,
        savepoint_due=savepoint_due,
        now_s=now,
        parallelism=spec.effective_parallelism(row.parallelism),
        scaled_from=row.scaled_from,
        blocked_spec=blocked_spec,
    )


def _seconds(dt: datetime) -> float:
    """A catalog timestamp as wall-clock seconds (SQLite hands them back without a zone: UTC)."""
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def _generation_spec(s: Session, name: str, generation: int | None) -> dep.DeploymentSpec | None:
    rec = deployments_repo.generation_spec(s, name, generation) if generation is not None else None
    return dep.DeploymentSpec.from_record(rec) if rec else None


def _job_view(s: Session, row: DeploymentRow, now: float) -> dep.JobView | None:
    assert row.job_id is not None  # observe() asks only for a deployment that has a job
    job = repo.find_job(s, row.job_id)
    if job is None:
        return None
    since = row.deployed_at or job.created_at
    latest = list(repo.latest_executions(s, job.id).values())
    running = job.status == JS.RUNNING.value and bool(latest) and all(e.state == ES.RUNNING.value for e in latest)
    failed = [
        e
        for e in repo.failed_executions_since(s, job.id, since)
        if not (e.failure_cause or "").startswith(INFRASTRUCTURE_FAILURES)
    ]
    newest_ack = repo.newest_checkpoint_ack(s, job.id)
    failure = failed[0].failure_cause if failed else None
    return dep.JobView(
        id=job.id,
        status=job.status,
        terminal=JS(job.status).is_terminal,
        running=running,
        failures_since_deploy=len(failed),
        checkpoint_since_deploy=newest_ack is not None and _seconds(newest_ack) >= _seconds(since),
        newest_checkpoint_age_s=now - _seconds(newest_ack or since),
        latest_snapshot=repo.newest_snapshot_path(s, job.id),
        failure=summarize(failure),
        parallelism=max((v.parallelism for v in repo.job_vertices(s, job.id)), default=None),
    )
