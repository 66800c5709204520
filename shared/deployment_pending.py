"""The deployments' steps that wait, one of the deployments' rules (shared/deployments.py
`decide` looks at a pending step before anything else). A step is kept in the deployment's row
as `pending`, so a new leader carries on where the old one was; each pass looks at it again:

    stop       a stop with a savepoint (suspend, delete, upgrade): once the job ended, what comes
               next starts from the savepoint (else from the job's newest snapshot); a job that
               has not ended STOP_GRACE_S after its savepoint is cancelled. A rescale's job goes
               on with the new parallelism once its savepoint completed. A failed stop leaves an
               upgrade or rescale undone, and waits before a suspend or delete tries again.
    ends       a cancel (a delete or upgrade without a savepoint, a rollback, a restart): once
               the job ended, what comes next starts
    savepoint  a periodic savepoint: the job keeps running
    wait       the back-off after a failed stop, RETRY_FAILED_STOP_S

Pure, like `decide`: an `Observed` in, a `Plan` out.
"""

from __future__ import annotations

from typing import Any, Mapping

from shared.deployment_model import NOTHING, Lifecycle, Observed, Plan, Start

# A suspend or delete whose stop-with-savepoint failed is tried again after this long.
RETRY_FAILED_STOP_S = 30.0
# A task whose stop savepoint completed but which has not ended this long after is cancelled: the
# savepoint is there, and the next generation must not wait for a task that hangs as it stops.
STOP_GRACE_S = 60.0


def advance_pending(o: Observed) -> Plan:
    """The next move of the deployment's pending step (`o.pending`), by its kind."""
    p = dict(o.pending or {})
    kind, purpose = p.get("kind"), p.get("purpose")
    job = o.job
    if kind == "wait":  # the back-off after a failed stop
        return NOTHING if o.now_s < float(p.get("until") or 0) else Plan(pending=None)
    if kind == "savepoint":  # periodic: the job keeps running
        op = o.operation
        if op is None or op.status == "IN_PROGRESS":
            return NOTHING
        return Plan(
            pending=None,
            last_savepoint=op.location if op.status == "COMPLETED" else None,
            periodic_done=True,
            reason="" if op.status == "COMPLETED" else f"periodic savepoint failed: {op.failure}",
        )
    if kind == "stop":
        op = o.operation
        if op is not None and op.status == "FAILED" and job is not None and not job.terminal:
            return _stop_failed(o, purpose, op.failure or "unknown cause")
        if purpose == "rescale":
            return _advance_rescale(o)
        if job is not None and not job.terminal:
            if (
                op is not None
                and op.status == "COMPLETED"
                and (op.done_s_ago or 0) > STOP_GRACE_S
                and not p.get("cancelled")
            ):
                return Plan(
                    cancel_job=True,
                    pending={**p, "cancelled": True},
                    reason=f"job {job.id} has not ended {STOP_GRACE_S:g} s after its stop savepoint "
                    f"{op.location} completed: cancelling it",
                )
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
            return Plan(
                to=Lifecycle.SUSPENDED,
                pending=None,
                rollback_point=restore,
                reason=f"suspended (its job had ended; resumes from {restore or 'nothing'})",
            )
        # An upgrade starts the newest spec, even one applied while the old job was ending.
        gen = o.generation if purpose == "upgrade" else int(p.get("generation") or o.generation)
        start = Start(gen, restore, from_stable=bool(p.get("fromStable")), parallelism=p.get("parallelism"))
        to = Lifecycle.ROLLING_BACK if purpose == "rollback" else o.lifecycle
        return Plan(
            to=to,
            start=start,
            pending=None,
            rollback_point=restore,
            reason=f"job {job.id if job else '?'} ended: generation {gen} started from {restore or 'nothing'}",
        )
    return Plan(pending=None, reason=f"unknown pending step {kind!r} dropped")


def _stop_failed(o: Observed, purpose: str | None, cause: str) -> Plan:
    back = o.stable_generation is not None and o.lifecycle == Lifecycle.UPGRADING
    to = Lifecycle.STABLE if back else o.lifecycle
    if purpose in ("upgrade", "rescale"):
        return Plan(
            to=to,
            pending=None,
            error=f"the stop with a savepoint failed: {cause}",
            block=o.generation,
            reason=f"generation {o.generation} not applied: the stop with a savepoint failed ({cause}); "
            "the running job was left as it was; apply the spec again to retry",
        )
    return Plan(
        to=to,
        pending={"kind": "wait", "until": o.now_s + RETRY_FAILED_STOP_S},
        error=f"{purpose}: the stop with a savepoint failed: {cause}",
        reason=f"{purpose} not done yet: the stop with a savepoint failed ({cause}); the job keeps running "
        f"and the stop is tried again in {RETRY_FAILED_STOP_S:g} s",
    )


def _after_stop(
    o: Observed, purpose: str | None, savepoint: str | None, fallback: str | None, p: Mapping[str, Any]
) -> Plan:
    """The job stopped: with its savepoint, or (it ended first) with only its newest snapshot to
    go on from, which is not recorded as a savepoint of the deployment."""
    restore = savepoint or fallback
    if purpose == "delete" or o.deleting:
        return Plan(delete=True, pending=None, reason="deleted")
    if purpose == "suspend" or o.spec.state == "suspended":
        return Plan(
            to=Lifecycle.SUSPENDED,
            pending=None,
            last_savepoint=savepoint,
            rollback_point=restore,
            reason=f"suspended with savepoint {savepoint or '(none: the job ended first)'}",
        )
    gen = o.generation  # the newest spec, even one applied while the old job was stopping
    return Plan(
        to=Lifecycle.UPGRADING,
        start=Start(gen, restore),
        pending=None,
        rollback_point=restore,
        last_savepoint=savepoint,
        reason=f"generation {gen} started from savepoint {savepoint}"
        if savepoint
        else f"generation {gen} started from {restore or 'nothing'} (the job ended before its savepoint)",
    )


def _advance_rescale(o: Observed) -> Plan:
    """The same job goes on with the new parallelism once its rescale savepoint completed."""
    op, job = o.operation, o.job
    if op is None or op.status == "IN_PROGRESS":
        return NOTHING
    if op.status == "COMPLETED" and job is not None and not job.terminal:
        return Plan(
            to=Lifecycle.UPGRADING,
            pending=None,
            rollback_point=op.location,
            last_savepoint=op.location,
            adopt_generation=o.generation,
            reason=f"rescaling job {job.id} to parallelism {(o.pending or {}).get('parallelism') or '?'} "
            f"from savepoint {op.location}",
        )
    savepoint = op.location if op.status == "COMPLETED" else (job.latest_snapshot if job else None)
    return Plan(
        to=Lifecycle.UPGRADING,
        start=Start(o.generation, savepoint),
        pending=None,
        rollback_point=savepoint,
        reason=f"the rescaled job ended: generation {o.generation} started from {savepoint or 'nothing'}",
    )
