"""The deployments' rules (shared/deployments.py `decide`, with shared/deployment_pending.py and
shared/deployment_rollback.py) as plain values: an `Observed` in, a `Plan` out, one test per
rule, with no catalog, no servers and no mocks. `after` records a plan the way
services/jobmanager/deployment_reconciler.py does, for the rules that take two passes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.autoscaling import AutoscalerSpec
from shared.deployment_pending import RETRY_FAILED_STOP_S, STOP_GRACE_S
from shared.deployment_rollback import FAILURES_BEFORE_ROLLBACK
from shared.deployments import (
    DEFAULT_HISTORY_MAX,
    DEFAULT_READY_WITHIN_S,
    NOTHING,
    STUCK_AFTER_AT_LEAST_S,
    STUCK_AFTER_INTERVALS,
    DeploymentSpec,
    JobView,
    Lifecycle,
    Observed,
    OperationView,
    Plan,
    Start,
    decide,
    waiting_reason,
)
from shared.states import check_deployment_transition

L = Lifecycle
INTERVAL_S = 0.5
V1 = DeploymentSpec(jar_id="jar-1", program_args=("v1",), config={"execution.checkpointing.interval": "500 ms"})
V2 = replace(V1, program_args=("v2",))
V3 = replace(V1, program_args=("v3",))
HEALTHY = {"checkpoint_since_deploy": True, "newest_checkpoint_age_s": 0.2, "latest_snapshot": "chk-1"}


def job(status: str = "RUNNING", *, id: str = "job-1", running: bool | None = None, **kw) -> JobView:
    return JobView(
        id=id,
        status=status,
        terminal=status in ("FINISHED", "CANCELED", "FAILED"),
        running=status == "RUNNING" if running is None else running,
        **kw,
    )


def observed(**kw) -> Observed:
    """A STABLE deployment at generation 1 (V1) whose job runs and checkpoints, changed by `kw`."""
    base = dict(
        generation=1,
        spec=V1,
        lifecycle=L.STABLE,
        job=job(**HEALTHY),
        job_generation=1,
        stable_generation=1,
        stable_spec=V1,
        rollback_point=None,
        last_savepoint=None,
        blocked_generation=None,
        pending=None,
        operation=None,
        deployed_s_ago=600.0,
    )
    return Observed(**{**base, **kw})


def upgrading(**kw) -> Observed:
    """Generation 2 (V2) started 5 s ago from savepoint sp-1, not ready yet; generation 1 is stable."""
    return observed(
        **{
            "generation": 2,
            "spec": V2,
            "lifecycle": L.UPGRADING,
            "job": job(id="job-2"),
            "job_generation": 2,
            "rollback_point": "sp-1",
            "deployed_s_ago": 5.0,
            **kw,
        }
    )


def after(o: Observed, plan: Plan, **next_pass) -> Observed:
    """The next pass's `Observed` once `plan` was recorded as the reconciler records it (a job it
    started is new, not RUNNING yet), then changed by `next_pass`. A move the lifecycle's table
    refuses fails here, as `transition_deployment` would refuse it."""
    c: dict = {}
    if plan.to is not None:
        if plan.to != o.lifecycle:
            check_deployment_transition(o.lifecycle, plan.to)
        c["lifecycle"] = plan.to
    if not plan.keep_pending:
        c["pending"], c["operation"] = plan.pending, None
    if plan.block is not None:
        c["blocked_generation"] = plan.block
    if plan.unblock:
        c["blocked_generation"] = None
    if plan.stable:
        c["stable_generation"] = o.job_generation
    for name in ("rollback_point", "last_savepoint"):
        if getattr(plan, name) is not None:
            c[name] = getattr(plan, name)
    if plan.consume_rollback_request:
        c["rollback_requested"] = False
    if plan.start is not None:
        c.update(
            job=job("CREATED", id=f"job-g{plan.start.generation}"),
            job_generation=plan.start.generation,
            deployed_s_ago=0.0,
        )
    return replace(o, **{**c, **next_pass})


def stop_pending(purpose: str, op_status: str = "IN_PROGRESS", location: str | None = None, **kw) -> Observed:
    """UPGRADING to generation 2 (or `purpose` another stop) with its stop-with-savepoint under way."""
    pending = {"kind": "stop", "purpose": purpose, **({"generation": 2} if purpose in ("upgrade", "rescale") else {})}
    base = {
        "generation": 2,
        "spec": V2,
        "lifecycle": L.UPGRADING,
        "pending": pending,
        "operation": OperationView("op-1", op_status, location, "disk full" if op_status == "FAILED" else None),
    }
    return observed(**{**base, **kw})


# --- a new deployment ------------------------------------------------------------------------


def test_a_new_deployment_is_started_deploying_from_nothing():
    plan = decide(
        observed(
            lifecycle=None, job=None, job_generation=None, stable_generation=None, stable_spec=None, deployed_s_ago=None
        )
    )
    assert plan.to == L.DEPLOYING and plan.start == Start(1, None)
    assert plan.pending is None and not plan.keep_pending and plan.clear_error and not plan.cancel_job


def test_a_deployment_suspended_at_creation_goes_suspended_without_a_job():
    plan = decide(
        observed(
            spec=replace(V1, state="suspended"),
            lifecycle=None,
            job=None,
            job_generation=None,
            stable_generation=None,
            stable_spec=None,
            deployed_s_ago=None,
        )
    )
    assert plan.to == L.SUSPENDED and plan.start is None and plan.stop is None and not plan.cancel_job


# --- ready, or not yet -----------------------------------------------------------------------


@pytest.mark.parametrize("lifecycle, stable", [(L.DEPLOYING, None), (L.UPGRADING, 1)])
def test_a_new_generation_is_stable_once_its_job_runs_and_completed_a_checkpoint(lifecycle, stable):
    o = upgrading(lifecycle=lifecycle, stable_generation=stable, job=job(id="job-2", **HEALTHY))
    plan = decide(o)
    assert plan.to == L.STABLE and plan.stable and plan.clear_error
    assert plan.start is None and not plan.cancel_job and plan.error is None
    assert after(o, plan).stable_generation == 2


@pytest.mark.parametrize(
    "view",
    [
        job(id="job-2"),  # RUNNING, no checkpoint since deploy yet
        job("RUNNING", id="job-2", running=False, checkpoint_since_deploy=True),  # an attempt not RUNNING
        job("RESTARTING", id="job-2", failures_since_deploy=FAILURES_BEFORE_ROLLBACK - 1),
    ],
)
@pytest.mark.parametrize("lifecycle", [L.DEPLOYING, L.UPGRADING])
def test_a_new_generation_is_not_stable_before_it_runs_and_checkpoints(lifecycle, view):
    assert decide(upgrading(lifecycle=lifecycle, job=view)) == NOTHING


# --- a changed spec on a STABLE deployment ---------------------------------------------------


def test_a_changed_spec_in_savepoint_mode_stops_the_job_with_a_savepoint():
    plan = decide(observed(generation=2, spec=V2))
    assert plan.to == L.UPGRADING and plan.stop == "upgrade" and plan.clear_error
    assert plan.pending == {"kind": "stop", "purpose": "upgrade", "generation": 2}
    assert not plan.cancel_job and plan.start is None and plan.rescale_to is None


@pytest.mark.parametrize("mode, restore", [("last-state", "chk-5"), ("stateless", None)])
def test_a_changed_spec_in_last_state_or_stateless_mode_cancels_then_starts(mode, restore):
    o = observed(generation=2, spec=replace(V2, upgrade_mode=mode))
    plan = decide(o)
    assert plan.to == L.UPGRADING and plan.cancel_job and plan.stop is None and plan.start is None
    assert plan.pending == {
        "kind": "ends",
        "purpose": "upgrade",
        "generation": 2,
        "restore": "latest" if mode == "last-state" else None,
    }
    assert decide(after(o, plan, job=job(id="job-1", latest_snapshot="chk-9"))) == NOTHING  # still cancelling
    ended = decide(after(o, plan, job=job("CANCELED", latest_snapshot="chk-5")))
    assert ended.start == Start(2, restore) and ended.to == L.UPGRADING and ended.pending is None


def test_a_parallelism_only_change_rescales_the_running_job():
    o = observed(generation=2, spec=replace(V1, parallelism=3))
    plan = decide(o)
    assert plan.to == L.UPGRADING and plan.rescale_to == 3 and plan.stop is None
    assert not plan.cancel_job and plan.start is None
    assert plan.pending == {"kind": "stop", "purpose": "rescale", "generation": 2, "parallelism": 3}
    done = decide(after(o, plan, pending=plan.pending, operation=OperationView("op-1", "COMPLETED", "sp-r")))
    assert done.adopt_generation == 2 and done.start is None and not done.cancel_job
    assert done.rollback_point == done.last_savepoint == "sp-r" and done.pending is None


def test_a_lifecycle_only_change_adopts_the_running_job_without_touching_it():
    o = observed(generation=2, spec=replace(V1, ready_within_s=30.0), job=job(parallelism=1, **HEALTHY))
    plan = decide(o)
    assert plan.to == L.STABLE and plan.adopt_generation == 2 and plan.stable
    assert plan.rescale_to is None and plan.stop is None and not plan.cancel_job and plan.start is None


# --- the autoscaler's parallelism (shared/autoscaling.py decides it, these rules carry it out) ---

AUTOSCALED = replace(V1, autoscaler=AutoscalerSpec(enabled=True, min_parallelism=1, max_parallelism=2))


def test_the_autoscalers_choice_rescales_a_stable_job_through_a_savepoint():
    o = observed(
        spec=AUTOSCALED, stable_spec=AUTOSCALED, job=job(parallelism=1, **HEALTHY), parallelism=2, scaled_from=1
    )
    plan = decide(o)
    assert plan.to == L.UPGRADING and plan.rescale_to == 2 and "autoscaler" in plan.reason
    assert plan.pending == {"kind": "stop", "purpose": "rescale", "generation": 1, "parallelism": 2}
    done = decide(after(o, plan, pending=plan.pending, operation=OperationView("op-1", "COMPLETED", "sp-r")))
    assert done.adopt_generation == 1 and done.rollback_point == "sp-r"


def test_a_rescaled_job_that_runs_and_checkpoints_settles_the_rescale():
    o = observed(
        spec=AUTOSCALED,
        stable_spec=AUTOSCALED,
        lifecycle=L.UPGRADING,
        job=job(parallelism=2, **HEALTHY),
        parallelism=2,
        scaled_from=1,
        deployed_s_ago=3.0,
    )
    plan = decide(o)
    assert plan.to == L.STABLE and plan.scale_settled and plan.stable


def test_a_rescale_that_is_not_ready_goes_back_to_the_previous_parallelism():
    o = observed(
        spec=AUTOSCALED,
        stable_spec=AUTOSCALED,
        lifecycle=L.UPGRADING,
        rollback_point="sp-r",
        job=job(parallelism=2, failures_since_deploy=1, failure="OOM"),
        parallelism=2,
        scaled_from=1,
        deployed_s_ago=3.0,
    )
    plan = decide(o)
    assert plan.to == L.ROLLING_BACK and plan.cancel_job and plan.unscale_to == 1
    assert plan.pending == {"kind": "ends", "purpose": "rollback", "generation": 1, "restore": "sp-r", "parallelism": 1}
    ended = decide(
        after(o, plan, pending=plan.pending, job=job("CANCELED", parallelism=2), parallelism=1, scaled_from=None)
    )
    assert ended.start == Start(1, "sp-r", parallelism=1) and ended.to == L.ROLLING_BACK


def test_a_running_job_at_the_target_parallelism_is_not_rescaled():
    plan = decide(observed(spec=AUTOSCALED, stable_spec=AUTOSCALED, job=job(parallelism=2, **HEALTHY), parallelism=2))
    assert plan == NOTHING


def test_a_parallelism_only_change_in_stateless_mode_cancels_instead_of_rescaling():
    plan = decide(observed(generation=2, spec=replace(V1, parallelism=3, upgrade_mode="stateless")))
    assert plan.cancel_job and plan.rescale_to is None and plan.pending["restore"] is None


# --- a pending stop with a savepoint ---------------------------------------------------------


@pytest.mark.parametrize("op_status, location", [("IN_PROGRESS", None), ("COMPLETED", "sp-2")])
def test_a_pending_stop_waits_while_the_job_is_live(op_status, location):
    assert decide(stop_pending("upgrade", op_status, location)) == NOTHING


def test_a_stop_whose_job_ended_starts_the_newest_generation_from_its_savepoint():
    # Generation 3 was applied while generation 2's stop was under way: 3 is started, not 2.
    plan = decide(stop_pending("upgrade", "COMPLETED", "sp-2", generation=3, spec=V3, job=job("FINISHED")))
    assert plan.to == L.UPGRADING and plan.start == Start(3, "sp-2") and plan.pending is None
    assert plan.rollback_point == plan.last_savepoint == "sp-2" and not plan.cancel_job


def test_a_failed_stop_with_the_job_running_goes_back_to_stable_and_blocks_the_generation():
    o = stop_pending("upgrade", "FAILED")
    plan = decide(o)
    assert plan.to == L.STABLE and plan.block == 2 and plan.pending is None
    assert "disk full" in plan.error and plan.start is None and not plan.cancel_job
    assert decide(after(o, plan)) == NOTHING  # not retried by itself


# --- not ready: rolled back, or failed -------------------------------------------------------


def test_not_ready_within_ready_within_rolls_back_after_the_job_is_cancelled():
    o = upgrading(deployed_s_ago=DEFAULT_READY_WITHIN_S + 1)
    plan = decide(o)
    assert plan.to == L.ROLLING_BACK and plan.cancel_job and plan.start is None and plan.block == 2
    assert "readyWithin" in plan.error and not plan.consume_rollback_request
    assert plan.pending == {
        "kind": "ends",
        "purpose": "rollback",
        "generation": 1,
        "restore": "sp-1",
        "fromStable": True,
    }
    assert decide(after(o, plan, job=job("CANCELLING", id="job-2", running=False))) == NOTHING
    ended = decide(after(o, plan, job=job("CANCELED", id="job-2", latest_snapshot="chk-2")))
    assert ended.to == L.ROLLING_BACK and ended.start == Start(1, "sp-1", from_stable=True)
    assert ended.rollback_point == "sp-1" and ended.pending is None


def test_a_new_generation_whose_job_ended_rolls_back_at_once():
    plan = decide(upgrading(job=job("FAILED", id="job-2", failure="boom")))
    assert plan.to == L.ROLLING_BACK and plan.start == Start(1, "sp-1", from_stable=True)
    assert not plan.cancel_job and plan.pending is None and plan.block == 2 and "boom" in plan.error


def test_a_new_generation_that_fails_is_rolled_back_before_ready_within():
    o = upgrading(job=job("RESTARTING", id="job-2", failures_since_deploy=FAILURES_BEFORE_ROLLBACK))
    plan = decide(o)
    assert plan.to == L.ROLLING_BACK and plan.cancel_job and plan.pending["purpose"] == "rollback"
    assert f"failed {FAILURES_BEFORE_ROLLBACK} time(s)" in plan.error


def test_not_ready_with_rollback_disabled_fails_the_generation():
    plan = decide(upgrading(spec=replace(V2, rollback_enabled=False), deployed_s_ago=DEFAULT_READY_WITHIN_S + 1))
    assert plan.to == L.FAILED and plan.block == 2 and "disabled" in plan.reason
    assert plan.start is None and not plan.cancel_job and plan.pending is None


@pytest.mark.parametrize("lifecycle", [L.DEPLOYING, L.UPGRADING])
def test_not_ready_without_a_stable_generation_fails(lifecycle):
    plan = decide(
        upgrading(lifecycle=lifecycle, stable_generation=None, stable_spec=None, job=job("FAILED", id="job-2"))
    )
    assert plan.to == L.FAILED and plan.block == 2 and plan.start is None and not plan.cancel_job


def test_a_ready_within_counts_from_the_spec():
    o = upgrading(spec=replace(V2, ready_within_s=10.0))
    assert decide(replace(o, deployed_s_ago=9.0)) == NOTHING
    assert decide(replace(o, deployed_s_ago=11.0)).to == L.ROLLING_BACK


# --- rolled back -----------------------------------------------------------------------------


def rolled_back(**kw) -> Observed:
    """Generation 2 was rolled back: generation 1's job runs (job-3), 2 is blocked."""
    return observed(
        **{
            "generation": 2,
            "spec": V2,
            "lifecycle": L.ROLLED_BACK,
            "job": job(id="job-3", **HEALTHY),
            "blocked_generation": 2,
            "rollback_point": "sp-1",
            **kw,
        }
    )


