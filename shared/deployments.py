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
`pending`; each pass looks at it again, so a new leader carries on where the old one was.
"""

from __future__ import annotations

from typing import Any, Mapping

from shared import durations
from shared.deployment_model import NOTHING, JobView, Lifecycle, Observed, OperationView, Plan, Start  # noqa: F401
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

# A new generation that fails this often before it is ready is rolled back without waiting for
# its restart strategy to give up or for readyWithin to pass: a version that fails as it starts
# will fail again. Failures that are the cluster's, not the version's (a TaskManager lost), do not
# count (INFRASTRUCTURE_FAILURES, prefixes of an attempt's failure cause).
FAILURES_BEFORE_ROLLBACK = 1
INFRASTRUCTURE_FAILURES = ("TaskManagerLost",)
# A STABLE job whose newest completed checkpoint is older than this many intervals, and than
# STUCK_AFTER_AT_LEAST_S, is stuck. The floor: on a loaded machine checkpoints of a short interval
# fall behind for a while without anything being wrong (failing checkpoints have their own bound,
# execution.checkpointing.tolerable-failed-checkpoints).
STUCK_AFTER_INTERVALS = 5
STUCK_AFTER_AT_LEAST_S = 300.0
# A suspend or delete whose stop-with-savepoint failed is tried again after this long.
RETRY_FAILED_STOP_S = 30.0
# A task whose stop savepoint completed but which has not ended this long after is cancelled: the
# savepoint is there, and the next generation must not wait for a task that hangs as it stops.
STOP_GRACE_S = 60.0


def decide(o: Observed) -> Plan:
    """The next step towards the desired state. One rule per situation, in order of precedence:
    a pending step first, then deletion, suspension, a new deployment, a change of spec, and
    the health of what runs."""
    if o.pending:
        return _advance_pending(o)
    job = o.job
    live = job is not None and not job.terminal
    if o.deleting:
        if live and o.delete_with_savepoint:
            return Plan(stop="delete", pending={"kind": "stop", "purpose": "delete"},
                        reason="deleting: stopping the job with a savepoint")
        if live:
            return Plan(cancel_job=True, pending={"kind": "ends", "purpose": "delete"},
                        reason="deleting: cancelling the job (no savepoint asked)")
        return Plan(delete=True, reason="deleted")
    if o.spec.state == "suspended":
        return _suspend(o, live)
    if o.lifecycle is None or (o.lifecycle == Lifecycle.FAILED and job is None):
        restore = o.last_savepoint
        return Plan(to=Lifecycle.DEPLOYING, start=Start(o.generation, restore), rollback_point=restore,
                    reason=f"generation {o.generation} deployed" + (f" from {restore}" if restore else ""),
                    pending=None, clear_error=True)
    if o.lifecycle == Lifecycle.SUSPENDED:
        # What the suspension left to resume from (its savepoint, else the job's newest snapshot).
        restore = o.rollback_point or o.last_savepoint or (job.latest_snapshot if job else None)
        if _suspended_the_stable_generation(o):
            return _resume_stable(o, restore)
        return Plan(to=Lifecycle.DEPLOYING, start=Start(o.generation, restore), rollback_point=restore,
                    reason=f"resumed: generation {o.generation} started from {restore or 'nothing (no savepoint)'}",
                    clear_error=True, unblock=True)
    if o.rollback_requested:
        if o.stable_generation is None or o.stable_generation == o.job_generation:
            # Asked while another generation was being tried, which has settled since (or never).
            return Plan(consume_rollback_request=True, reason=f"rollback asked for, but generation "
                        f"{o.job_generation} runs and is the stable one: nothing to roll back")
        return _rollback(o, live, why="rollback asked for", consume=True)
    if o.lifecycle in (Lifecycle.DEPLOYING, Lifecycle.UPGRADING, Lifecycle.ROLLING_BACK):
        return _judge_new_generation(o, live)
    if o.lifecycle == Lifecycle.FAILED and job is not None and job.running and job.checkpoint_since_deploy:
        # Slower than readyWithin, not broken: it runs and checkpoints now.
        back = o.job_generation != o.generation
        return Plan(to=Lifecycle.ROLLED_BACK if back else Lifecycle.STABLE, stable=True, clear_error=not back,
                    reason=f"generation {o.job_generation} recovered: job {job.id} is running and completed a "
                           "checkpoint")
    if o.job_generation != o.generation and o.blocked_generation != o.generation:
        return _recover_failed(o, live) if o.lifecycle == Lifecycle.FAILED else _upgrade(o, live)
    if o.lifecycle.settled:
        return _keep_healthy(o, live)
    return NOTHING


def _suspend(o: Observed, live: bool) -> Plan:
    if o.lifecycle == Lifecycle.SUSPENDED:
        return NOTHING
    if live:
        return Plan(stop="suspend", pending={"kind": "stop", "purpose": "suspend"},
                    reason="suspending: stopping the job with a savepoint")
    snapshot = (o.job.latest_snapshot if o.job else None) or o.last_savepoint
    return Plan(to=Lifecycle.SUSPENDED, rollback_point=snapshot,
                reason=f"suspended (no job was running; resumes from {snapshot or 'nothing'})")


def _suspended_the_stable_generation(o: Observed) -> bool:
    """Suspended while the stable generation ran in place of a rolled-back (or failed) one, and
    resumed with the spec of that blocked one: `headrace deploy suspend|resume` send the current
    spec back with another state, so neither is a new version to try."""
    return (o.job_generation is not None and o.job_generation == o.stable_generation
            and o.job_generation != o.generation and o.asks_blocked_version)


def _resume_stable(o: Observed, restore: str | None) -> Plan:
    """Resume what was running: the stable generation, from the suspension's savepoint. The
    current generation is blocked as the one it repeats was (applying it again retries it), and
    the deployment settles ROLLED_BACK again (_judge_new_generation)."""
    s = o.job_generation
    assert s is not None
    return Plan(to=Lifecycle.DEPLOYING, start=Start(s, restore, from_stable=True), rollback_point=restore,
                block=o.generation,
                reason=f"resumed: generation {s}, the stable one that ran when it was suspended, started from "
                       f"{restore or 'nothing (no savepoint)'}; generation {o.generation} repeats generation "
                       f"{o.blocked_generation}, which was not ready, and is not run (apply it again to retry it)")


def _upgrade(o: Observed, live: bool) -> Plan:
    g = o.generation
    current = o.stable_spec
    if not live:
        snapshot = o.job.latest_snapshot if o.job else o.last_savepoint
        return Plan(to=Lifecycle.UPGRADING, start=Start(g, snapshot), rollback_point=snapshot, clear_error=True,
                    reason=f"generation {g} applied; the previous job had ended: started from "
                           f"{snapshot or 'nothing'}")
    if current is not None and o.spec.same_pipeline_except_parallelism(current) and o.spec.upgrade_mode != "stateless":
        target = o.target_parallelism
        if o.job is not None and o.job.running and o.job.parallelism == target:
            return Plan(to=Lifecycle.STABLE, adopt_generation=g, stable=True, clear_error=True,
                        reason=f"generation {g} applied: its job {o.job.id} runs as it asks (parallelism {target})")
        return Plan(to=Lifecycle.UPGRADING, rescale_to=target, clear_error=True,
                    pending={"kind": "stop", "purpose": "rescale", "generation": g, "parallelism": target},
                    reason=f"generation {g} applied: rescaling to parallelism {target} through a savepoint")
    mode = o.spec.upgrade_mode
    if mode == "savepoint":
        return Plan(to=Lifecycle.UPGRADING, stop="upgrade", clear_error=True,
                    pending={"kind": "stop", "purpose": "upgrade", "generation": g},
                    reason=f"generation {g} applied: stopping job {o.job.id if o.job else '?'} with a savepoint")
    return Plan(to=Lifecycle.UPGRADING, cancel_job=True, clear_error=True,
                pending={"kind": "ends", "purpose": "upgrade", "generation": g,
                         "restore": "latest" if mode == "last-state" else None},
                reason=f"generation {g} applied ({mode}): cancelling job {o.job.id if o.job else '?'}")


def _recover_failed(o: Observed, live: bool) -> Plan:
    """A new spec for a FAILED deployment: its job may not be able to take a savepoint, so it
    starts from the newest snapshot the job left (as last-state would)."""
    g = o.generation
    if live:
        return Plan(to=Lifecycle.UPGRADING, cancel_job=True, clear_error=True,
                    pending={"kind": "ends", "purpose": "upgrade", "generation": g, "restore": "latest"},
                    reason=f"generation {g} applied to a failed deployment: cancelling job "
                           f"{o.job.id if o.job else '?'}, then starting from its latest snapshot")
    snapshot = (o.job.latest_snapshot if o.job else None) or o.last_savepoint
    return Plan(to=Lifecycle.UPGRADING, start=Start(g, snapshot), rollback_point=snapshot, clear_error=True,
                reason=f"generation {g} applied to a failed deployment: started from {snapshot or 'nothing'}")


def _judge_new_generation(o: Observed, live: bool) -> Plan:
    """DEPLOYING, UPGRADING or ROLLING_BACK: ready in time, or not."""
    job = o.job
    assert o.lifecycle is not None
    rolling_back = o.lifecycle == Lifecycle.ROLLING_BACK
    # The stable generation resumed in place of a blocked current one is rolled back still.
    in_place_of_blocked = o.job_generation != o.generation and o.blocked_generation == o.generation
    settled_to = Lifecycle.ROLLED_BACK if rolling_back or in_place_of_blocked else Lifecycle.STABLE
    if job is not None and job.running and job.checkpoint_since_deploy:
        # A rollback's error stays: it says why the newer generation is not the one running.
        return Plan(to=settled_to, stable=not rolling_back, clear_error=settled_to == Lifecycle.STABLE,
                    scale_settled=not rolling_back,
                    reason=f"generation {o.job_generation} is running and completed a checkpoint (job {job.id})")
    why = _not_ready(o, live)
    if why is None:
        return NOTHING
    if o.scaled_from is not None and not rolling_back and o.job_generation == o.stable_generation:
        return _unscale(o, live, why)
    if rolling_back or o.lifecycle == Lifecycle.DEPLOYING and o.stable_generation in (None, o.job_generation):
        # The failing job may be the stable generation's (a failed rollback or restart): the
        # generation blocked before, the one that was rolled back, stays blocked.
        block = o.job_generation if o.job_generation == o.generation else None
        return Plan(to=Lifecycle.FAILED, error=why, block=block, reason=f"generation {o.job_generation} failed: {why}")
    return _rollback(o, live, why=why)


def _not_ready(o: Observed, live: bool) -> str | None:
    job = o.job
    if job is None:
        return "its job is missing"
    if job.terminal:
        return f"its job {job.id} ended {job.status}" + (f": {job.failure}" if job.failure else "")
    if job.failures_since_deploy >= FAILURES_BEFORE_ROLLBACK:
        return (f"its job {job.id} failed {job.failures_since_deploy} time(s)"
                + (f" (last failure: {job.failure})" if job.failure else ""))
    ready_within = o.spec.ready_within_s
    if o.deployed_s_ago is not None and o.deployed_s_ago > ready_within:
        what = "is not RUNNING" if not job.running else "has completed no checkpoint"
        return f"its job {job.id} {what} after {ready_within:g} s (rollback.readyWithin)"
    return None


def _rollback(o: Observed, live: bool, *, why: str, consume: bool = False) -> Plan:
    s = o.stable_generation
    if not o.spec.rollback_enabled and not consume:
        return Plan(to=Lifecycle.FAILED, error=why, block=o.job_generation,
                    reason=f"generation {o.job_generation} failed: {why} (rollback is disabled)")
    if s is None or s == o.job_generation or o.stable_spec is None:
        return Plan(to=Lifecycle.FAILED, error=why, block=o.job_generation, consume_rollback_request=consume,
                    reason=f"generation {o.job_generation} failed: {why}; there is no stable generation to roll "
                           "back to")
    point = o.rollback_point
    then = {"generation": s, "restore": point, "fromStable": True}
    reason = (f"generation {o.job_generation} {'rolled back' if consume else 'not ready'}: {why}; rolling back to "
              f"generation {s} from {point or 'nothing'}")
    if live:
        return Plan(to=Lifecycle.ROLLING_BACK, cancel_job=True, error=why, block=o.job_generation,
                    consume_rollback_request=consume, reason=reason,
                    pending={"kind": "ends", "purpose": "rollback", **then})
    return Plan(to=Lifecycle.ROLLING_BACK, start=Start(s, point, from_stable=True), error=why, block=o.job_generation,
                consume_rollback_request=consume, reason=reason, rollback_point=point)


def _unscale(o: Observed, live: bool, why: str) -> Plan:
    """The autoscaler's rescale of the stable generation is not ready: the same generation again
    at the parallelism before it, from the rescale's savepoint; the autoscaler holds off."""
    back, point, g = o.scaled_from, o.rollback_point, o.job_generation or o.generation
    reason = (f"the autoscaler's rescale to parallelism {o.target_parallelism} not ready: {why}; back to "
              f"parallelism {back} from {point or 'nothing'}")
    if live:
        return Plan(to=Lifecycle.ROLLING_BACK, cancel_job=True, error=why, unscale_to=back, reason=reason,
                    pending={"kind": "ends", "purpose": "rollback", "generation": g, "restore": point,
                             "parallelism": back})
    return Plan(to=Lifecycle.ROLLING_BACK, start=Start(g, point, parallelism=back), error=why, unscale_to=back,
                reason=reason, rollback_point=point)


