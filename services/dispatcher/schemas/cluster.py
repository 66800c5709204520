"""Cluster responses (Flink REST v1 shapes): overview, JobManager leader, TaskManagers and their
slots, dashboard configuration, health, the error body; and the operator endpoints' shapes (logs,
JobManager facts, who am I; docs/runbooks/logs.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from services.dispatcher.schemas.fields import _Out


class JobManagerLeader(_Out):
    id: str
    epoch: int
    mode: str = Field(description="none (standalone) or zookeeper")
    since: int = Field(description="epoch ms when it took leadership")


class ClusterOverview(_Out):
    taskmanagers: int
    slots_total: int = Field(alias="slots-total")
    slots_available: int = Field(alias="slots-available")
    jobs_running: int = Field(alias="jobs-running")
    jobs_finished: int = Field(alias="jobs-finished")
    jobs_cancelled: int = Field(alias="jobs-cancelled")
    jobs_failed: int = Field(alias="jobs-failed")
    flink_version: str = Field(alias="flink-version")
    flink_commit: str = Field(alias="flink-commit")
    jobmanager: JobManagerLeader | None = Field(
        None, description="the leading JobManager (Headrace addition); null: none leads, submissions wait"
    )


class TaskManagerInfo(_Out):
    id: str
    path: str
    dataPort: int
    jmxPort: int
    timeSinceLastHeartbeat: int = Field(description="epoch ms of the last heartbeat (Flink's naming)")
    slotsNumber: int
    freeSlots: int
    totalResource: dict[str, Any]
    freeResource: dict[str, Any]
    hardware: dict[str, Any]
    memoryConfiguration: dict[str, Any]
    blocked: bool
    last_lost_at: int | None = Field(
        None,
        alias="last-lost-at",
        description=(
            "epoch ms of its latest loss or unregistration (Headrace addition), kept after it registered again; "
            "null: never"
        ),
    )
    last_lost_reason: str | None = Field(
        None, alias="last-lost-reason", description="why, as the ResourceManager declared it (e.g. its process exited)"
    )
    state: str | None = Field(
        None,
        description="REGISTERED; LOST (listed with ?include=lost) until it registers "
        "again; UNREGISTERED (GET /taskmanagers/{id} only)",
    )
    lost_reason: str | None = Field(None, alias="lost-reason", description="while LOST: why")


class TaskManagersInfo(_Out):
    taskmanagers: list[TaskManagerInfo]


class TaskMemoryInfo(_Out):
    used: int = Field(description="bytes, as the task's memory limit is measured")
    limit: int | None = Field(None, description="bytes; null: no limit")
    measure: str = Field(
        description='PSS (summed over the task\'s processes; "PSS, RSS for N" when N of them '
        'could not be read) or "cgroup charge"'
    )


class SlotInfo(_Out):
    index: int | None = None
    allocation_id: str | None = None
    job_id: str | None = None
    execution_id: str | None = None
    memory: TaskMemoryInfo | None = Field(
        None,
        description=(
            "the task's latest memory figure beside its limit, as its TaskManager measured it (Headrace addition); "
            "null: none reported (no task, or none within the heartbeat timeout)"
        ),
    )


class TaskManagerDetailsInfo(TaskManagerInfo):
    allocatedSlots: list[SlotInfo]
    state: str = Field(description="REGISTERED, LOST or UNREGISTERED")
    lost_reason: str | None = Field(
        None,
        alias="lost-reason",
        description="why it is LOST or UNREGISTERED now; null while REGISTERED (last-lost-reason keeps it)",
    )
    metrics: dict[str, Any]


class DashboardConfiguration(_Out):
    refresh_interval: int = Field(alias="refresh-interval")
    timezone_name: str = Field(alias="timezone-name")
    timezone_offset: int = Field(alias="timezone-offset")
    flink_version: str = Field(alias="flink-version")
    flink_revision: str = Field(alias="flink-revision")
    features: dict[str, bool]
    spark_master: str = Field("local", alias="spark-master", description="where the tasks' executors run")
    spark_master_ui: str | None = Field(None, alias="spark-master-ui", description="the Spark master's web UI")
    kafka_bootstrap_servers: str | None = Field(
        None,
        alias="kafka-bootstrap-servers",
        description="the Kafka brokers pipelines get by default (pipeline_kafka_bootstrap_servers); null: none",
    )


class Health(_Out):
    status: Literal["ok"] = "ok"


class Empty(_Out):
    pass


class ErrorBody(BaseModel):
    """What every error answers (documented for /docs)."""

    errors: list[str]
    field: str | None = None
    expected: str | None = None
    hint: str | None = None
    details: list[dict[str, Any]] | None = None


class LogFileInfo(_Out):
    name: str
    size: int = Field(description="bytes")
    mtime: int = Field(description="epoch ms of the last change")


class LogListInfo(_Out):
    logs: list[LogFileInfo]


class ConfigEntry(_Out):
    key: str
    value: str = Field(description="the effective value as text; secrets are ******")


class JobManagerLeaderRecord(_Out):
    id: str | None = None
    epoch: int | None = None
    mode: str | None = None
    since: int | None = Field(None, description="epoch ms when it took leadership")
    address: str | None = Field(None, description="http://host:port where it serves /metrics and /logs")


class JobManagerLeaderInfo(_Out):
    leader: JobManagerLeaderRecord | None
    epoch: int | None = Field(description="the current fencing epoch (Redis hr:jm:epoch)")
    contenders: list[str] = Field(description="ZooKeeper mode: contender ids in election order; else []")


class WhoAmI(_Out):
    auth: Literal["off", "required"] = Field(description="off: no token needed, anyone may do everything")
    role: Literal["viewer", "operator", "admin"]
    name: str | None = Field(None, description="the token's name (headrace token list)")