def test_rolling_back_becomes_rolled_back_and_keeps_the_error():
    plan = decide(rolled_back(lifecycle=L.ROLLING_BACK))
    assert plan.to == L.ROLLED_BACK and not plan.stable and not plan.clear_error and plan.error is None


def test_the_rolled_back_generation_is_not_applied_again():
    assert decide(rolled_back()) == NOTHING


def test_a_newer_generation_after_a_rollback_is_applied():
    plan = decide(rolled_back(generation=3, spec=V3))
    assert plan.to == L.UPGRADING and plan.stop == "upgrade" and plan.pending["generation"] == 3
    assert plan.clear_error


@pytest.mark.parametrize("lifecycle", [L.ROLLING_BACK, L.DEPLOYING])
def test_a_failing_stable_generation_does_not_bring_back_the_rolled_back_one(lifecycle):
    o = rolled_back(lifecycle=lifecycle, job=job("FAILED", id="job-3", latest_snapshot="chk-3"), deployed_s_ago=5.0)
    failed = decide(o)
    assert failed.to == L.FAILED
    nxt = decide(after(o, failed))
    assert nxt.start is None and not nxt.cancel_job, nxt


# --- a FAILED deployment ---------------------------------------------------------------------


def test_a_new_generation_on_a_failed_deployment_cancels_then_starts_from_the_latest_snapshot():
    o = observed(
        generation=2,
        spec=V2,
        lifecycle=L.FAILED,
        blocked_generation=1,
        stable_generation=None,
        stable_spec=None,
        job=job("RESTARTING", latest_snapshot="chk-7"),
    )
    plan = decide(o)
    assert plan.to == L.UPGRADING and plan.cancel_job and plan.start is None and plan.clear_error
    assert plan.pending == {"kind": "ends", "purpose": "upgrade", "generation": 2, "restore": "latest"}
    ended = decide(after(o, plan, job=job("CANCELED", latest_snapshot="chk-7")))
    assert ended.start == Start(2, "chk-7") and ended.rollback_point == "chk-7"


