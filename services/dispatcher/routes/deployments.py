"""/deployments: the desired state of long-running pipelines (create or change, read, roll back,
delete). The dispatcher validates and stores the spec, and checks before anything is stopped
that the job's state can be carried into a changed pipeline; the leading JobManager's reconciler
does the rest (services/jobmanager/deployment_reconciler.py, rules in shared/deployments.py)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Body, Query, Request
from sqlalchemy.orm import Session

from services.dispatcher.deps import (
    ArtifactLimitsDep,
    CatalogDep,
    DefaultRestartDep,
    SessionDep,
    SettingsDep,
    WarmPlannerDep,
)
from services.dispatcher.errors import ApiError, error_responses
from services.dispatcher.guards import redaction
from services.dispatcher.guards.strict_fields import StrictBool
from services.dispatcher.schemas.deployments import (
    AutoscalerDetail,
    DeploymentAccepted,
    DeploymentApplied,
    DeploymentDetail,
    DeploymentList,
    DeploymentSpecRequest,
)
from services.dispatcher.submission import checkpoint_dir_option, redis_key_writers, restore, restore_check
from services.dispatcher.submission.submitter import check_config, check_entry, resolve_restart_strategy, unknown_jar
from services.dispatcher.submission.warm_planner import WarmPlanner
from shared import checkpointing as cp
from shared import deployments as dep
from shared.catalog import repository
from shared.catalog.models import DeploymentRow, epoch_ms
from shared.catalog.repository import NotFound
from shared.catalog.repository import deployments as deployments_repo
from shared.ids import ArtifactId
from shared.job_lineage import Lineages

log = logging.getLogger(__name__)
router = APIRouter(prefix="/deployments", tags=["deployments"])
_ERRORS = error_responses(400, 404, 409, described={503: "the catalog is unreachable; retry after Retry-After seconds"})
# Rollback is asked of a generation that is not (yet) the stable one.
ROLLBACK_FROM = (dep.Lifecycle.DEPLOYING, dep.Lifecycle.UPGRADING, dep.Lifecycle.FAILED)


def _unknown(name: str) -> ApiError:
    return ApiError.of(
        404,
        f"deployment {name!r} not found",
        field="name",
        expected="the name of a deployment",
        hint="GET /deployments lists them; PUT /deployments/{name} creates one",
        prefix=False,
    )


def _check_name(name: str, body_name: str | None) -> None:
    if not dep.valid_name(name):
        raise ApiError.of(
            400,
            f"deployment name {name[:80]!r} is not valid",
            field="name",
            expected=dep.NAME_EXPECTED,
            got=name[:80],
            hint="for example clicks-per-minute",
            prefix=False,
        )
    if body_name is not None and body_name != name:
        raise ApiError.of(
            400,
            f"the body names deployment {body_name[:80]!r}, the path {name!r}",
            field="name",
            expected=f"{name!r} or no name in the body",
            got=body_name[:80],
            prefix=False,
        )


def _get(s: Session, name: str, *, lock: bool = False) -> DeploymentRow:
    if not dep.valid_name(name):
        raise _unknown(name[:80])
    try:
        return deployments_repo.get_deployment(s, name, lock=lock)
    except NotFound:
        raise _unknown(name) from None


@router.put(
    "/{name}",
    response_model=DeploymentApplied,
    responses=_ERRORS,
    summary="Create a deployment or change its spec (a changed spec is a new generation)",
)
def apply_deployment(
    name: str,
    req: Annotated[DeploymentSpecRequest, Body()],
    catalog: CatalogDep,
    settings: SettingsDep,
    default_restart: DefaultRestartDep,
    bounds: ArtifactLimitsDep,
    warm: WarmPlannerDep,
    expected_generation: Annotated[
        int | None,
        Query(
            alias="expectedGeneration",
            ge=0,
            le=2**31 - 1,
            description="apply only if the deployment is at this generation (0: only if it does not exist yet); "
            "409 otherwise, so a read-modify-write does not undo a change made meanwhile",
        ),
    ] = None,
) -> dict:
    _check_name(name, req.name)
    config = dict(req.flinkConfiguration or {})
    if config.get(cp.RESTORE_PATH):
        raise ApiError.of(
            400,
            f"a deployment chooses its own restore points; {cp.RESTORE_PATH} cannot be set",
            field=cp.RESTORE_PATH,
            expected="no restore path in a deployment's configuration",
            hint="start a job from that savepoint with POST /jars/{jarid}/run, or leave it out",
            prefix=False,
        )
    check_config(config, settings)
    checkpoint_dir_option.check(config, settings)
    restart = resolve_restart_strategy(req.restartStrategy, config, default_restart)
    with catalog.session() as s:
        try:
            art = repository.get_artifact(s, ArtifactId(req.jarId))
        except NotFound:
            raise unknown_jar(req.jarId) from None
    if (req.kind or "pyspark") == "pyspark":
        check_entry(catalog, art, req.entryClass or "build", config, bounds)
    spec = req.record(restart_strategy=restart, config=config)
    redis_key_writers.check_no_other_writer(catalog, config, None, deployment=name)
    _check_state_carries_over(catalog, settings, name, spec, art, warm)
    with catalog.session() as s:
        try:
            row, changed = deployments_repo.put_deployment(s, name, spec, expected_generation=expected_generation)
        except deployments_repo.GenerationMismatch as exc:
            raise ApiError.of(
                409,
                str(exc),
                field="expectedGeneration",
                expected=f"generation {exc.current}",
                got=expected_generation,
                hint="read the deployment again (GET /deployments/{name}) and apply your change to its current spec",
                prefix=False,
            ) from None
        except deployments_repo.DeploymentDeleting:
            raise ApiError.of(
                409,
                f"deployment {name} is being deleted",
                field="name",
                expected="a deployment that is not being deleted",
                hint="wait until GET /deployments/{name} answers 404, then create it again",
                prefix=False,
            ) from None
        generation = row.generation
    log.info("deployment %s: generation %d %s", name, generation, "applied" if changed else "unchanged")
    return {"name": name, "generation": generation, "changed": changed}


def _check_state_carries_over(catalog, settings, name: str, spec: dict, art, warm: WarmPlanner | None) -> None:
    """Before anything is stopped: a changed pipeline must be able to start from the state of the
    deployment's job (its newest snapshot), else the change is refused and the job left alone."""
    if spec["upgradeMode"] == "stateless" or spec["kind"] != "pyspark":
        return
    with catalog.session() as s:
        try:
            row = deployments_repo.get_deployment(s, name)
        except NotFound:
            return
        if _pipeline_part(row.spec) == _pipeline_part(spec) or not row.job_id:
            return  # what the job runs is unchanged (a suspension, a new rollback bound): no planning
        snapshot_path = repository.newest_snapshot_path(s, row.job_id) or row.last_savepoint
        current = repository.find_job(s, row.job_id)
        lineage = Lineages().of(s, current) if current is not None else None  # the upgrade continues it
    if not snapshot_path:
        return
    try:
        snapshot = restore.resolve_snapshot(snapshot_path, "jarId")
    except ApiError:
        log.warning(
            "deployment %s: its newest snapshot %s cannot be read; the driver checks the plan before it starts",
            name,
            snapshot_path,
        )
        return
    try:
        restore_check.check_artifact(
            settings,
            art,
            entry=spec["entryClass"],
            args=spec["programArgsList"],
            config=dict(spec["flinkConfiguration"]),
            parallelism=spec["parallelism"],
            snapshot_meta=snapshot.metadata,
            warm=warm,
            lineage=lineage,
        )
    except restore_check.RestoreIncompatible as exc:
        _record_refusal(catalog, name, exc.message)
        raise ApiError.of(
            400,
            f"the change was refused before anything was stopped: {exc.message}",
            field="jarId",
            expected="a pipeline that can start from the deployment's state",
            got=snapshot.path,
            hint=exc.hint or "use upgradeMode stateless to start without state",
            prefix=False,
        ) from None


