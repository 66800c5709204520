"""A deployment's spec as the catalog keeps it (normalised by the dispatcher,
services/dispatcher/schemas/deployments.py) and read back by the JobManager, and the words for
what a deployment waits for. The rules that act on them are shared/deployments.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from shared import durations
from shared.autoscaling import AutoscalerSpec

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
NAME_EXPECTED = "1-63 lower-case letters, digits and '-', starting and ending with a letter or digit"
UPGRADE_MODES = ("savepoint", "last-state", "stateless")
STATES = ("running", "suspended")
DEFAULT_READY_WITHIN_S = 60.0
DEFAULT_HISTORY_MAX = 5


def valid_name(name: str) -> bool:
    return re.fullmatch(NAME_PATTERN, name) is not None


@dataclass(frozen=True)
class DeploymentSpec:
    """A spec as stored (normalised by the dispatcher): durations in seconds."""

    jar_id: str
    entry: str = "build"
    kind: str = "pyspark"
    program_args: tuple[str, ...] = ()
    parallelism: int = 1
    config: Mapping[str, Any] = field(default_factory=dict)
    restart_strategy: Mapping[str, Any] | None = None
    upgrade_mode: str = "savepoint"
    state: str = "running"
    rollback_enabled: bool = True
    ready_within_s: float = DEFAULT_READY_WITHIN_S
    savepoint_interval_s: float | None = None
    history_max: int = DEFAULT_HISTORY_MAX
    autoscaler: AutoscalerSpec = AutoscalerSpec()

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "DeploymentSpec":
        rollback = rec.get("rollback") or {}
        savepoints = rec.get("savepoints") or {}
        interval = savepoints.get("interval")
        return cls(
            jar_id=str(rec["jarId"]),
            entry=rec.get("entryClass") or "build",
            kind=rec.get("kind") or "pyspark",
            program_args=tuple(str(a) for a in rec.get("programArgsList") or ()),
            parallelism=int(rec.get("parallelism") or 1),
            config=dict(rec.get("flinkConfiguration") or {}),
            restart_strategy=rec.get("restartStrategy") or None,
            upgrade_mode=rec.get("upgradeMode") or "savepoint",
            state=rec.get("state") or "running",
            rollback_enabled=rollback.get("enabled", True) is not False,
            ready_within_s=durations.parse_duration(rollback.get("readyWithin") or DEFAULT_READY_WITHIN_S),
            savepoint_interval_s=durations.parse_duration(interval) if interval else None,
            history_max=int(savepoints.get("historyMax", DEFAULT_HISTORY_MAX)),
            autoscaler=AutoscalerSpec.from_record(rec.get("autoscaler"), parallelism=int(rec.get("parallelism") or 1)),
        )

    def effective_parallelism(self, chosen: int | None) -> int:
        """The parallelism to run: the autoscaler's choice (`chosen`, kept in the deployment's
        row) within its bounds while it is enabled, else the spec's."""
        a = self.autoscaler
        if not a.enabled or chosen is None:
            return (
                self.parallelism if not a.enabled else min(max(self.parallelism, a.min_parallelism), a.max_parallelism)
            )
        return min(max(chosen, a.min_parallelism), a.max_parallelism)

    def same_version(self, other: "DeploymentSpec") -> bool:
        """Equal but for the desired state (running or suspended): the same version to run."""
        return replace(self, state=other.state) == other

    def same_pipeline_except_parallelism(self, other: "DeploymentSpec") -> bool:
        """Only the parallelism differs (and what the lifecycle alone reads): a rescale will do."""
        return (self.jar_id, self.entry, self.kind, self.program_args, dict(self.config), self.restart_strategy) == (
            other.jar_id,
            other.entry,
            other.kind,
            other.program_args,
            dict(other.config),
            other.restart_strategy,
        )


def waiting_reason(
    lifecycle: str | None,
    pending: Mapping[str, Any] | None,
    job_id: str | None,
    job_state: str | None,
    ready_within_s: float,
) -> str | None:
    """What a deployment waits for, in words (GET /deployments/{name} `status.waitingReason`);
    None when it waits for nothing."""
    job = f"job {job_id}" if job_id else "its job"
    kind = (pending or {}).get("kind")
    if kind == "stop":
        return f"waiting for {job} ({job_state}) to stop with a savepoint (operation {(pending or {}).get('op')})"
    if kind == "ends":
        return f"waiting for {job} ({job_state}) to end"
    if kind == "savepoint":
        return f"taking a periodic savepoint of {job} (operation {(pending or {}).get('op')})"
    if kind == "wait":
        return "waiting before the failed stop is tried again"
    if lifecycle in ("DEPLOYING", "UPGRADING", "ROLLING_BACK"):
        return (
            f"waiting for {job} ({job_state}) to run and complete a checkpoint, at most "
            f"{ready_within_s:g} s (rollback.readyWithin)"
        )
    return None