def test_a_new_generation_on_a_failed_deployment_whose_job_ended_starts_at_once():
    plan = decide(
        observed(
            generation=2, spec=V2, lifecycle=L.FAILED, blocked_generation=1, job=job("FAILED", latest_snapshot="chk-7")
        )
    )
    assert plan.to == L.UPGRADING and plan.start == Start(2, "chk-7") and not plan.cancel_job


def test_a_failed_deployment_without_a_new_generation_stays_failed():
    assert decide(observed(lifecycle=L.FAILED, blocked_generation=1, job=job("FAILED"))) == NOTHING


# --- a STABLE deployment kept healthy --------------------------------------------------------


def test_a_stable_job_that_ended_is_started_again_from_its_latest_snapshot():
    plan = decide(observed(job=job("FAILED", latest_snapshot="chk-4")))
    assert plan.to == L.DEPLOYING and plan.start == Start(1, "chk-4") and plan.rollback_point == "chk-4"
    assert not plan.cancel_job


def test_a_stable_job_without_a_checkpoint_for_too_many_intervals_is_restarted_from_its_latest():
    stuck = job(**{**HEALTHY, "newest_checkpoint_age_s": STUCK_AFTER_AT_LEAST_S + 1})
    plan = decide(observed(job=stuck))
    assert plan.to == L.DEPLOYING and plan.cancel_job and plan.start is None
    assert plan.pending == {
        "kind": "ends",
        "purpose": "restart",
        "generation": 1,
        "restore": "latest",
        "fromStable": False,
    }
    at_bound = job(**{**HEALTHY, "newest_checkpoint_age_s": STUCK_AFTER_AT_LEAST_S})
    assert decide(observed(job=at_bound)) == NOTHING
    no_interval = replace(V1, config={})
    assert decide(observed(spec=no_interval, stable_spec=no_interval, job=stuck)) == NOTHING


