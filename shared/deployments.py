"""Deployments: a named desired state for a long-running pipeline, and the one place that decides
what the JobManager does to bring the cluster to it (Flink Kubernetes Operator's FlinkDeployment,
for PySpark pipelines).

The dispatcher validates a spec (services/dispatcher/schemas/deployments.py) and stores it in
its normalised form, `DeploymentSpec.record()`; the leading JobManager's reconciler
(services/jobmanager/deployment_reconciler.py) reads it back with `DeploymentSpec.from_record`,
observes the deployment's job and its pending step, and asks `decide` what to do next. `decide`
is pure: it sees an `Observed` snapshot and returns a `Plan` (both in shared/deployment_model.py);
the reconciler carries the plan out in one unit of work, so a JobManager that dies halfway leaves
either all of it or none.

Lifecycle::

    (new) -> DEPLOYING -> STABLE -> UPGRADING -> STABLE
                 |                       \\-> ROLLING_BACK -> ROLLED_BACK -> UPGRADING ...
                 \\-> FAILED              (ready in time)     (not ready in time)
    any -> SUSPENDED (stop with a savepoint) -> DEPLOYING (resumed from it: what ran, so the
                                                      stable generation if it was ROLLED_BACK)

Every move the rules name is in the lifecycle's transition table (shared/states.py
`DEPLOYMENT_TRANSITIONS`, which the reconciler's writes go through; tests/unit/
test_deployment_transitions.py holds the two equal).

A step that must wait (a stop-with-savepoint, a job's end) is kept in the deployment's row as
`pending`; each pass looks at it again, so a new leader carries on where the old one was. The
rules for those steps are shared/deployment_pending.py; whether a new generation is ready, and
the rollback when it is not, shared/deployment_rollback.py; the rest (deletion, suspension, a
new spec, keeping a settled deployment healthy) are here, and `decide` is the one entry to all.
"""

from __future__ import annotations

from shared import durations
from shared.deployment_model import NOTHING, JobView, Lifecycle, Observed, OperationView, Plan, Start  # noqa: F401
from shared.deployment_pending import advance_pending
from shared.deployment_rollback import judge_new_generation, rollback
from shared.deployment_spec import (  # noqa: F401 - the spec's and the model's names are the rules' too (dep.X)
    DEFAULT_HISTORY_MAX,
    DEFAULT_READY_WITHIN_S,
    NAME_EXPECTED,
    NAME_PATTERN,
    STATES,
    UPGRADE_MODES,
    DeploymentSpec,
    valid_name,
    waiting_reason,
)

# A STABLE job whose newest completed checkpoint is older than this many intervals, and than
# STUCK_AFTER_AT_LEAST_S, is stuck. The floor: on a loaded machine checkpoints of a short interval
# fall behind for a while without anything being wrong (failing checkpoints have their own bound,
# execution.checkpointing.tolerable-failed-checkpoints).
STUCK_AFTER_INTERVALS = 5
STUCK_AFTER_AT_LEAST_S = 300.0