def _keep_healthy(o: Observed, live: bool) -> Plan:
    """STABLE or ROLLED_BACK: a job that ended is started again from its newest snapshot; one that
    stopped completing checkpoints is restarted from it; periodic savepoints are taken."""
    job = o.job
    g = o.job_generation if o.job_generation is not None else o.generation
    from_stable = o.job_generation != o.generation
    if job is None or job.terminal:
        snapshot = job.latest_snapshot if job else o.last_savepoint
        return Plan(to=Lifecycle.DEPLOYING, start=Start(g, snapshot, from_stable=from_stable), rollback_point=snapshot,
                    reason=f"job {job.id if job else '?'} ended {job.status if job else ''}: generation {g} "
                           f"started again from {snapshot or 'nothing'}")
    interval = _checkpoint_interval_s(o.spec)
    if (interval and job.running and job.newest_checkpoint_age_s is not None
            and job.newest_checkpoint_age_s > max(STUCK_AFTER_INTERVALS * interval, STUCK_AFTER_AT_LEAST_S)):
        return Plan(to=Lifecycle.DEPLOYING, cancel_job=True,
                    pending={"kind": "ends", "purpose": "restart", "generation": g, "restore": "latest",
                             "fromStable": from_stable},
                    reason=f"job {job.id} completed no checkpoint for {job.newest_checkpoint_age_s:.0f} s: restarting "
                           "it from its latest checkpoint")
    target = o.target_parallelism
    if o.lifecycle == Lifecycle.STABLE and job.running and job.parallelism and job.parallelism != target:
        return Plan(to=Lifecycle.UPGRADING, rescale_to=target,
                    pending={"kind": "stop", "purpose": "rescale", "generation": g, "parallelism": target},
                    reason=f"rescaling job {job.id} from parallelism {job.parallelism} to {target} through a savepoint"
                           + (" (the autoscaler's decision)" if o.scaled_from is not None else ""))
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