def test_a_periodic_savepoint_is_taken_when_due():
    plan = decide(observed(savepoint_due=True))
    assert plan.savepoint and plan.pending == {"kind": "savepoint", "purpose": "periodic"}
    assert plan.to is None and plan.stop is None and not plan.cancel_job and plan.start is None
    assert decide(observed()) == NOTHING


def test_a_completed_periodic_savepoint_clears_pending_and_records_it():
    pending = {"kind": "savepoint", "purpose": "periodic"}
    assert decide(observed(pending=pending, operation=OperationView("op-1", "IN_PROGRESS"))) == NOTHING
    plan = decide(observed(pending=pending, operation=OperationView("op-1", "COMPLETED", "sp-p")))
    assert plan.pending is None and not plan.keep_pending and plan.last_savepoint == "sp-p" and plan.to is None
    failed = decide(observed(pending=pending, operation=OperationView("op-1", "FAILED", failure="disk full")))
    assert failed.pending is None and failed.last_savepoint is None and "disk full" in failed.reason


# --- suspend and resume ----------------------------------------------------------------------


def test_suspending_a_live_job_stops_it_with_a_savepoint():
    plan = decide(observed(generation=2, spec=replace(V1, state="suspended")))
    assert plan.stop == "suspend" and plan.pending == {"kind": "stop", "purpose": "suspend"}
    assert plan.to is None and not plan.cancel_job and plan.start is None


