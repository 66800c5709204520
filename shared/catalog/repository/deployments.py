"""Deployments: the dispatcher writes the desired spec (a new generation when it changes), asks
for a rollback or a deletion; the leading JobManager's reconciler writes the status, the history
and the savepoints, in a unit of work fenced like any other. The lifecycle state changes only
through `transition_deployment`, which keeps to its machine (shared/states.py
`DEPLOYMENT_TRANSITIONS`)."""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from shared.catalog.models import (
    AutoscalerEvaluation,
    DeploymentEvent,
    DeploymentGeneration,
    DeploymentRow,
    DeploymentSavepoint,
    Job,
    utcnow,
)
from shared.catalog.repository.jobs import create_job
from shared.catalog.repository.rows import NotFound
from shared.errors import CoordinationError
from shared.ids import JobId
from shared.states import Lifecycle, check_deployment_transition


def get_deployment(s: Session, name: str, *, lock: bool = False) -> DeploymentRow:
    q = select(DeploymentRow).where(DeploymentRow.name == name)
    if lock:
        q = q.with_for_update()
    row = s.execute(q).scalar_one_or_none()
    if row is None:
        raise NotFound(f"deployment {name} not found")
    return row


def list_deployments(s: Session) -> Sequence[DeploymentRow]:
    return s.execute(select(DeploymentRow).order_by(DeploymentRow.name)).scalars().all()


# A deployment's fields that say what is wanted of it, and its lifecycle: while none of them
# changes, a SUSPENDED deployment that needed nothing still needs nothing.
DESIRED_FIELDS = (
    DeploymentRow.name,
    DeploymentRow.generation,
    DeploymentRow.lifecycle,
    DeploymentRow.pending,
    DeploymentRow.deleting,
    DeploymentRow.rollback_requested,
    DeploymentRow.updated_at,
)


def desired_states(s: Session) -> Sequence[Any]:
    """Every deployment's DESIRED_FIELDS, by name, unlocked (one row each, its columns by name)."""
    return s.execute(select(*DESIRED_FIELDS).order_by(DeploymentRow.name)).all()


def transition_deployment(s: Session, row: DeploymentRow, target: Lifecycle) -> DeploymentRow:
    """The only function that changes `deployments.lifecycle`. Raises IllegalTransition. Moving
    to the state it is in changes nothing; the caller holds the row locked and records the
    step in the history (`record_deployment_event`)."""
    current = Lifecycle(row.lifecycle) if row.lifecycle else None
    if current == target:
        return row
    check_deployment_transition(current, target)
    row.lifecycle = target.value
    return row


def put_deployment(
    s: Session, name: str, spec: dict[str, Any], *, expected_generation: int | None = None
) -> tuple[DeploymentRow, bool]:
    """Create the deployment or change its spec. A different spec is a new generation; the same
    one again clears a refusal or failure of that generation, so applying it again retries.
    `expected_generation`: raise GenerationMismatch unless the deployment is at it (0: absent)."""
    try:
        row = get_deployment(s, name, lock=True)
    except NotFound:
        if expected_generation:
            raise GenerationMismatch(name, expected_generation, 0) from None
        now = utcnow()
        row = DeploymentRow(
            name=name,
            spec=spec,
            generation=1,
            deleting=False,
            delete_with_savepoint=True,
            rollback_requested=False,
            created_at=now,
            updated_at=now,
        )
        s.add(row)
        s.add(DeploymentGeneration(name=name, generation=1, spec=spec, created_at=now))
        s.flush()
        return row, True
    if row.deleting:
        raise DeploymentDeleting(f"deployment {name} is being deleted")
    if expected_generation is not None and expected_generation != row.generation:
        raise GenerationMismatch(name, expected_generation, row.generation)
    if row.spec == spec:
        if row.blocked_generation == row.generation:
            row.blocked_generation = None
            row.error = None
            row.updated_at = utcnow()
        return row, False
    row.generation += 1
    row.spec = spec
    row.updated_at = utcnow()
    s.add(DeploymentGeneration(name=name, generation=row.generation, spec=spec, created_at=row.updated_at))
    s.flush()
    return row, True


class DeploymentDeleting(CoordinationError, RuntimeError):
    """A change to a deployment that is being deleted."""


class GenerationMismatch(CoordinationError, RuntimeError):
    """A change based on another generation than the deployment's current one."""

    def __init__(self, name: str, expected: int, current: int):
        super().__init__(
            f"deployment {name} is at generation {current}, not {expected}: it changed meanwhile"
            if current
            else f"deployment {name} does not exist (expected generation {expected})"
        )
        self.current = current


def deployments_using(s: Session, jar_id: str) -> list[str]:
    """Deployments any of whose generations runs this jar."""
    names = {g.name for g in s.execute(select(DeploymentGeneration)).scalars() if (g.spec or {}).get("jarId") == jar_id}
    return sorted(names)


