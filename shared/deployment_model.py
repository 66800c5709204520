"""What the deployments' rules (shared/deployments.py `decide`) see and what they return: an
`Observed` snapshot of a deployment (its job, its pending step's operation) read by the
reconciler (services/jobmanager/deployment_reconciler.py), and the `Plan` it carries out. Plain
frozen values: the rules are pure functions from one to the other. The lifecycle states are
shared/states.py `Lifecycle`, with the other machines and its transition table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from shared.deployment_spec import DeploymentSpec
from shared.states import Lifecycle

# --- what the reconciler observes ----------------------------------------------------------


@dataclass(frozen=True)
class JobView:
    """The deployment's current job as the catalog shows it."""

    id: str
    status: str  # JobStatus value
    terminal: bool
    running: bool  # its current attempt is RUNNING
    failures_since_deploy: int = 0  # failed attempts, other than INFRASTRUCTURE_FAILURES (deployment_rollback.py)
    checkpoint_since_deploy: bool = False  # a checkpoint completed after the generation started
    newest_checkpoint_age_s: float | None = None
    latest_snapshot: str | None = None  # newest completed checkpoint or savepoint path
    failure: str | None = None
    parallelism: int | None = None  # its task's


@dataclass(frozen=True)
class OperationView:
    id: str
    status: str  # IN_PROGRESS | COMPLETED | FAILED
    location: str | None = None
    failure: str | None = None
    done_s_ago: float | None = None  # since it completed or failed


@dataclass(frozen=True)
class Observed:
    generation: int
    spec: DeploymentSpec
    lifecycle: Lifecycle | None  # None: never reconciled
    job: JobView | None
    job_generation: int | None
    stable_generation: int | None
    stable_spec: DeploymentSpec | None
    rollback_point: str | None  # the savepoint the current generation started from
    last_savepoint: str | None
    blocked_generation: int | None  # refused, failed or rolled back: not applied again by itself
    pending: Mapping[str, Any] | None
    operation: OperationView | None  # the pending step's operation, if it has one
    deployed_s_ago: float | None  # since the current generation's job started
    deleting: bool = False
    delete_with_savepoint: bool = True
    rollback_requested: bool = False
    savepoint_due: bool = False  # the periodic savepoint's interval has passed
    now_s: float = 0.0  # wall-clock seconds, for the back-off after a failed stop
    parallelism: int | None = None  # to run: the autoscaler's choice or the spec's (None: the spec's)
    scaled_from: int | None = None  # before the autoscaler's last rescale, until that one is STABLE
    blocked_spec: DeploymentSpec | None = None  # the blocked generation's spec

    @property
    def asks_blocked_version(self) -> bool:
        """The current spec is the blocked generation's apart from its desired state: suspending
        and resuming change only that, and ask for no new version of the pipeline."""
        return self.blocked_spec is not None and self.spec.same_version(self.blocked_spec)

    @property
    def target_parallelism(self) -> int:
        return self.parallelism or self.spec.parallelism


# --- what it does --------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Create a job for `generation` (its spec: the current one or the stable one)."""

    generation: int
    restore_from: str | None
    from_stable: bool = False
    parallelism: int | None = None  # None: the deployment's (the autoscaler's choice or the spec's)


@dataclass(frozen=True)
class Plan:
    """What one pass does, in this order: cancel, stop (savepoint) or rescale, start, record.

    `pending`: the step to wait for (None clears it; absent keeps it); `to`: the new lifecycle
    state, recorded in the history with `reason`."""

    to: Lifecycle | None = None
    reason: str = ""
    cancel_job: bool = False
    stop: str | None = None  # purpose of a stop-with-savepoint: upgrade | suspend | delete
    rescale_to: int | None = None
    savepoint: bool = False  # a periodic savepoint, the job keeps running
    start: Start | None = None
    pending: Mapping[str, Any] | None = None
    keep_pending: bool = False
    error: str | None = None
    clear_error: bool = False
    stable: bool = False  # the job's generation becomes the stable one
    block: int | None = None
    unblock: bool = False
    rollback_point: str | None = None
    last_savepoint: str | None = None
    delete: bool = False
    consume_rollback_request: bool = False
    adopt_generation: int | None = None  # the running job now carries this generation (a rescale)
    periodic_done: bool = False  # a periodic savepoint ended (completed or failed): the interval starts again
    scale_settled: bool = False  # the autoscaler's last rescale is STABLE: nothing to go back to
    unscale_to: int | None = None  # the autoscaler's rescale failed: back to this parallelism, and it holds off

    @property
    def nothing(self) -> bool:
        return self == NOTHING


NOTHING = Plan(keep_pending=True)