def test_a_completed_suspend_is_suspended_with_its_savepoint():
    o = stop_pending(
        "suspend", "COMPLETED", "sp-s", spec=replace(V1, state="suspended"), lifecycle=L.STABLE, job=job("FINISHED")
    )
    plan = decide(o)
    assert plan.to == L.SUSPENDED and plan.last_savepoint == "sp-s" and plan.pending is None and plan.start is None
    assert decide(after(o, plan)) == NOTHING


def test_resuming_deploys_the_generation_from_the_last_savepoint():
    plan = decide(
        observed(generation=3, lifecycle=L.SUSPENDED, job=job("FINISHED"), last_savepoint="sp-s", blocked_generation=2)
    )
    assert plan.to == L.DEPLOYING and plan.start == Start(3, "sp-s") and plan.rollback_point == "sp-s"
    assert plan.unblock and plan.clear_error and not plan.cancel_job


def suspended_after_rollback(**kw) -> Observed:
    """Generation 2 (V2) was rolled back and generation 1's job ran, until `headrace deploy suspend`
    sent V2's spec back as suspended (generation 3): stopped with savepoint sp-s."""
    o = rolled_back(generation=3, spec=replace(V2, state="suspended"), blocked_spec=V2)
    stop = decide(o)
    assert stop.stop == "suspend" and stop.start is None
    done = after(o, stop, job=job("FINISHED", id="job-3"), operation=OperationView("op-1", "COMPLETED", "sp-s"))
    plan = decide(done)
    assert plan.to == L.SUSPENDED and plan.last_savepoint == "sp-s"
    return after(done, plan, **kw)