def _advance_pending(o: Observed) -> Plan:
    p = dict(o.pending or {})
    kind, purpose = p.get("kind"), p.get("purpose")
    job = o.job
    if kind == "wait":  # the back-off after a failed stop
        return NOTHING if o.now_s < float(p.get("until") or 0) else Plan(pending=None)
    if kind == "savepoint":  # periodic: the job keeps running
        op = o.operation
        if op is None or op.status == "IN_PROGRESS":
            return NOTHING
        return Plan(pending=None, last_savepoint=op.location if op.status == "COMPLETED" else None,
                    periodic_done=True,
                    reason="" if op.status == "COMPLETED" else f"periodic savepoint failed: {op.failure}")
    if kind == "stop":
        op = o.operation
        if op is not None and op.status == "FAILED" and job is not None and not job.terminal:
            return _stop_failed(o, purpose, op.failure or "unknown cause")
        if purpose == "rescale":
            return _advance_rescale(o)
        if job is not None and not job.terminal:
            if (op is not None and op.status == "COMPLETED" and (op.done_s_ago or 0) > STOP_GRACE_S
                    and not p.get("cancelled")):
                return Plan(cancel_job=True, pending={**p, "cancelled": True},
                            reason=f"job {job.id} has not ended {STOP_GRACE_S:g} s after its stop savepoint "
                                   f"{op.location} completed: cancelling it")
            return NOTHING  # the savepoint is being taken, or the task is stopping
        savepoint = op.location if op is not None and op.status == "COMPLETED" else None
        fallback = job.latest_snapshot if job else None
        return _after_stop(o, purpose, savepoint, fallback, p)
    if kind == "ends":
        if job is not None and not job.terminal:
            return NOTHING
        restore = p.get("restore")
        if restore == "latest":
            restore = job.latest_snapshot if job else None
        if purpose == "delete" or o.deleting:
            return Plan(delete=True, pending=None, reason="deleted")
        if o.spec.state == "suspended":  # asked while the job was ending: nothing is started
            return Plan(to=Lifecycle.SUSPENDED, pending=None, rollback_point=restore,
                        reason=f"suspended (its job had ended; resumes from {restore or 'nothing'})")
        # An upgrade starts the newest spec, even one applied while the old job was ending.
        gen = o.generation if purpose == "upgrade" else int(p.get("generation") or o.generation)
        start = Start(gen, restore, from_stable=bool(p.get("fromStable")), parallelism=p.get("parallelism"))
        to = Lifecycle.ROLLING_BACK if purpose == "rollback" else o.lifecycle
        return Plan(to=to, start=start, pending=None, rollback_point=restore,
                    reason=f"job {job.id if job else '?'} ended: generation {gen} started from "
                           f"{restore or 'nothing'}")
    return Plan(pending=None, reason=f"unknown pending step {kind!r} dropped")


