"""The state machines of jobs, attempts, checkpoints, REST operations and deployments, with
Flink's names (the Flink Kubernetes Operator's for a deployment's lifecycle).

Each diagram lists, for every state, the states it may move to: exactly the moves of its table
below (`JOB_TRANSITIONS`, `EXECUTION_TRANSITIONS`, `CHECKPOINT_TRANSITIONS`,
`DEPLOYMENT_TRANSITIONS`). OperationStatus has no table: `finish_operation`
(shared/catalog/repository/operations.py) ends an operation once.
tests/unit/test_state_diagrams.py reads these diagrams and their copies in docs/architecture.md
and fails when one differs from the code, so a move is added to a table and both diagrams
together. What it reads: `STATE -> NEXT | NEXT ...`, then optionally a `#` note; `terminal:`
naming the states no move leaves (a machine whose every state has a way out has no such line);
and `start:` naming the states a deployment's first move may reach (`DEPLOYMENT_START`).

JobStatus (one per job)::

    INITIALIZING -> CREATED | FAILED | CANCELED    # FAILED: the dispatcher could not publish SubmitJob
    CREATED      -> RUNNING | FAILED | CANCELLING | CANCELED
    RUNNING      -> FINISHED | FAILING | RESTARTING | CANCELLING
    FAILING      -> FAILED | RESTARTING | CANCELLING
    RESTARTING   -> RUNNING | FAILED | CANCELLING | CANCELED
    CANCELLING   -> CANCELED
    terminal: FINISHED, FAILED, CANCELED

ExecutionState (one per attempt of a task)::

    CREATED      -> SCHEDULED | CANCELING | CANCELED | FAILED
    SCHEDULED    -> DEPLOYING | CANCELING | CANCELED | FAILED    # CANCELED: cancelled before it held slots
    DEPLOYING    -> INITIALIZING | RUNNING | FINISHED | CANCELING | FAILED
    INITIALIZING -> RUNNING | FINISHED | CANCELING | FAILED
    RUNNING      -> FINISHED | CANCELING | FAILED
    CANCELING    -> CANCELED | FINISHED | FAILED    # it finished, failed or lost its TaskManager first
    terminal: FINISHED, CANCELED, FAILED

CheckpointStatus (one per checkpoint or savepoint of a job)::

    IN_PROGRESS -> COMPLETED | FAILED    # FAILED: declined, timed out, or its attempt ended
    COMPLETED   -> DISCARDED             # pruned beyond the retained count, disposed, or failed to restore
    terminal: FAILED, DISCARDED

OperationStatus (one per asynchronous REST operation, Flink's "trigger id" / "request-id")::

    IN_PROGRESS -> COMPLETED | FAILED
    terminal: COMPLETED, FAILED

Lifecycle (one per deployment; null until the JobManager's reconciler first sees it)::

    start: DEPLOYING, SUSPENDED
    DEPLOYING    -> STABLE | ROLLED_BACK | ROLLING_BACK | FAILED | SUSPENDED
    STABLE       -> UPGRADING | DEPLOYING | ROLLING_BACK | FAILED | SUSPENDED    # DEPLOYING: its job restarted
    UPGRADING    -> STABLE | ROLLED_BACK | ROLLING_BACK | FAILED | SUSPENDED
    ROLLING_BACK -> ROLLED_BACK | FAILED | SUSPENDED
    ROLLED_BACK  -> STABLE | UPGRADING | DEPLOYING | ROLLING_BACK | FAILED | SUSPENDED
    SUSPENDED    -> DEPLOYING    # resumed
    FAILED       -> DEPLOYING | UPGRADING | STABLE | ROLLED_BACK | ROLLING_BACK | SUSPENDED

The operations are savepoints, stops, manual checkpoints, disposals and rescales. Terminal states
never change again: a late report for a terminal attempt is refused, which is what makes handlers
idempotent when a message is delivered twice. A deployment's lifecycle has no terminal state (a
deleted deployment's row goes); which move each situation asks for is decided by
shared/deployments.py `decide`, and `transition_deployment` (shared/catalog/repository/
deployments.py) refuses any other.
"""

from __future__ import annotations

from enum import Enum

from shared.errors import HeadraceError


class JobStatus(str, Enum):
    INITIALIZING = "INITIALIZING"
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"
    RESTARTING = "RESTARTING"

    @property
    def is_terminal(self) -> bool:
        return self in _JOB_TERMINAL


class ExecutionState(str, Enum):
    CREATED = "CREATED"
    SCHEDULED = "SCHEDULED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        return self in _EXEC_TERMINAL

    @property
    def holds_slots(self) -> bool:
        return self in (
            ExecutionState.DEPLOYING,
            ExecutionState.INITIALIZING,
            ExecutionState.RUNNING,
            ExecutionState.CANCELING,
        )


_JOB_TERMINAL = {JobStatus.FAILED, JobStatus.CANCELED, JobStatus.FINISHED}
_EXEC_TERMINAL = {ExecutionState.FINISHED, ExecutionState.CANCELED, ExecutionState.FAILED}

J = JobStatus
JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    J.INITIALIZING: frozenset({J.CREATED, J.FAILED, J.CANCELED}),
    J.CREATED: frozenset({J.RUNNING, J.FAILED, J.CANCELLING, J.CANCELED}),
    J.RUNNING: frozenset({J.FINISHED, J.FAILING, J.RESTARTING, J.CANCELLING}),
    J.FAILING: frozenset({J.FAILED, J.RESTARTING, J.CANCELLING}),
    J.RESTARTING: frozenset({J.RUNNING, J.FAILED, J.CANCELLING, J.CANCELED}),
    J.CANCELLING: frozenset({J.CANCELED}),
    J.FAILED: frozenset(),
    J.CANCELED: frozenset(),
    J.FINISHED: frozenset(),
}