def test_resuming_after_a_rollback_runs_the_stable_generation_not_the_rolled_back_one():
    # `headrace deploy resume` sends the same spec back as running: generation 4 is V2 again.
    o = suspended_after_rollback(generation=4, spec=V2)
    plan = decide(o)
    assert plan.to == L.DEPLOYING and plan.start == Start(1, "sp-s", from_stable=True)
    assert plan.rollback_point == "sp-s" and plan.block == 4 and not plan.unblock and not plan.cancel_job
    assert "generation 1" in plan.reason and "not run" in plan.reason
    running = after(o, plan, job=job(id="job-g1", **HEALTHY))
    settled = decide(running)
    assert settled.to == L.ROLLED_BACK and not settled.clear_error and settled.start is None
    assert decide(after(running, settled)) == NOTHING  # V2 is not tried again by itself


def test_resuming_after_a_rollback_with_a_new_version_runs_the_new_version():
    o = suspended_after_rollback(generation=4, spec=V3)
    plan = decide(o)
    assert plan.to == L.DEPLOYING and plan.start == Start(4, "sp-s") and plan.unblock


# --- deleting --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "view, with_savepoint, stop, cancel, pending, delete",
    [
        (job(**HEALTHY), True, "delete", False, {"kind": "stop", "purpose": "delete"}, False),
        (job(**HEALTHY), False, None, True, {"kind": "ends", "purpose": "delete"}, False),
        (job("FINISHED"), True, None, False, None, True),
        (None, True, None, False, None, True),
    ],
)
def test_deleting_stops_or_cancels_a_live_job_first(view, with_savepoint, stop, cancel, pending, delete):
    o = observed(job=view, deleting=True, delete_with_savepoint=with_savepoint)
    plan = decide(o)
    assert (plan.stop, plan.cancel_job, plan.pending, plan.delete) == (stop, cancel, pending, delete)
    assert plan.start is None
    if pending:
        assert decide(after(o, plan, job=job("FINISHED"))).delete