def decide(o: Observed) -> Plan:
    """The next step towards the desired state. One rule per situation, in order of precedence:
    a pending step first, then deletion, suspension, a new deployment, a change of spec, and
    the health of what runs."""
    if o.pending:
        return advance_pending(o)
    job = o.job
    live = job is not None and not job.terminal
    if o.deleting:
        if live and o.delete_with_savepoint:
            return Plan(
                stop="delete",
                pending={"kind": "stop", "purpose": "delete"},
                reason="deleting: stopping the job with a savepoint",
            )
        if live:
            return Plan(
                cancel_job=True,
                pending={"kind": "ends", "purpose": "delete"},
                reason="deleting: cancelling the job (no savepoint asked)",
            )
        return Plan(delete=True, reason="deleted")
    if o.spec.state == "suspended":
        return _suspend(o, live)
    if o.lifecycle is None or (o.lifecycle == Lifecycle.FAILED and job is None):
        restore = o.last_savepoint
        return Plan(
            to=Lifecycle.DEPLOYING,
            start=Start(o.generation, restore),
            rollback_point=restore,
            reason=f"generation {o.generation} deployed" + (f" from {restore}" if restore else ""),
            pending=None,
            clear_error=True,
        )
    if o.lifecycle == Lifecycle.SUSPENDED:
        # What the suspension left to resume from (its savepoint, else the job's newest snapshot).
        restore = o.rollback_point or o.last_savepoint or (job.latest_snapshot if job else None)
        if _suspended_the_stable_generation(o):
            return _resume_stable(o, restore)
        return Plan(
            to=Lifecycle.DEPLOYING,
            start=Start(o.generation, restore),
            rollback_point=restore,
            reason=f"resumed: generation {o.generation} started from {restore or 'nothing (no savepoint)'}",
            clear_error=True,
            unblock=True,
        )
    if o.rollback_requested:
        if o.stable_generation is None or o.stable_generation == o.job_generation:
            # Asked while another generation was being tried, which has settled since (or never).
            return Plan(
                consume_rollback_request=True,
                reason=f"rollback asked for, but generation "
                f"{o.job_generation} runs and is the stable one: nothing to roll back",
            )
        return rollback(o, live, why="rollback asked for", consume=True)
    if o.lifecycle in (Lifecycle.DEPLOYING, Lifecycle.UPGRADING, Lifecycle.ROLLING_BACK):
        return judge_new_generation(o, live)
    if o.lifecycle == Lifecycle.FAILED and job is not None and job.running and job.checkpoint_since_deploy:
        # Slower than readyWithin, not broken: it runs and checkpoints now.
        back = o.job_generation != o.generation
        return Plan(
            to=Lifecycle.ROLLED_BACK if back else Lifecycle.STABLE,
            stable=True,
            clear_error=not back,
            reason=f"generation {o.job_generation} recovered: job {job.id} is running and completed a checkpoint",
        )
    if o.job_generation != o.generation and o.blocked_generation != o.generation:
        return _recover_failed(o, live) if o.lifecycle == Lifecycle.FAILED else _upgrade(o, live)
    if o.lifecycle.settled:
        return _keep_healthy(o, live)
    return NOTHING


def _suspend(o: Observed, live: bool) -> Plan:
    if o.lifecycle == Lifecycle.SUSPENDED:
        return NOTHING
    if live:
        return Plan(
            stop="suspend",
            pending={"kind": "stop", "purpose": "suspend"},
            reason="suspending: stopping the job with a savepoint",
        )
    snapshot = (o.job.latest_snapshot if o.job else None) or o.last_savepoint
    return Plan(
        to=Lifecycle.SUSPENDED,
        rollback_point=snapshot,
        reason=f"suspended (no job was running; resumes from {snapshot or 'nothing'})",
    )


def _suspended_the_stable_generation(o: Observed) -> bool:
    """Suspended while the stable generation ran in place of a rolled-back (or failed) one, and
    resumed with the spec of that blocked one: `headrace deploy suspend|resume` send the current
    spec back with another state, so neither is a new version to try."""
    return (
        o.job_generation is not None
        and o.job_generation == o.stable_generation
        and o.job_generation != o.generation
        and o.asks_blocked_version
    )


def _resume_stable(o: Observed, restore: str | None) -> Plan:
    """Resume what was running: the stable generation, from the suspension's savepoint. The
    current generation is blocked as the one it repeats was (applying it again retries it), and
    the deployment settles ROLLED_BACK again (shared/deployment_rollback.py)."""
    s = o.job_generation
    assert s is not None
    return Plan(
        to=Lifecycle.DEPLOYING,
        start=Start(s, restore, from_stable=True),
        rollback_point=restore,
        block=o.generation,
        reason=f"resumed: generation {s}, the stable one that ran when it was suspended, started from "
        f"{restore or 'nothing (no savepoint)'}; generation {o.generation} repeats generation "
        f"{o.blocked_generation}, which was not ready, and is not run (apply it again to retry it)",
    )


