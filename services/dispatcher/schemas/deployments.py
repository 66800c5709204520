"""Request and response shapes of /deployments. The request is the deployment's spec (the YAML a
`headrace deploy apply` reads, as JSON); `DeploymentSpecRequest.record` is its normalised form,
the one the catalog keeps and the JobManager's reconciler reads (shared/deployments.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from services.dispatcher.schemas.fields import IntRange, Kind, Parallelism, Seconds, _Strict
from services.dispatcher.schemas.restart import RestartStrategy
from services.dispatcher.strict_fields import EntryName, StrictBool
from shared import deployments as dep

UpgradeMode = Literal["savepoint", "last-state", "stateless"]
DesiredState = Literal["running", "suspended"]
MAX_HISTORY = 1000
MIN_READY_WITHIN_S = 1.0
MIN_SAVEPOINT_INTERVAL_S = 1.0


def _at_least(minimum: float):
    def check(seconds: float) -> float:
        if seconds < minimum:
            raise PydanticCustomError("duration", "must be {expected}, got {got} s",
                                      {"expected": f"a duration of at least {minimum:g} s", "got": seconds})
        return seconds
    return AfterValidator(check)


class RollbackSpec(_Strict):
    enabled: StrictBool | None = Field(True, description="roll a new generation back to the last stable one when "
                                                         "it is not ready within readyWithin (default true)")
    readyWithin: Annotated[Seconds, _at_least(MIN_READY_WITHIN_S)] | None = Field(
        dep.DEFAULT_READY_WITHIN_S, description="a new generation is ready when its task is RUNNING and completed a "
                                                "checkpoint within this time (default 60 s)")


class SavepointsSpec(_Strict):
    interval: Annotated[Seconds, _at_least(MIN_SAVEPOINT_INTERVAL_S)] | None = Field(
        None, description="take a savepoint this often while the deployment is STABLE (default: never)")
    historyMax: Annotated[int, IntRange(1, MAX_HISTORY)] | None = Field(
        dep.DEFAULT_HISTORY_MAX, description="savepoints kept; older ones are disposed, except the one a "
                                             "rollback needs (default 5)")


class DeploymentSpecRequest(_Strict):
    name: str | None = Field(None, max_length=63, description="optional; must equal the name in the path")
    jarId: str = Field(description="the uploaded pipeline to run (POST /jars/upload)", max_length=160)
    entryClass: EntryName | None = Field(None, description="entry function of the module (default 'build')")
    kind: Kind | None = Field(None, description="'pyspark' (default) or 'noop' (runs nothing, for tests)")
    programArgsList: list[Annotated[str, Field(max_length=10000)]] | None = Field(
        None, max_length=1000, description="program arguments")
    parallelism: Parallelism | None = Field(None, description="Spark parallelism (default 1); a change of "
                                                              "parallelism alone is carried out as a rescale")
    flinkConfiguration: dict[str, Any] | None = Field(None, description="job configuration, Flink's option names")
    restartStrategy: RestartStrategy | None = Field(None, description="default: the cluster's restart strategy")
    upgradeMode: UpgradeMode | None = Field(
        "savepoint", description="how a changed spec is carried out: savepoint (stop with a savepoint, start from "
                                 "it), last-state (cancel, start from the latest checkpoint) or stateless (cancel, "
                                 "start fresh)")
    state: DesiredState | None = Field("running", description="running, or suspended (stopped with a savepoint)")
    rollback: RollbackSpec | None = None
    savepoints: SavepointsSpec | None = None

    def record(self, *, restart_strategy: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """The normalised spec: every default filled in, durations in seconds, the restart
        strategy resolved (so a later change of the cluster's default does not change it)."""
        rollback = self.rollback or RollbackSpec()
        savepoints = self.savepoints or SavepointsSpec()
        return {
            "jarId": self.jarId, "entryClass": self.entryClass or "build", "kind": self.kind or "pyspark",
            "programArgsList": list(self.programArgsList or []), "parallelism": self.parallelism or 1,
            "flinkConfiguration": config, "restartStrategy": restart_strategy,
            "upgradeMode": self.upgradeMode or "savepoint", "state": self.state or "running",
            "rollback": {"enabled": rollback.enabled is not False,
                         "readyWithin": rollback.readyWithin or dep.DEFAULT_READY_WITHIN_S},
            "savepoints": {"interval": savepoints.interval,
                           "historyMax": savepoints.historyMax or dep.DEFAULT_HISTORY_MAX},
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
    parallelism: int
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
    lifecycleState: str | None = Field(description="DEPLOYING | STABLE | UPGRADING | ROLLING_BACK | ROLLED_BACK | "
                                                   "SUSPENDED | FAILED (null until the JobManager first sees it)")
    jobId: str | None
    jobState: str | None
    jobGeneration: int | None
    stableGeneration: int | None
    lastSavepoint: str | None
    error: str | None
    pending: dict | None = Field(description="the step in progress, as the JobManager keeps it")
    waitingReason: str | None = Field(description="what the deployment waits for, in words (null: nothing)")
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