@pytest.mark.parametrize("change", [{"deleting": True}, {"generation": 3, "spec": replace(V2, state="suspended")}])
def test_an_upgrade_stop_that_completes_after_delete_or_suspend_starts_no_job(change):
    plan = decide(stop_pending("upgrade", "COMPLETED", "sp-2", job=job("FINISHED"), **change))
    assert plan.start is None, plan


# --- a rollback asked for --------------------------------------------------------------------


@pytest.mark.parametrize("enabled", [True, False])
def test_a_rollback_asked_for_while_upgrading_rolls_back_and_consumes_the_request(enabled):
    plan = decide(upgrading(spec=replace(V2, rollback_enabled=enabled), rollback_requested=True))
    assert plan.to == L.ROLLING_BACK and plan.consume_rollback_request and plan.cancel_job and plan.block == 2
    assert plan.pending == {
        "kind": "ends",
        "purpose": "rollback",
        "generation": 1,
        "restore": "sp-1",
        "fromStable": True,
    }


def test_an_unknown_pending_step_is_dropped():
    plan = decide(observed(pending={"kind": "mystery"}))
    assert plan.pending is None and not plan.keep_pending and plan.start is None and not plan.cancel_job


# --- the spec as stored ----------------------------------------------------------------------


def test_from_record_fills_in_the_defaults():
    spec = DeploymentSpec.from_record({"jarId": "jar-1"})
    assert spec == DeploymentSpec(jar_id="jar-1")
    assert (spec.entry, spec.kind, spec.parallelism, spec.upgrade_mode, spec.state) == (
        "build",
        "pyspark",
        1,
        "savepoint",
        "running",
    )
    assert spec.rollback_enabled and spec.ready_within_s == DEFAULT_READY_WITHIN_S
    assert spec.savepoint_interval_s is None and spec.history_max == DEFAULT_HISTORY_MAX


def test_from_record_reads_every_field_with_durations_in_seconds():
    spec = DeploymentSpec.from_record(
        {
            "jarId": 7,
            "entryClass": "main",
            "kind": "noop",
            "programArgsList": ["a", 2],
            "parallelism": "3",
            "flinkConfiguration": {"k": "v"},
            "restartStrategy": {"type": "none"},
            "upgradeMode": "last-state",
            "state": "suspended",
            "rollback": {"enabled": False, "readyWithin": 30},
            "savepoints": {"interval": 600, "historyMax": 2},
        }
    )
    assert spec == DeploymentSpec(
        jar_id="7",
        entry="main",
        kind="noop",
        program_args=("a", "2"),
        parallelism=3,
        config={"k": "v"},
        restart_strategy={"type": "none"},
        upgrade_mode="last-state",
        state="suspended",
        rollback_enabled=False,
        ready_within_s=30.0,
        savepoint_interval_s=600.0,
        history_max=2,
    )
    with_units = DeploymentSpec.from_record(
        {"jarId": "j", "rollback": {"readyWithin": "2 min", "enabled": None}, "savepoints": {"interval": "1 h"}}
    )
    assert (with_units.ready_within_s, with_units.savepoint_interval_s) == (120.0, 3600.0)
    assert with_units.rollback_enabled  # only an explicit false disables it


def test_same_version_ignores_only_the_desired_state():
    assert V1.same_version(replace(V1, state="suspended")) and replace(V1, state="suspended").same_version(V1)
    assert not V1.same_version(replace(V1, parallelism=2)) and not V1.same_version(V2)


