"""The JobManager's rules as a table: (job / attempt state, event) -> (new states, effects), with
no catalog, Redis or clock (services/jobmanager/transitions.py)."""

from __future__ import annotations

import pytest

from services.jobmanager import transitions as tr
from services.jobmanager.transitions import Fx
from shared.states import ExecutionState as ES
from shared.states import JobStatus as JS

F = ES.FINISHED


@pytest.mark.parametrize(
    "job, attempts, expected",
    [
        (JS.RUNNING, [F, F], (JS.FINISHED,)),
        (JS.RUNNING, [F, ES.RUNNING], ()),
        (JS.RUNNING, [F, ES.CANCELED], ()),
        (JS.CANCELLING, [ES.CANCELED, F], (JS.CANCELED,)),
        (JS.CANCELLING, [ES.CANCELING], ()),
        (JS.RESTARTING, [F], ()),
        (JS.FAILED, [ES.FAILED], ()),
    ],
)
def test_settle(job, attempts, expected):
    assert tr.settle(job, attempts).job == expected


@pytest.mark.parametrize(
    "job, can_restart, cause, permanent, still_running, jobs, attempt, effects",
    [
        (JS.RUNNING, True, "TaskFailure", False, False, (JS.RESTARTING,), ES.FAILED, {Fx.CANCEL_TASKS, Fx.RESTART}),
        (JS.RUNNING, False, "TaskFailure", False, False, (JS.FAILING, JS.FAILED), ES.FAILED, {Fx.CANCEL_TASKS}),
        (JS.RUNNING, True, "SinkOwnedError", False, False, (JS.FAILING, JS.FAILED), ES.FAILED, {Fx.CANCEL_TASKS}),
        (
            JS.RUNNING,
            True,
            "IncompatibleStateError",
            False,
            False,
            (JS.FAILING, JS.FAILED),
            ES.FAILED,
            {Fx.CANCEL_TASKS},
        ),
        (
            JS.RUNNING,
            True,
            "NoResourceAvailableException",
            True,
            False,
            (JS.FAILING, JS.FAILED),
            ES.FAILED,
            {Fx.CANCEL_TASKS},
        ),
        (JS.RUNNING, True, "CheckpointException", False, True, (JS.RESTARTING,), None, {Fx.CANCEL_TASKS, Fx.RESTART}),
        (JS.CANCELLING, True, "TaskFailure", False, False, (), ES.FAILED, {Fx.SETTLE}),
        (JS.CANCELLING, True, "CheckpointException", False, True, (), None, set()),
        (JS.RESTARTING, True, "TaskManagerLost", False, False, (), ES.FAILED, set()),
    ],
)
def test_on_failure(job, can_restart, cause, permanent, still_running, jobs, attempt, effects):
    d = tr.on_failure(job, can_restart=can_restart, cause_name=cause, permanent=permanent, still_running=still_running)
    assert (d.job, d.execution, set(d.effects)) == (jobs, attempt, effects)


def test_only_a_running_job_counts_failures():
    assert [j for j in JS if tr.counts_failure(j)] == [JS.RUNNING]


@pytest.mark.parametrize(
    "job, jobs, effects",
    [
        (JS.INITIALIZING, (JS.CANCELED,), set()),
        (JS.CREATED, (JS.CANCELLING,), {Fx.CANCEL_TASKS, Fx.SETTLE}),
        (JS.RUNNING, (JS.CANCELLING,), {Fx.CANCEL_TASKS, Fx.SETTLE}),
        (JS.RESTARTING, (JS.CANCELLING,), {Fx.CANCEL_TASKS, Fx.SETTLE}),
        (JS.CANCELLING, (), {Fx.CANCEL_TASKS, Fx.SETTLE}),
        (JS.FINISHED, (), set()),
        (JS.FAILED, (), set()),
        (JS.CANCELED, (), set()),
    ],
)
def test_on_cancel(job, jobs, effects):
    d = tr.on_cancel(job)
    assert (d.job, set(d.effects)) == (jobs, effects)


@pytest.mark.parametrize(
    "state, attempt, effects",
    [
        (ES.CREATED, ES.CANCELED, {Fx.CANCEL_SLOT_REQUEST}),
        (ES.SCHEDULED, ES.CANCELED, {Fx.CANCEL_SLOT_REQUEST}),
        (ES.DEPLOYING, ES.CANCELING, {Fx.CANCEL_TASK, Fx.ARM_ACK_TIMER}),
        (ES.INITIALIZING, ES.CANCELING, {Fx.CANCEL_TASK, Fx.ARM_ACK_TIMER}),
        (ES.RUNNING, ES.CANCELING, {Fx.CANCEL_TASK, Fx.ARM_ACK_TIMER}),
        (ES.CANCELING, None, {Fx.CANCEL_TASK}),  # sent again: it may have been lost
        (ES.FINISHED, None, set()),
        (ES.FAILED, None, set()),
        (ES.CANCELED, None, set()),
    ],
)
def test_cancel_attempt(state, attempt, effects):
    d = tr.cancel_attempt(state)
    assert (d.execution, set(d.effects)) == (attempt, effects)