def _upgrade(o: Observed, live: bool) -> Plan:
    g = o.generation
    current = o.stable_spec
    if not live:
        snapshot = o.job.latest_snapshot if o.job else o.last_savepoint
        return Plan(
            to=Lifecycle.UPGRADING,
            start=Start(g, snapshot),
            rollback_point=snapshot,
            clear_error=True,
            reason=f"generation {g} applied; the previous job had ended: started from {snapshot or 'nothing'}",
        )
    if current is not None and o.spec.same_pipeline_except_parallelism(current) and o.spec.upgrade_mode != "stateless":
        target = o.target_parallelism
        if o.job is not None and o.job.running and o.job.parallelism == target:
            return Plan(
                to=Lifecycle.STABLE,
                adopt_generation=g,
                stable=True,
                clear_error=True,
                reason=f"generation {g} applied: its job {o.job.id} runs as it asks (parallelism {target})",
            )
        return Plan(
            to=Lifecycle.UPGRADING,
            rescale_to=target,
            clear_error=True,
            pending={"kind": "stop", "purpose": "rescale", "generation": g, "parallelism": target},
            reason=f"generation {g} applied: rescaling to parallelism {target} through a savepoint",
        )
    mode = o.spec.upgrade_mode
    if mode == "savepoint":
        return Plan(
            to=Lifecycle.UPGRADING,
            stop="upgrade",
            clear_error=True,
            pending={"kind": "stop", "purpose": "upgrade", "generation": g},
            reason=f"generation {g} applied: stopping job {o.job.id if o.job else '?'} with a savepoint",
        )
    return Plan(
        to=Lifecycle.UPGRADING,
        cancel_job=True,
        clear_error=True,
        pending={
            "kind": "ends",
            "purpose": "upgrade",
            "generation": g,
            "restore": "latest" if mode == "last-state" else None,
        },
        reason=f"generation {g} applied ({mode}): cancelling job {o.job.id if o.job else '?'}",
    )


def _recover_failed(o: Observed, live: bool) -> Plan:
    """A new spec for a FAILED deployment: its job may not be able to take a savepoint, so it
    starts from the newest snapshot the job left (as last-state would)."""
    g = o.generation
    if live:
        return Plan(
            to=Lifecycle.UPGRADING,
            cancel_job=True,
            clear_error=True,
            pending={"kind": "ends", "purpose": "upgrade", "generation": g, "restore": "latest"},
            reason=f"generation {g} applied to a failed deployment: cancelling job "
            f"{o.job.id if o.job else '?'}, then starting from its latest snapshot",
        )
    snapshot = (o.job.latest_snapshot if o.job else None) or o.last_savepoint
    return Plan(
        to=Lifecycle.UPGRADING,
        start=Start(g, snapshot),
        rollback_point=snapshot,
        clear_error=True,
        reason=f"generation {g} applied to a failed deployment: started from {snapshot or 'nothing'}",
    )


def _keep_healthy(o: Observed, live: bool) -> Plan:
    """STABLE or ROLLED_BACK: a job that ended is started again from its newest snapshot; one that
    stopped completing checkpoints is restarted from it; periodic savepoints are taken."""
    job = o.job
    g = o.job_generation if o.job_generation is not None else o.generation
    from_stable = o.job_generation != o.generation
    if job is None or job.terminal:
        snapshot = job.latest_snapshot if job else o.last_savepoint
        return Plan(
            to=Lifecycle.DEPLOYING,
            start=Start(g, snapshot, from_stable=from_stable),
            rollback_point=snapshot,
            reason=f"job {job.id if job else '?'} ended {job.status if job else ''}: generation {g} "
            f"started again from {snapshot or 'nothing'}",
        )
    interval = _checkpoint_interval_s(o.spec)
    if (
        interval
        and job.running
        and job.newest_checkpoint_age_s is not None
        and job.newest_checkpoint_age_s > max(STUCK_AFTER_INTERVALS * interval, STUCK_AFTER_AT_LEAST_S)
    ):
        return Plan(
            to=Lifecycle.DEPLOYING,
            cancel_job=True,
            pending={
                "kind": "ends",
                "purpose": "restart",
                "generation": g,
                "restore": "latest",
                "fromStable": from_stable,
            },
            reason=f"job {job.id} completed no checkpoint for {job.newest_checkpoint_age_s:.0f} s: restarting "
            "it from its latest checkpoint",
        )
    target = o.target_parallelism
    if o.lifecycle == Lifecycle.STABLE and job.running and job.parallelism and job.parallelism != target:
        return Plan(
            to=Lifecycle.UPGRADING,
            rescale_to=target,
            pending={"kind": "stop", "purpose": "rescale", "generation": g, "parallelism": target},
            reason=f"rescaling job {job.id} from parallelism {job.parallelism} to {target} through a savepoint"
            + (" (the autoscaler's decision)" if o.scaled_from is not None else ""),
        )
    if o.savepoint_due and job.running:
        return Plan(savepoint=True, pending={"kind": "savepoint", "purpose": "periodic"}, reason="")
    return NOTHING


def _checkpoint_interval_s(spec: DeploymentSpec) -> float | None:
    raw = spec.config.get("execution.checkpointing.interval")
    if raw in (None, ""):
        return None
    try:
        return durations.parse_flink_duration(raw) or None
    except ValueError:
        return None