def _stop_failed(o: Observed, purpose: str | None, cause: str) -> Plan:
    back = o.stable_generation is not None and o.lifecycle == Lifecycle.UPGRADING
    to = Lifecycle.STABLE if back else o.lifecycle
    if purpose in ("upgrade", "rescale"):
        return Plan(to=to, pending=None, error=f"the stop with a savepoint failed: {cause}", block=o.generation,
                    reason=f"generation {o.generation} not applied: the stop with a savepoint failed ({cause}); "
                           "the running job was left as it was; apply the spec again to retry")
    return Plan(to=to, pending={"kind": "wait", "until": o.now_s + RETRY_FAILED_STOP_S},
                error=f"{purpose}: the stop with a savepoint failed: {cause}",
                reason=f"{purpose} not done yet: the stop with a savepoint failed ({cause}); the job keeps running "
                       f"and the stop is tried again in {RETRY_FAILED_STOP_S:g} s")


def _after_stop(o: Observed, purpose: str | None, savepoint: str | None, fallback: str | None,
                p: Mapping[str, Any]) -> Plan:
    """The job stopped: with its savepoint, or (it ended first) with only its newest snapshot to
    go on from, which is not recorded as a savepoint of the deployment."""
    restore = savepoint or fallback
    if purpose == "delete" or o.deleting:
        return Plan(delete=True, pending=None, reason="deleted")
    if purpose == "suspend" or o.spec.state == "suspended":
        return Plan(to=Lifecycle.SUSPENDED, pending=None, last_savepoint=savepoint, rollback_point=restore,
                    reason=f"suspended with savepoint {savepoint or '(none: the job ended first)'}")
    gen = o.generation  # the newest spec, even one applied while the old job was stopping
    return Plan(to=Lifecycle.UPGRADING, start=Start(gen, restore), pending=None, rollback_point=restore,
                last_savepoint=savepoint,
                reason=f"generation {gen} started from savepoint {savepoint}" if savepoint else
                f"generation {gen} started from {restore or 'nothing'} (the job ended before its savepoint)")


def _advance_rescale(o: Observed) -> Plan:
    """The same job goes on with the new parallelism once its rescale savepoint completed."""
    op, job = o.operation, o.job
    if op is None or op.status == "IN_PROGRESS":
        return NOTHING
    if op.status == "COMPLETED" and job is not None and not job.terminal:
        return Plan(to=Lifecycle.UPGRADING, pending=None, rollback_point=op.location, last_savepoint=op.location,
                    adopt_generation=o.generation,
                    reason=f"rescaling job {job.id} to parallelism {(o.pending or {}).get('parallelism') or '?'} "
                           f"from savepoint {op.location}")
    savepoint = op.location if op.status == "COMPLETED" else (job.latest_snapshot if job else None)
    return Plan(to=Lifecycle.UPGRADING, start=Start(o.generation, savepoint), pending=None,
                rollback_point=savepoint, reason=f"the rescaled job ended: generation {o.generation} started from "
                                                 f"{savepoint or 'nothing'}")