@pytest.mark.parametrize(
    "state, same, job, attempt, effects",
    [
        (ES.SCHEDULED, False, JS.RUNNING, ES.DEPLOYING, {Fx.DEPLOY, Fx.ARM_ACK_TIMER}),
        (ES.DEPLOYING, True, JS.RUNNING, None, {Fx.REDEPLOY, Fx.ARM_ACK_TIMER}),
        (ES.DEPLOYING, False, JS.RUNNING, None, {Fx.RELEASE_SLOTS}),
        (ES.SCHEDULED, False, JS.CANCELLING, None, {Fx.RELEASE_SLOTS}),
        (ES.CANCELED, False, JS.RUNNING, None, {Fx.RELEASE_SLOTS}),
        (None, False, None, None, {Fx.RELEASE_SLOTS}),
    ],
)
def test_on_slots_allocated(state, same, job, attempt, effects):
    d = tr.on_slots_allocated(state, same_allocation=same, job=job)
    assert (d.execution, set(d.effects)) == (attempt, effects)


@pytest.mark.parametrize(
    "reported, job, effects",
    [
        (ES.INITIALIZING, JS.RUNNING, set()),
        (ES.RUNNING, JS.RUNNING, {Fx.TRACK_CHECKPOINTS}),
        (ES.RUNNING, JS.CANCELLING, set()),
        (ES.FINISHED, JS.RUNNING, {Fx.RELEASE_SLOTS, Fx.SETTLE}),
        (ES.CANCELED, JS.CANCELLING, {Fx.RELEASE_SLOTS, Fx.SETTLE}),
    ],
)
def test_on_task_report(reported, job, effects):
    d = tr.on_task_report(reported, job=job)
    assert (d.execution, set(d.effects)) == (reported, effects)


@pytest.mark.parametrize(
    "state, waited, resent, effects",
    [
        (ES.DEPLOYING, ES.DEPLOYING, False, {Fx.FAIL_OVER}),
        (ES.RUNNING, ES.DEPLOYING, False, set()),
        (ES.CANCELING, ES.CANCELING, False, {Fx.RESEND_CANCEL, Fx.ARM_ACK_TIMER}),
        (ES.CANCELING, ES.CANCELING, True, {Fx.GIVE_UP_CANCEL}),
        (ES.CANCELED, ES.CANCELING, True, set()),
    ],
)
def test_on_ack_timeout(state, waited, resent, effects):
    assert set(tr.on_ack_timeout(state, waited, resent=resent).effects) == effects


@pytest.mark.parametrize("state, attempt", [(ES.CANCELING, ES.CANCELED), (ES.CANCELED, None), (ES.RUNNING, None)])
def test_give_up_cancel(state, attempt):
    assert tr.give_up_cancel(state).execution == attempt


@pytest.mark.parametrize(
    "command, names, fx",
    [
        ("CancelTask", True, Fx.GIVE_UP_CANCEL),
        ("DeployTask", True, Fx.FAIL_OVER),
        (None, True, Fx.FAIL_OVER),
        ("TriggerCheckpoint", True, Fx.LOG),
        ("DeployTask", False, Fx.LOG),
    ],
)
def test_on_command_rejected(command, names, fx):
    assert tr.on_command_rejected(command, names_attempt=names) == fx


@pytest.mark.parametrize(
    "state, held, reported, fx",
    [
        (None, True, ES.RUNNING, Fx.CANCEL_TASK),
        (ES.CANCELED, True, ES.RUNNING, Fx.CANCEL_TASK),
        (ES.RUNNING, False, ES.RUNNING, Fx.CANCEL_TASK),
        (ES.DEPLOYING, True, ES.RUNNING, Fx.PROMOTE),
        (ES.INITIALIZING, True, ES.RUNNING, Fx.PROMOTE),
        (ES.DEPLOYING, True, ES.INITIALIZING, None),
        (ES.RUNNING, True, ES.RUNNING, None),
    ],
)
def test_reported_attempt(state, held, reported, fx):
    assert tr.reported_attempt(state, held_here=held, reported=reported) == fx


@pytest.mark.parametrize(
    "state, ago, fx",
    [
        (ES.DEPLOYING, 1.0, None),
        (ES.DEPLOYING, tr.DEPLOY_IN_FLIGHT_S + 1, Fx.FAIL_OVER),
        (ES.RUNNING, 0.0, Fx.FAIL_OVER),
        (ES.CANCELING, 0.0, Fx.GIVE_UP_CANCEL),
    ],
)
def test_unreported_attempt(state, ago, fx):
    assert tr.unreported_attempt(state, deployed_s_ago=ago) == fx


@pytest.mark.parametrize(
    "job, fx",
    [
        (JS.INITIALIZING, Fx.SUBMIT),
        (JS.RESTARTING, Fx.RESTART),
        (JS.CANCELLING, Fx.CANCEL_TASKS),
        (JS.RUNNING, Fx.REQUEST_SLOTS),
        (JS.CREATED, Fx.REQUEST_SLOTS),
        (JS.FINISHED, None),
    ],
)
def test_on_recover(job, fx):
    assert tr.on_recover(job) == fx


def test_restart_plan():
    assert tr.on_restart_due(JS.RESTARTING) and not tr.on_restart_due(JS.CANCELLING)
    assert tr.is_rescaling([F, F]) and not tr.is_rescaling([F, ES.FAILED]) and not tr.is_rescaling([])
    assert not tr.restarts_vertex(F, rescaling=False)
    assert tr.restarts_vertex(F, rescaling=True)
    assert tr.restarts_vertex(ES.FAILED, rescaling=False) and tr.restarts_vertex(None, rescaling=False)
    assert tr.rescale().job == (JS.RESTARTING,) and Fx.RESTART in tr.rescale()