def generations(s: Session, name: str) -> Sequence[DeploymentGeneration]:
    q = select(DeploymentGeneration).where(DeploymentGeneration.name == name)
    return s.execute(q.order_by(DeploymentGeneration.generation)).scalars().all()


def generation_spec(s: Session, name: str, generation: int) -> dict[str, Any] | None:
    row = s.get(DeploymentGeneration, (name, generation))
    return dict(row.spec) if row is not None else None


def record_deployment_event(
    s: Session,
    row: DeploymentRow,
    *,
    from_state: str | None,
    to_state: str | None,
    reason: str,
    generation: int | None = None,
    savepoint: str | None = None,
) -> None:
    s.add(
        DeploymentEvent(
            name=row.name,
            at=utcnow(),
            generation=generation if generation is not None else row.job_generation,
            from_state=from_state,
            to_state=to_state,
            reason=reason[:20000],
            job_id=row.job_id,
            savepoint=savepoint,
        )
    )


def deployment_events(s: Session, name: str, *, limit: int = 200) -> list[DeploymentEvent]:
    q = select(DeploymentEvent).where(DeploymentEvent.name == name).order_by(DeploymentEvent.id.desc()).limit(limit)
    return list(reversed(s.execute(q).scalars().all()))


def add_deployment_savepoint(s: Session, row: DeploymentRow, *, path: str, trigger: str) -> DeploymentSavepoint:
    sp = DeploymentSavepoint(
        name=row.name,
        path=path,
        at=utcnow(),
        generation=row.job_generation,
        job_id=row.job_id,
        trigger=trigger,
        disposed=False,
    )
    s.add(sp)
    s.flush()
    return sp


def deployment_savepoints(s: Session, name: str, *, kept_only: bool = False) -> Sequence[DeploymentSavepoint]:
    q = select(DeploymentSavepoint).where(DeploymentSavepoint.name == name)
    if kept_only:
        q = q.where(DeploymentSavepoint.disposed.is_(False))
    return s.execute(q.order_by(DeploymentSavepoint.id)).scalars().all()


def create_deployment_job(
    s: Session,
    row: DeploymentRow,
    job_id: JobId,
    spec: dict[str, Any],
    *,
    restart_strategy: dict[str, Any],
    config: dict[str, Any],
    parallelism: int,
) -> Job:
    job = create_job(
        s,
        id=job_id,
        name=row.name,
        artifact_id=spec["jarId"],
        entry=spec.get("entryClass") or "build",
        parallelism=parallelism,
        program_args=list(spec.get("programArgsList") or []),
        config=config,
        restart_strategy=restart_strategy,
        kind=spec.get("kind") or "pyspark",
    )
    job.deployment = row.name
    return job


def delete_deployment(s: Session, name: str) -> None:
    """The deployment and its generations; its history and savepoint records go too (its jobs stay)."""
    for model in (DeploymentGeneration, DeploymentEvent, DeploymentSavepoint, AutoscalerEvaluation):
        s.execute(delete(model).where(model.name == name))
    s.execute(delete(DeploymentRow).where(DeploymentRow.name == name))


# The newest evaluations kept per deployment: at one every AUTOSCALER_INTERVAL_S, a few hours.
EVALUATIONS_KEPT = 2000


def add_autoscaler_evaluation(s: Session, row: DeploymentRow, evaluation: dict[str, Any]) -> None:
    """One evaluation (shared/autoscaling.py Evaluation.record()); older ones beyond EVALUATIONS_KEPT go."""
    s.add(
        AutoscalerEvaluation(
            name=row.name,
            at=utcnow(),
            job_id=row.job_id,
            parallelism=evaluation["parallelism"],
            proposed=evaluation["proposed"],
            outcome=evaluation["outcome"],
            reason=str(evaluation["reason"])[:4000],
            figures=evaluation.get("figures") or {},
        )
    )
    s.flush()
    oldest_kept = (
        select(AutoscalerEvaluation.id)
        .where(AutoscalerEvaluation.name == row.name)
        .order_by(AutoscalerEvaluation.id.desc())
        .offset(EVALUATIONS_KEPT)
        .limit(1)
        .scalar_subquery()
    )
    s.execute(
        delete(AutoscalerEvaluation).where(
            AutoscalerEvaluation.name == row.name, AutoscalerEvaluation.id <= oldest_kept
        )
    )


def count_autoscaler_rescales(s: Session) -> Sequence[Any]:
    """(deployment name, how many rescales the autoscaler decided), from the history."""
    return s.execute(
        select(DeploymentEvent.name, func.count())
        .where(DeploymentEvent.reason.like("autoscaler: scale-%"))
        .group_by(DeploymentEvent.name)
    ).all()


def autoscaler_evaluations(s: Session, name: str, *, limit: int = 200) -> list[AutoscalerEvaluation]:
    """The newest `limit` evaluations, oldest first."""
    q = (
        select(AutoscalerEvaluation)
        .where(AutoscalerEvaluation.name == name)
        .order_by(AutoscalerEvaluation.id.desc())
        .limit(limit)
    )
    return list(reversed(s.execute(q).scalars().all()))
