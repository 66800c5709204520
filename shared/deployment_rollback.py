"""A deployment's new generation (DEPLOYING, UPGRADING or ROLLING_BACK), one of the deployments'
rules (shared/deployments.py `decide`): it is ready once its job runs and has completed a
checkpoint; it is not when its job ended, failed, or is still not ready after
`rollback.readyWithin`. Then the deployment rolls back to its stable generation, or undoes the
autoscaler's rescale, or (with nothing to go back to, or rollback disabled) fails. Pure, like
`decide`: an `Observed` in, a `Plan` out.
"""

from __future__ import annotations

from shared.deployment_model import NOTHING, Lifecycle, Observed, Plan, Start

# A new generation that fails this often before it is ready is rolled back without waiting for
# its restart strategy to give up or for readyWithin to pass: a version that fails as it starts
# will fail again. Failures that are the cluster's, not the version's (a TaskManager lost), do not
# count (INFRASTRUCTURE_FAILURES, prefixes of an attempt's failure cause).
FAILURES_BEFORE_ROLLBACK = 1
INFRASTRUCTURE_FAILURES = ("TaskManagerLost",)


def judge_new_generation(o: Observed, live: bool) -> Plan:
    """DEPLOYING, UPGRADING or ROLLING_BACK: ready in time, or not."""
    job = o.job
    assert o.lifecycle is not None
    rolling_back = o.lifecycle == Lifecycle.ROLLING_BACK
    # The stable generation resumed in place of a blocked current one is rolled back still.
    in_place_of_blocked = o.job_generation != o.generation and o.blocked_generation == o.generation
    settled_to = Lifecycle.ROLLED_BACK if rolling_back or in_place_of_blocked else Lifecycle.STABLE
    if job is not None and job.running and job.checkpoint_since_deploy:
        # A rollback's error stays: it says why the newer generation is not the one running.
        return Plan(
            to=settled_to,
            stable=not rolling_back,
            clear_error=settled_to == Lifecycle.STABLE,
            scale_settled=not rolling_back,
            reason=f"generation {o.job_generation} is running and completed a checkpoint (job {job.id})",
        )
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
    return rollback(o, live, why=why)


def _not_ready(o: Observed, live: bool) -> str | None:
    job = o.job
    if job is None:
        return "its job is missing"
    if job.terminal:
        return f"its job {job.id} ended {job.status}" + (f": {job.failure}" if job.failure else "")
    if job.failures_since_deploy >= FAILURES_BEFORE_ROLLBACK:
        return f"its job {job.id} failed {job.failures_since_deploy} time(s)" + (
            f" (last failure: {job.failure})" if job.failure else ""
        )
    ready_within = o.spec.ready_within_s
    if o.deployed_s_ago is not None and o.deployed_s_ago > ready_within:
        what = "is not RUNNING" if not job.running else "has completed no checkpoint"
        return f"its job {job.id} {what} after {ready_within:g} s (rollback.readyWithin)"
    return None


def rollback(o: Observed, live: bool, *, why: str, consume: bool = False) -> Plan:
    s = o.stable_generation
    if not o.spec.rollback_enabled and not consume:
        return Plan(
            to=Lifecycle.FAILED,
            error=why,
            block=o.job_generation,
            reason=f"generation {o.job_generation} failed: {why} (rollback is disabled)",
        )
    if s is None or s == o.job_generation or o.stable_spec is None:
        return Plan(
            to=Lifecycle.FAILED,
            error=why,
            block=o.job_generation,
            consume_rollback_request=consume,
            reason=f"generation {o.job_generation} failed: {why}; there is no stable generation to roll back to",
        )
    point = o.rollback_point
    then = {"generation": s, "restore": point, "fromStable": True}
    reason = (
        f"generation {o.job_generation} {'rolled back' if consume else 'not ready'}: {why}; rolling back to "
        f"generation {s} from {point or 'nothing'}"
    )
    if live:
        return Plan(
            to=Lifecycle.ROLLING_BACK,
            cancel_job=True,
            error=why,
            block=o.job_generation,
            consume_rollback_request=consume,
            reason=reason,
            pending={"kind": "ends", "purpose": "rollback", **then},
        )
    return Plan(
        to=Lifecycle.ROLLING_BACK,
        start=Start(s, point, from_stable=True),
        error=why,
        block=o.job_generation,
        consume_rollback_request=consume,
        reason=reason,
        rollback_point=point,
    )


def _unscale(o: Observed, live: bool, why: str) -> Plan:
    """The autoscaler's rescale of the stable generation is not ready: the same generation again
    at the parallelism before it, from the rescale's savepoint; the autoscaler holds off."""
    back, point, g = o.scaled_from, o.rollback_point, o.job_generation or o.generation
    reason = (
        f"the autoscaler's rescale to parallelism {o.target_parallelism} not ready: {why}; back to "
        f"parallelism {back} from {point or 'nothing'}"
    )
    if live:
        return Plan(
            to=Lifecycle.ROLLING_BACK,
            cancel_job=True,
            error=why,
            unscale_to=back,
            reason=reason,
            pending={"kind": "ends", "purpose": "rollback", "generation": g, "restore": point, "parallelism": back},
        )
    return Plan(
        to=Lifecycle.ROLLING_BACK,
        start=Start(g, point, parallelism=back),
        error=why,
        unscale_to=back,
        reason=reason,
        rollback_point=point,
    )