@pytest.mark.parametrize(
    "change, same",
    [
        ({"parallelism": 4}, True),
        (
            {
                "upgrade_mode": "stateless",
                "rollback_enabled": False,
                "ready_within_s": 5.0,
                "state": "suspended",
                "savepoint_interval_s": 60.0,
                "history_max": 1,
            },
            True,
        ),
        ({"config": {"execution.checkpointing.interval": "500 ms"}}, True),  # an equal mapping
        ({"jar_id": "jar-2"}, False),
        ({"entry": "main"}, False),
        ({"kind": "noop"}, False),
        ({"program_args": ("v2",)}, False),
        ({"config": {"execution.checkpointing.interval": "1 s"}}, False),
        ({"restart_strategy": {"type": "none"}}, False),
    ],
)
def test_same_pipeline_except_parallelism(change, same):
    other = replace(V1, **change)
    assert V1.same_pipeline_except_parallelism(other) is same
    assert other.same_pipeline_except_parallelism(V1) is same


def test_a_failed_suspend_stop_waits_before_it_is_tried_again():
    o = stop_pending("suspend", "FAILED", None, job=job("RUNNING"), spec=replace(V2, state="suspended"))
    plan = decide(replace(o, now_s=1000.0))
    assert plan.pending == {"kind": "wait", "until": 1000.0 + RETRY_FAILED_STOP_S} and plan.start is None
    waiting = replace(o, pending=plan.pending, operation=None)
    assert decide(replace(waiting, now_s=1000.0 + RETRY_FAILED_STOP_S - 1)).nothing
    assert decide(replace(waiting, now_s=1000.0 + RETRY_FAILED_STOP_S)).pending is None


def test_a_stop_that_ended_without_its_savepoint_records_no_savepoint():
    plan = decide(stop_pending("upgrade", "FAILED", None, job=job("FAILED", latest_snapshot="chk-7")))
    assert plan.start is not None and plan.start.restore_from == "chk-7"
    assert plan.last_savepoint is None and plan.rollback_point == "chk-7"


def test_checkpoints_that_fall_behind_for_a_few_intervals_are_not_a_stuck_job():
    behind = job(**{**HEALTHY, "newest_checkpoint_age_s": STUCK_AFTER_INTERVALS * INTERVAL_S * 10})
    assert decide(observed(job=behind)).nothing


@pytest.mark.parametrize("job_generation, to", [(1, L.STABLE), (0, L.ROLLED_BACK)])
def test_a_failed_deployment_whose_job_runs_and_checkpoints_after_all_recovers(job_generation, to):
    o = observed(lifecycle=L.FAILED, job=job(**HEALTHY), job_generation=job_generation, blocked_generation=1)
    plan = decide(o)
    assert plan.to == to and plan.stable and plan.start is None and plan.cancel_job is False


def test_a_rollback_asked_for_after_the_new_generation_became_stable_changes_nothing():
    plan = decide(observed(rollback_requested=True))
    assert plan.consume_rollback_request and plan.to is None and not plan.cancel_job and plan.start is None


def test_a_task_that_hangs_after_its_stop_savepoint_is_cancelled_once():
    o = stop_pending("upgrade", "COMPLETED", "sp-2", job=job("RUNNING"))
    o = replace(o, pending={**o.pending, "op": "op-1"})
    assert decide(replace(o, operation=replace(o.operation, done_s_ago=STOP_GRACE_S - 1))).nothing
    late = replace(o, operation=replace(o.operation, done_s_ago=STOP_GRACE_S + 1))
    plan = decide(late)
    assert plan.cancel_job and plan.pending["cancelled"] and plan.pending["op"] == o.pending["op"]
    assert decide(replace(late, pending=plan.pending)).nothing  # not cancelled again every pass


def test_the_waiting_reason_says_what_a_deployment_waits_for():
    assert "to stop with a savepoint (operation op-1)" in waiting_reason(
        "UPGRADING", {"kind": "stop", "op": "op-1"}, "job-1", "RUNNING", 60
    )
    assert "at most 60 s (rollback.readyWithin)" in waiting_reason("DEPLOYING", None, "job-1", "RUNNING", 60)
    assert waiting_reason("STABLE", None, "job-1", "RUNNING", 60) is None
