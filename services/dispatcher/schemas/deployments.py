"""Request and response shapes of /deployments. The request is the deployment's spec (the YAML a
`headrace deploy apply` reads, as JSON); `DeploymentSpecRequest.record` is its normalised form,
the one the catalog keeps and the JobManager's reconciler reads (shared/deployments.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from services.dispatcher.guards.strict_fields import EntryName, StrictBool
from services.dispatcher.schemas.fields import IntRange, Kind, Parallelism, Seconds, _Strict
from services.dispatcher.schemas.jars import MAX_PROGRAM_ARG_CHARS, MAX_PROGRAM_ARGS, check_program_args_bounds
from services.dispatcher.schemas.restart import RestartStrategy
from shared import autoscaling, streams
from shared import deployments as dep

UpgradeMode = Literal["savepoint", "last-state", "stateless"]
DesiredState = Literal["running", "suspended"]
# Periodic savepoints (issue 43.14): each is a full copy of the job's state, kept on disk and in
# the catalog until `historyMax` newer ones replace it: {interval: 1 s, historyMax: 1000} would
# keep a thousand copies with a savepoint always in flight. Not more often than the cluster's default
# checkpoint interval (a savepoint is a checkpoint one keeps), at most 100 kept.
MAX_HISTORY = 100
MIN_READY_WITHIN_S = 1.0
MIN_SAVEPOINT_INTERVAL_S = 10.0


def _at_least(minimum: float):
    def check(seconds: float) -> float:
        if seconds < minimum:
            raise PydanticCustomError(
                "duration",
                "must be {expected}, got {got} s",
                {"expected": f"a duration of at least {minimum:g} s", "got": seconds},
            )
        return seconds

    return AfterValidator(check)


def _at_most(maximum: float):
    def check(seconds: float) -> float:
        if seconds > maximum:
            raise PydanticCustomError(
                "duration",
                "must be {expected}, got {got} s",
                {"expected": f"a duration of at most {maximum:g} s", "got": seconds},
            )
        return seconds

    return AfterValidator(check)


class RollbackSpec(_Strict):
    enabled: StrictBool | None = Field(
        True,
        description="roll a new generation back to the last stable one when "
        "it is not ready within readyWithin (default true)",
    )
    readyWithin: Annotated[Seconds, _at_least(MIN_READY_WITHIN_S)] | None = Field(
        dep.DEFAULT_READY_WITHIN_S,
        description="a new generation is ready when its task is RUNNING and completed a "
        "checkpoint within this time (default 60 s)",
    )


class SavepointsSpec(_Strict):
    interval: Annotated[Seconds, _at_least(MIN_SAVEPOINT_INTERVAL_S)] | None = Field(
        None, description="take a savepoint this often while the deployment is STABLE (default: never)"
    )
    historyMax: Annotated[int, IntRange(1, MAX_HISTORY)] | None = Field(
        dep.DEFAULT_HISTORY_MAX,
        description="savepoints kept; older ones are disposed, except the one a rollback needs (default 5)",
    )


class AutoscalerSpecRequest(_Strict):
    enabled: StrictBool | None = Field(False, description="let the autoscaler choose the parallelism (default false)")
    minParallelism: Parallelism | None = Field(1, description="the lowest parallelism it chooses (default 1)")
    maxParallelism: Parallelism | None = Field(
        None, description="the highest (default: the spec's parallelism); also bounded by the job's state partitions"
    )
    targetUtilization: float | None = Field(
        autoscaling.DEFAULT_TARGET_UTILIZATION,
        gt=0,
        le=1,
        description="share of the task's capacity the input and the backlog's drain may use (default 0.7)",
    )
    metricsWindow: Annotated[Seconds, _at_least(5.0), _at_most(streams.PROGRESS_HISTORY_S)] | None = Field(
        autoscaling.DEFAULT_METRICS_WINDOW_S,
        description="the figures a decision reads (default 30 s; at most the 10 min of figures the TaskManagers keep)",
    )
    stabilization: Annotated[Seconds, _at_least(0.0)] | None = Field(
        autoscaling.DEFAULT_STABILIZATION_S,
        description="no decision this long after a start, a rescale or a rollback (default 60 s)",
    )
    catchUp: Annotated[Seconds, _at_least(1.0)] | None = Field(
        autoscaling.DEFAULT_CATCH_UP_S, description="the time in which a backlog is to be drained (default 2 min)"
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> "AutoscalerSpecRequest":
        if self.maxParallelism is not None and (self.minParallelism or 1) > self.maxParallelism:
            raise PydanticCustomError(
                "bounds",
                "minParallelism {low} is above maxParallelism {high}: make minParallelism <= maxParallelism",
                {"low": self.minParallelism, "high": self.maxParallelism},
            )
        return self

    def record(self, parallelism: int) -> dict[str, Any]:
        return {
            "enabled": self.enabled is True,
            "minParallelism": self.minParallelism or 1,
            "maxParallelism": self.maxParallelism or max(parallelism, self.minParallelism or 1),
            "targetUtilization": self.targetUtilization or autoscaling.DEFAULT_TARGET_UTILIZATION,
            "metricsWindow": self.metricsWindow or autoscaling.DEFAULT_METRICS_WINDOW_S,
            "stabilization": autoscaling.DEFAULT_STABILIZATION_S if self.stabilization is None else self.stabilization,
            "catchUp": self.catchUp or autoscaling.DEFAULT_CATCH_UP_S,
        }


class DeploymentSpecRequest(_Strict):
    name: str | None = Field(None, max_length=63, description="optional; must equal the name in the path")
    jarId: str = Field(description="the uploaded pipeline to run (POST /jars/upload)", max_length=160)
    entryClass: EntryName | None = Field(None, description="entry function of the module (default 'build')")
    kind: Kind | None = Field(None, description="'pyspark' (default) or 'noop' (runs nothing, for tests)")
    programArgsList: list[str] | None = Field(
        None,
        description=f"program arguments (at most {MAX_PROGRAM_ARGS} of at most {MAX_PROGRAM_ARG_CHARS} characters)",
    )
    parallelism: Parallelism | None = Field(
        None, description="Spark parallelism (default 1); a change of parallelism alone is carried out as a rescale"
    )
    flinkConfiguration: dict[str, Any] | None = Field(None, description="job configuration, Flink's option names")
    restartStrategy: RestartStrategy | None = Field(None, description="default: the cluster's restart strategy")
    upgradeMode: UpgradeMode | None = Field(
        "savepoint",
        description="how a changed spec is carried out: savepoint (stop with a savepoint, start from "
        "it), last-state (cancel, start from the latest checkpoint) or stateless (cancel, "
        "start fresh)",
    )
    state: DesiredState | None = Field("running", description="running, or suspended (stopped with a savepoint)")
    rollback: RollbackSpec | None = None
    savepoints: SavepointsSpec | None = None
    autoscaler: AutoscalerSpecRequest | None = Field(
        None, description="let the parallelism follow the load (the spec's parallelism is where it starts)"
    )

    @model_validator(mode="after")
    def _args_within_bounds(self) -> "DeploymentSpecRequest":
        if self.programArgsList is not None:
            check_program_args_bounds(self.programArgsList)
        return self

    def record(self, *, restart_strategy: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """The normalised spec: every default filled in, durations in seconds, the restart
        strategy resolved (so a later change of the cluster's default does not change it)."""
        rollback = self.rollback or RollbackSpec()
        savepoints = self.savepoints or SavepointsSpec()
        return {
            "jarId": self.jarId,
            "entryClass": self.entryClass or "build",
            "kind": self.kind or "pyspark",
            "programArgsList": list(self.programArgsList or []),
            "parallelism": self.parallelism or 1,
            "flinkConfiguration": config,
            "restartStrategy": restart_strategy,
            "upgradeMode": self.upgradeMode or "savepoint",
            "state": self.state or "running",
            "rollback": {
                "enabled": rollback.enabled is not False,
                "readyWithin": rollback.readyWithin or dep.DEFAULT_READY_WITHIN_S,
            },
            "savepoints": {
                "interval": savepoints.interval,
                "historyMax": savepoints.historyMax or dep.DEFAULT_HISTORY_MAX,
            },
            **({"autoscaler": self.autoscaler.record(self.parallelism or 1)} if self.autoscaler else {}),
        }


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")


class DeploymentApplied(_Out):
    name: str
    generation: int
    changed: bool = Field(description="false when the spec was the same as the current generation's")


class DeploymentSummary(_Out):
    name: str
    generation: int
    lifecycleState: str | None
    jobId: str | None
    jobState: str | None
    stableGeneration: int | None
    parallelism: int = Field(description="the parallelism it runs at: the autoscaler's choice or the spec's")
    error: str | None
    updatedAt: int


class DeploymentList(_Out):
    deployments: list[DeploymentSummary]


class DeploymentEventInfo(_Out):
    at: int = Field(description="ms since the epoch")
    generation: int | None
    # "from" is a Python keyword: the field is named with an alias.
    from_: str | None = Field(alias="from")
    to: str | None
    reason: str
    jobId: str | None
    savepoint: str | None


class DeploymentStatus(_Out):
    lifecycleState: str | None = Field(
        description="DEPLOYING | STABLE | UPGRADING | ROLLING_BACK | ROLLED_BACK | "
        "SUSPENDED | FAILED (null until the JobManager first sees it)"
    )
    jobId: str | None
    jobState: str | None
    jobGeneration: int | None
    stableGeneration: int | None
    lastSavepoint: str | None
    error: str | None
    pending: dict | None = Field(description="the step in progress, as the JobManager keeps it")
    waitingReason: str | None = Field(description="what the deployment waits for, in words (null: nothing)")
    parallelism: int = Field(
        description="the effective parallelism: the autoscaler's choice within its bounds "
        "while it is enabled, else the spec's"
    )
    autoscaler: dict | None = Field(None, description="null unless enabled: {heldOff, scaledFrom, lastEvaluation}")
    history: list[DeploymentEventInfo]


class DeploymentDetail(_Out):
    name: str
    spec: dict
    generation: int
    status: DeploymentStatus
    generations: list[dict]
    savepoints: list[dict]


class DeploymentAccepted(_Out):
    name: str
    generation: int | None = None
    deleting: bool | None = None


class AutoscalerEvaluationInfo(_Out):
    at: int = Field(description="ms since the epoch")
    jobId: str | None
    parallelism: int
    proposed: int
    outcome: str = Field(description="scale-up | scale-down | keep | wait | held")
    reason: str
    figures: dict = Field(
        description="busy, readRate, arrivalRate, lag, lagGrowth, capacity (rows/s at the "
        "parallelism; null: no per-row cost seen), capacityLow, shownRate, "
        "fixedCostS, spanS, saturated"
    )


class AutoscalerDetail(_Out):
    name: str
    enabled: bool
    parallelism: int
    spec: dict | None
    heldOff: str | None
    evaluations: list[AutoscalerEvaluationInfo]