def _pipeline_part(spec: dict) -> dict:
    """What decides whether a job's state fits: not the lifecycle's own fields."""
    return {
        k: v for k, v in spec.items() if k not in ("state", "rollback", "savepoints", "upgradeMode", "restartStrategy")
    }


def _record_refusal(catalog, name: str, why: str) -> None:
    with catalog.session() as s:
        try:
            row = deployments_repo.get_deployment(s, name, lock=True)
        except NotFound:
            return
        row.error = f"a change was refused: {why}"[:4000]
        deployments_repo.record_deployment_event(
            s,
            row,
            from_state=row.lifecycle,
            to_state=row.lifecycle,
            reason=f"change refused before anything was stopped: {why}",
            generation=row.generation,
        )


def _job_states(s: Session, rows) -> dict[str, str]:
    return repository.job_statuses(s, [r.job_id for r in rows if r.job_id])


@router.get("", response_model=DeploymentList, summary="List the deployments with their states")
def list_deployments(session: SessionDep) -> dict:
    rows = deployments_repo.list_deployments(session)
    states = _job_states(session, rows)
    return {
        "deployments": [
            {
                "name": r.name,
                "generation": r.generation,
                "lifecycleState": r.lifecycle,
                "jobId": r.job_id,
                "jobState": states.get(r.job_id or ""),
                "stableGeneration": r.stable_generation,
                "parallelism": _effective_parallelism(r),
                "error": r.error,
                "updatedAt": epoch_ms(r.updated_at),
            }
            for r in rows
        ]
    }


