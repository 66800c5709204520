"""The JobManager's rules: (job / attempt state, event) -> (new states, effects), decided without
the catalog, Redis or a clock. The handlers (job_master.py, restarts.py, reconciliation.py,
ack_timers.py) load the rows, ask here, and apply what comes back; tests/unit/test_transitions.py
holds the table. Which single state changes are legal at all stays in shared/states.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from shared.states import ExecutionState as ES
from shared.states import JobStatus as JS

# Failures a restart cannot cure: the job fails at once instead of looping through its restarts.
# SinkOwnedError: the sink's target belongs to another lineage; every retry is refused alike.
# Failures a restart cannot mend: the job fails at once. The Kafka ones are a pipeline's settings
# (options, delivery word, a transaction timeout the brokers refuse) and records Kafka no longer has.
# A Delta table path outside the lake, rows that do not fit the table, and a restore the table
# cannot be taken back for (connectors/delta_errors.py) fail alike on every attempt.
NON_RECOVERABLE = frozenset(
    {
        "IncompatibleStateError",
        "SinkOwnedError",
        "KafkaOptionError",
        "DeliveryError",
        "KafkaTimeoutRefused",
        "KafkaDataLoss",
        "DeltaPathRefused",
        "DeltaSchemaMismatch",
        "DeltaUndoRefused",
    }
)

# A DEPLOYING attempt the registering TaskManager does not report may be a deploy still on its
# way (sent just before the registration): leave it to the acknowledgement timer for this long.
DEPLOY_IN_FLIGHT_S = 10.0


class Fx(str, Enum):
    """What a decision asks the handler to do besides changing states."""

    RELEASE_SLOTS = "release slots"
    CANCEL_SLOT_REQUEST = "cancel slot request"
    CANCEL_TASK = "cancel task"
    ARM_ACK_TIMER = "arm acknowledgement timer"
    DEPLOY = "deploy"
    REDEPLOY = "deploy again (same restore point)"
    CANCEL_TASKS = "cancel the job's live attempts"
    SETTLE = "see whether the job ended"
    RESTART = "restart after the backoff"
    FAIL_OVER = "fail the attempt over"
    GIVE_UP_CANCEL = "give the cancel up"
    RESEND_CANCEL = "send the cancel again"
    TRACK_CHECKPOINTS = "track the attempt for checkpoints"
    SUBMIT = "submit"
    REQUEST_SLOTS = "request slots again"
    PROMOTE = "mark RUNNING"
    LOG = "log only"


@dataclass(frozen=True)
class Decision:
    job: tuple[JS, ...] = ()  # the job's state changes, in order
    execution: ES | None = None  # the attempt's new state
    effects: frozenset[Fx] = frozenset()

    def __contains__(self, fx: object) -> bool:
        return fx in self.effects


NOTHING = Decision()


def _d(job: tuple[JS, ...] = (), execution: ES | None = None, *effects: Fx) -> Decision:
    return Decision(job, execution, frozenset(effects))


# --- the job ---------------------------------------------------------------------------------


def settle(job: JS, attempts: Sequence[ES]) -> Decision:
    """An attempt ended (FINISHED or CANCELED, or given up): has the whole job? A RUNNING job
    whose attempts all FINISHED ends FINISHED, unless the handler finds a rescale savepoint
    behind it (`rescale`)."""
    if any(not a.is_terminal for a in attempts):
        return NOTHING
    if job == JS.CANCELLING:
        return _d((JS.CANCELED,))
    if job == JS.RUNNING and all(a == ES.FINISHED for a in attempts):
        return _d((JS.FINISHED,))
    return NOTHING


def rescale() -> Decision:
    """The attempts stopped for a rescale savepoint: start again from it, at once."""
    return _d((JS.RESTARTING,), None, Fx.RESTART)


def counts_failure(job: JS) -> bool:
    """Does a failed attempt count against the job's restart strategy? Only while it runs."""
    return job == JS.RUNNING


def on_failure(job: JS, *, can_restart: bool, cause_name: str, permanent: bool, still_running: bool) -> Decision:
    """An attempt failed (`still_running`: decided here while it still runs, e.g. a checkpoint
    failover). `can_restart`: the restart strategy's answer after counting this failure."""
    attempt = None if still_running else ES.FAILED
    if job == JS.CANCELLING:
        return _d((), attempt) if still_running else _d((), attempt, Fx.SETTLE)
    if job != JS.RUNNING:
        return _d((), attempt)
    if can_restart and cause_name not in NON_RECOVERABLE and not permanent:
        return _d((JS.RESTARTING,), attempt, Fx.CANCEL_TASKS, Fx.RESTART)
    return _d((JS.FAILING, JS.FAILED), attempt, Fx.CANCEL_TASKS)


def on_cancel(job: JS) -> Decision:
    """A cancel request for the job."""
    if job.is_terminal:
        return NOTHING
    if job == JS.INITIALIZING:
        return _d((JS.CANCELED,))
    if job == JS.CANCELLING:
        return _d((), None, Fx.CANCEL_TASKS, Fx.SETTLE)
    return _d((JS.CANCELLING,), None, Fx.CANCEL_TASKS, Fx.SETTLE)