E = ExecutionState
_ANY_LIVE = {E.CREATED, E.SCHEDULED, E.DEPLOYING, E.INITIALIZING, E.RUNNING, E.CANCELING}
EXECUTION_TRANSITIONS: dict[ExecutionState, frozenset[ExecutionState]] = {
    E.CREATED: frozenset({E.SCHEDULED, E.CANCELED, E.FAILED, E.CANCELING}),
    E.SCHEDULED: frozenset({E.DEPLOYING, E.CANCELED, E.FAILED, E.CANCELING}),
    E.DEPLOYING: frozenset({E.INITIALIZING, E.RUNNING, E.FINISHED, E.CANCELING, E.FAILED}),
    E.INITIALIZING: frozenset({E.RUNNING, E.FINISHED, E.CANCELING, E.FAILED}),
    E.RUNNING: frozenset({E.FINISHED, E.CANCELING, E.FAILED}),
    E.CANCELING: frozenset({E.CANCELED, E.FAILED, E.FINISHED}),
    E.FINISHED: frozenset(),
    E.CANCELED: frozenset(),
    E.FAILED: frozenset(),
}
assert all(s in EXECUTION_TRANSITIONS for s in _ANY_LIVE)

# Flink's REST API and metrics also name these states. No Headrace job or attempt enters them (a
# new leader picks jobs up as they are, without suspending them), so they are reported as zeros.
FLINK_ONLY_JOB_STATES = ("SUSPENDED", "RECONCILING")
FLINK_ONLY_EXECUTION_STATES = ("RECONCILING",)
JOB_STATE_NAMES = (*(s.value for s in JobStatus), *FLINK_ONLY_JOB_STATES)
EXECUTION_STATE_NAMES = (*(s.value for s in ExecutionState), *FLINK_ONLY_EXECUTION_STATES)


class IllegalTransition(HeadraceError, ValueError):
    """A state change its state machine does not allow."""


def check_job_transition(current: JobStatus, target: JobStatus) -> None:
    if target not in JOB_TRANSITIONS[current]:
        raise IllegalTransition(f"job cannot go from {current.value} to {target.value}")


def check_execution_transition(current: ExecutionState, target: ExecutionState) -> None:
    if target not in EXECUTION_TRANSITIONS[current]:
        raise IllegalTransition(f"execution cannot go from {current.value} to {target.value}")


class CheckpointStatus(str, Enum):
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    DISCARDED = "DISCARDED"


CHECKPOINT_TRANSITIONS: dict[CheckpointStatus, frozenset[CheckpointStatus]] = {
    CheckpointStatus.IN_PROGRESS: frozenset({CheckpointStatus.COMPLETED, CheckpointStatus.FAILED}),
    CheckpointStatus.COMPLETED: frozenset({CheckpointStatus.DISCARDED}),
    CheckpointStatus.FAILED: frozenset(),
    CheckpointStatus.DISCARDED: frozenset(),
}


class OperationStatus(str, Enum):
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


def check_checkpoint_transition(current: CheckpointStatus, target: CheckpointStatus) -> None:
    if target not in CHECKPOINT_TRANSITIONS[current]:
        raise IllegalTransition(f"checkpoint cannot go from {current.value} to {target.value}")


class Lifecycle(str, Enum):
    """A deployment's lifecycle state (`deployments.lifecycle`; None until first reconciled)."""

    DEPLOYING = "DEPLOYING"
    STABLE = "STABLE"
    UPGRADING = "UPGRADING"
    ROLLING_BACK = "ROLLING_BACK"
    ROLLED_BACK = "ROLLED_BACK"
    SUSPENDED = "SUSPENDED"
    FAILED = "FAILED"

    @property
    def settled(self) -> bool:
        """Running as desired, from the last stable spec or the current one."""
        return self in (Lifecycle.STABLE, Lifecycle.ROLLED_BACK)


D = Lifecycle
# The moves of shared/deployments.py `decide`: a deployment's first state, and from each state
# those its rules may name next (tests/unit/test_deployment_transitions.py tries the rules).
DEPLOYMENT_START: frozenset[Lifecycle] = frozenset({D.DEPLOYING, D.SUSPENDED})
DEPLOYMENT_TRANSITIONS: dict[Lifecycle, frozenset[Lifecycle]] = {
    D.DEPLOYING: frozenset({D.STABLE, D.ROLLED_BACK, D.ROLLING_BACK, D.FAILED, D.SUSPENDED}),
    D.STABLE: frozenset({D.UPGRADING, D.DEPLOYING, D.ROLLING_BACK, D.FAILED, D.SUSPENDED}),
    D.UPGRADING: frozenset({D.STABLE, D.ROLLED_BACK, D.ROLLING_BACK, D.FAILED, D.SUSPENDED}),
    D.ROLLING_BACK: frozenset({D.ROLLED_BACK, D.FAILED, D.SUSPENDED}),
    D.ROLLED_BACK: frozenset({D.STABLE, D.UPGRADING, D.DEPLOYING, D.ROLLING_BACK, D.FAILED, D.SUSPENDED}),
    D.SUSPENDED: frozenset({D.DEPLOYING}),
    D.FAILED: frozenset({D.DEPLOYING, D.UPGRADING, D.STABLE, D.ROLLED_BACK, D.ROLLING_BACK, D.SUSPENDED}),
}


def check_deployment_transition(current: Lifecycle | None, target: Lifecycle) -> None:
    """`current` None: a deployment never reconciled."""
    legal = DEPLOYMENT_START if current is None else DEPLOYMENT_TRANSITIONS[current]
    if target not in legal:
        raise IllegalTransition(f"deployment cannot go from {current.value if current else '(new)'} to {target.value}")