@router.get(
    "/{name}",
    response_model=DeploymentDetail,
    responses=_ERRORS,
    summary="One deployment: spec, status, history, generations and savepoints",
)
def get_deployment(name: str, request: Request, session: SessionDep) -> dict:
    row = _get(session, name)
    job_state = _job_states(session, [row]).get(row.job_id or "")
    history = [
        {
            "at": epoch_ms(e.at),
            "generation": e.generation,
            "from": e.from_state,
            "to": e.to_state,
            "reason": e.reason,
            "jobId": e.job_id,
            "savepoint": e.savepoint,
        }
        for e in deployments_repo.deployment_events(session, name)
    ]
    return {
        "name": row.name,
        "spec": redaction.for_caller(request, "spec", row.spec),
        "generation": row.generation,
        "status": {
            "lifecycleState": row.lifecycle,
            "jobId": row.job_id,
            "jobState": job_state,
            "jobGeneration": row.job_generation,
            "stableGeneration": row.stable_generation,
            "lastSavepoint": row.last_savepoint,
            "error": row.error,
            "pending": row.pending,
            "waitingReason": dep.waiting_reason(
                row.lifecycle,
                row.pending,
                row.job_id,
                job_state,
                dep.DeploymentSpec.from_record(row.spec).ready_within_s,
            ),
            "deleting": row.deleting,
            "parallelism": _effective_parallelism(row),
            "autoscaler": _autoscaler_status(session, row),
            "history": history,
        },
        "generations": [
            {
                "generation": g.generation,
                "spec": redaction.for_caller(request, "spec", g.spec),
                "at": epoch_ms(g.created_at),
            }
            for g in deployments_repo.generations(session, name)
        ],
        "savepoints": [
            {
                "path": sp.path,
                "at": epoch_ms(sp.at),
                "generation": sp.generation,
                "jobId": sp.job_id,
                "trigger": sp.trigger,
                "disposed": sp.disposed,
            }
            for sp in deployments_repo.deployment_savepoints(session, name)
        ],
    }


def _effective_parallelism(row: DeploymentRow) -> int:
    return dep.DeploymentSpec.from_record(row.spec).effective_parallelism(row.parallelism)


def _held_off(row: DeploymentRow) -> str | None:
    return row.autoscaler_hold if row.autoscaler_held_generation == row.generation else None


def _evaluation(e) -> dict:
    return {
        "at": epoch_ms(e.at),
        "jobId": e.job_id,
        "parallelism": e.parallelism,
        "proposed": e.proposed,
        "outcome": e.outcome,
        "reason": e.reason,
        "figures": e.figures,
    }


def _autoscaler_status(session: Session, row: DeploymentRow) -> dict | None:
    if not (row.spec.get("autoscaler") or {}).get("enabled"):
        return None
    last = deployments_repo.autoscaler_evaluations(session, row.name, limit=1)
    return {
        "heldOff": _held_off(row),
        "scaledFrom": row.scaled_from,
        "lastEvaluation": _evaluation(last[0]) if last else None,
    }


@router.get(
    "/{name}/autoscaler",
    response_model=AutoscalerDetail,
    responses=_ERRORS,
    summary="The autoscaler's evaluations of a deployment, newest last, with their figures and outcomes",
)
def get_autoscaler(
    name: str,
    session: SessionDep,
    limit: Annotated[
        int, Query(ge=1, le=deployments_repo.EVALUATIONS_KEPT, description="the newest this many evaluations")
    ] = 200,
) -> dict:
    row = _get(session, name)
    spec = row.spec.get("autoscaler") or None
    evaluations = deployments_repo.autoscaler_evaluations(session, name, limit=limit)
    return {
        "name": row.name,
        "enabled": bool(spec and spec.get("enabled")),
        "parallelism": _effective_parallelism(row),
        "spec": spec,
        "heldOff": _held_off(row),
        "evaluations": [_evaluation(e) for e in evaluations],
    }


@router.post(
    "/{name}/rollback",
    status_code=202,
    response_model=DeploymentAccepted,
    responses=_ERRORS,
    summary="Roll back to the last stable generation (from the savepoint the new one started from)",
)
def rollback_deployment(name: str, catalog: CatalogDep) -> dict:
    with catalog.session() as s:
        row = _get(s, name, lock=True)
        state = dep.Lifecycle(row.lifecycle) if row.lifecycle else None
        if state not in ROLLBACK_FROM or row.stable_generation is None or row.stable_generation == row.job_generation:
            now = state.value if state else "new"
            raise ApiError.of(
                409,
                f"deployment {name} has nothing to roll back to: it is {now}, running generation "
                f"{row.job_generation}, stable generation {row.stable_generation}",
                field="name",
                expected="a deployment upgrading to (or failed on) a generation other than its stable one",
                hint="to go back to an older spec, apply it again (headrace deploy apply)",
                prefix=False,
            )
        row.rollback_requested = True
        generation = row.stable_generation
    log.info("deployment %s: rollback to generation %s asked", name, generation)
    return {"name": name, "generation": generation}


@router.delete(
    "/{name}",
    status_code=202,
    response_model=DeploymentAccepted,
    responses=_ERRORS,
    summary="Delete a deployment: its job is stopped with a savepoint (or cancelled with savepoint=false)",
)
def delete_deployment(
    name: str,
    catalog: CatalogDep,
    savepoint: Annotated[
        StrictBool | None, Query(description="stop the job with a savepoint first (default true)")
    ] = None,
) -> dict:
    with catalog.session() as s:
        row = _get(s, name, lock=True)
        row.deleting = True
        row.delete_with_savepoint = savepoint is not False
    log.info("deployment %s: deletion asked (%s)", name, "cancel" if savepoint is False else "with a savepoint")
    return {"name": name, "deleting": True}