def on_restart_due(job: JS) -> bool:
    """Its backoff is over: restart? Not if the job was cancelled (or moved on) meanwhile."""
    return job == JS.RESTARTING


def restarts_vertex(previous: ES | None, *, rescaling: bool) -> bool:
    """Does a restart start a new attempt of this vertex? Not of one that FINISHED, unless the
    job is being rescaled (RESTARTING with every attempt FINISHED: all start again)."""
    return previous is None or previous != ES.FINISHED or rescaling


def is_rescaling(attempts: Sequence[ES]) -> bool:
    return bool(attempts) and all(a == ES.FINISHED for a in attempts)


def on_recover(job: JS) -> Fx | None:
    """A new leader picks the job up."""
    return {
        JS.INITIALIZING: Fx.SUBMIT,
        JS.RESTARTING: Fx.RESTART,
        JS.CANCELLING: Fx.CANCEL_TASKS,
        JS.RUNNING: Fx.REQUEST_SLOTS,
        JS.CREATED: Fx.REQUEST_SLOTS,
    }.get(job)


# --- one attempt -----------------------------------------------------------------------------


def cancel_attempt(state: ES) -> Decision:
    """The job's attempt is to stop (a restart or a cancel). One already CANCELING gets the
    command again: it may have been lost with a TaskManager or a JobManager."""
    if state.is_terminal:
        return NOTHING
    if state in (ES.CREATED, ES.SCHEDULED):
        return _d((), ES.CANCELED, Fx.CANCEL_SLOT_REQUEST)
    if state == ES.CANCELING:
        return _d((), None, Fx.CANCEL_TASK)
    return _d((), ES.CANCELING, Fx.CANCEL_TASK, Fx.ARM_ACK_TIMER)


def on_slots_allocated(state: ES | None, *, same_allocation: bool, job: JS | None) -> Decision:
    """Slots came for an attempt (`state` None: no such attempt)."""
    if state == ES.DEPLOYING and same_allocation:
        return _d((), None, Fx.REDEPLOY, Fx.ARM_ACK_TIMER)  # redelivered: the TaskManager dedups
    if state == ES.SCHEDULED and job == JS.RUNNING:
        return _d((), ES.DEPLOYING, Fx.DEPLOY, Fx.ARM_ACK_TIMER)
    return _d((), None, Fx.RELEASE_SLOTS)  # nobody wants them any more: give them back


def on_task_report(reported: ES, *, job: JS | None) -> Decision:
    """A TaskManager reported a state of the attempt it holds, a legal change by shared/states.py
    (FAILED goes to `on_failure`). `job`: the job's status, asked for RUNNING reports only."""
    effects = [Fx.TRACK_CHECKPOINTS] if reported == ES.RUNNING and job == JS.RUNNING else []
    if reported.is_terminal:
        effects += [Fx.RELEASE_SLOTS, Fx.SETTLE]
    return _d((), reported, *effects)


def on_ack_timeout(state: ES, waited_for: ES, *, resent: bool) -> Decision:
    """No TaskManager confirmed a deploy or a cancel in time."""
    if state != waited_for:
        return NOTHING  # acknowledged (or moved on) in time
    if waited_for == ES.DEPLOYING:
        return _d((), None, Fx.FAIL_OVER)
    if not resent:
        return _d((), None, Fx.RESEND_CANCEL, Fx.ARM_ACK_TIMER)
    return _d((), None, Fx.GIVE_UP_CANCEL)


def give_up_cancel(state: ES) -> Decision:
    """CANCELING -> CANCELED without the TaskManager's word."""
    if state != ES.CANCELING:
        return NOTHING
    return _d((), ES.CANCELED, Fx.RELEASE_SLOTS, Fx.SETTLE)


def on_command_rejected(command: str | None, *, names_attempt: bool) -> Fx:
    if not names_attempt:
        return Fx.LOG
    if command == "CancelTask":
        return Fx.GIVE_UP_CANCEL
    if command in (None, "DeployTask"):
        return Fx.FAIL_OVER
    return Fx.LOG


# --- a TaskManager registers (again) ---------------------------------------------------------


def reported_attempt(state: ES | None, *, held_here: bool, reported: ES) -> Fx | None:
    """An attempt the registering TaskManager says it runs (`state` None: unknown here).
    CANCEL_TASK: a zombie we gave up on (e.g. its TaskManager was frozen)."""
    if state is None or state.is_terminal or not held_here:
        return Fx.CANCEL_TASK
    if reported == ES.RUNNING and state in (ES.DEPLOYING, ES.INITIALIZING):
        return Fx.PROMOTE
    return None


def unreported_attempt(state: ES, *, deployed_s_ago: float) -> Fx | None:
    """A live attempt the catalog places on the registering TaskManager, which does not report
    it: it restarted or lost it, so nothing runs it any more."""
    if state == ES.DEPLOYING and deployed_s_ago < DEPLOY_IN_FLIGHT_S:
        return None  # the deploy may still be on its way: its acknowledgement timer decides
    return Fx.GIVE_UP_CANCEL if state == ES.CANCELING else Fx.FAIL_OVER
