"""Job responses (Flink REST v1 shapes): overview, details, vertices, subtasks and attempts,
exceptions; and the live task figures of /jobs/{id}/progress and metrics."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.dispatcher.schemas.fields import _Out


class JobIdWithStatus(_Out):
    id: str
    status: str


class JobIdsWithStatusOverview(_Out):
    jobs: list[JobIdWithStatus]


class JobDetails(_Out):
    jid: str
    name: str
    state: str
    start_time: int = Field(alias="start-time")
    end_time: int = Field(alias="end-time")
    duration: int
    last_modification: int = Field(alias="last-modification")
    tasks: dict[str, int]
    restarts: int = Field(0, description="how many times its tasks were started again (a failure or a rescale)")
    deployment: str | None = Field(None, description="the deployment that started it, if any")


class MultipleJobsDetails(_Out):
    jobs: list[JobDetails]


class JobDetailsVertexInfo(_Out):
    id: str
    name: str
    maxParallelism: int
    parallelism: int
    status: str
    start_time: int = Field(alias="start-time")
    end_time: int = Field(alias="end-time")
    duration: int
    tasks: dict[str, int]
    metrics: dict[str, Any]


class LastFailure(_Out):
    summary: str | None = Field(
        description="the exception's type and message, one line (the whole trace: GET /jobs/{id}/exceptions)"
    )
    timestamp: int
    attempt: int | None


class JobDetailsInfo(_Out):
    jid: str
    name: str
    isStoppable: bool
    state: str
    job_type: str = Field(alias="job-type")
    start_time: int = Field(alias="start-time")
    end_time: int = Field(alias="end-time")
    duration: int
    maxParallelism: int
    now: int
    timestamps: dict[str, int]
    vertices: list[JobDetailsVertexInfo]
    status_counts: dict[str, int] = Field(alias="status-counts")
    plan: dict[str, Any]
    waiting_reason: str | None = Field(alias="waiting-reason")
    restart_strategy: dict[str, Any] = Field(alias="restart-strategy")
    attempts: int
    restarts: int = Field(0, description="how many times its tasks were started again (a failure or a rescale)")
    schedule_id: str | None = Field(None, alias="schedule-id", description="the schedule that started this job")
    deployment: str | None = Field(None, description="the deployment that started this job")
    last_failure: LastFailure | None = Field(
        None, alias="last-failure", description="the newest entry of its exception history, summarised; null: none"
    )
    lineage: str | None = Field(
        None,
        description="the first job of the chain this job continues (restarts, upgrades, restores); its own id if none",
    )
    pipeline_database: str | None = Field(
        None,
        alias="pipeline-database",
        description="the SQLite file of its lineage's own pipelines database (ctx.catalog_url) when the cluster keeps "
        "one per lineage; null: the job or the cluster names its database (catalog_url, pipeline_catalog_url)",
    )


class JobConfigInfo(_Out):
    jid: str
    name: str
    execution_config: dict[str, Any] = Field(alias="execution-config")


class SubtaskInfo(_Out):
    subtask: int
    status: str
    attempt: int
    endpoint: str
    taskmanager_id: str | None = Field(alias="taskmanager-id")
    start_time: int = Field(alias="start-time")
    end_time: int = Field(alias="end-time")
    duration: int
    status_duration: dict[str, int] = Field(alias="status-duration")
    status_timestamps: dict[str, int] = Field(alias="status-timestamps")
    metrics: dict[str, Any]


class AttemptInfo(_Out):
    attempt: int
    status: str
    taskmanager_id: str | None = Field(alias="taskmanager-id")
    slots: list[int]
    start_time: int = Field(alias="start-time")
    end_time: int = Field(alias="end-time")
    duration: int
    timestamps: dict[str, int]
    failure_cause: str | None = Field(alias="failure-cause")
    failure_summary: str | None = Field(
        None, alias="failure-summary", description="the failure cause's exception type and message, one line"
    )
    waiting_reason: str | None = Field(alias="waiting-reason")


class JobVertexDetailsInfo(_Out):
    id: str
    name: str
    parallelism: int
    maxParallelism: int
    now: int
    subtasks: list[SubtaskInfo]
    attempts: list[AttemptInfo]


class ExceptionInfo(_Out):
    exceptionName: str
    stacktrace: str
    summary: str | None = Field(None, description="the exception's type and message, one line (Headrace's)")
    timestamp: int
    taskName: str | None
    endpoint: str | None
    taskManagerId: str | None
    failureLabels: dict[str, str]
    concurrentExceptions: list[dict[str, Any]]
    attempt: int | None


class JobExceptionHistory(_Out):
    entries: list[ExceptionInfo]
    truncated: bool


class JobExceptionsInfoWithHistory(_Out):
    root_exception: str | None = Field(alias="root-exception")
    timestamp: int | None
    all_exceptions: list[dict[str, Any]] = Field(alias="all-exceptions")
    truncated: bool
    exceptionHistory: JobExceptionHistory


class TaskProgressInfo(_Out):
    vertexId: str
    subtask: int
    executionId: str
    attempt: int
    taskmanagerId: str | None = None
    batchId: int | None = None
    inputRowsPerSecond: float | None = None
    processedRowsPerSecond: float | None = None
    batchDurationMs: int | None = None
    sourceLag: float | None = None
    partitionLag: dict[str, int] | None = Field(
        None, description='each Kafka partition\'s consumer lag, "topic/partition" -> records'
    )
    numInputRows: int | None = None
    sinkVersion: int | None = Field(None, description="the table version the sink committed last (a Delta sink)")
    timestamp: int | None = Field(None, description="epoch ms when the TaskManager recorded the batch")
    sparkUi: str | None = Field(None, description="the driver's Spark UI, when the TaskManager runs it")


class JobProgressInfo(_Out):
    tasks: list[TaskProgressInfo]


class ProgressPoint(_Out):
    timestamp: int = Field(description="epoch ms when the TaskManager recorded the batch")
    batchId: int | None = None
    inputRowsPerSecond: float | None = None
    processedRowsPerSecond: float | None = None
    batchDurationMs: int | None = None
    sourceLag: float | None = None
    numInputRows: int | None = None


class TaskProgressHistory(_Out):
    vertexId: str
    subtask: int
    executionId: str
    attempt: int
    points: list[ProgressPoint] = Field(description="oldest first; at most one a second")


class JobProgressHistory(_Out):
    seconds: int = Field(description="how far back the points go")
    tasks: list[TaskProgressHistory] = Field(description="the job's recent attempts that have points, oldest first")


class MetricValue(_Out):
    id: str
    value: str | None = None
