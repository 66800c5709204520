"""API contracts: request bodies (validated, with messages that name the field and say how to fix
it) and response shapes (Flink REST v1 field names, hyphens and all). Separate from the catalog
tables in `shared.catalog.models`; `views` turns rows into these shapes.

One module per resource (jars, jobs, cluster), with restart strategies and the fields they
are built of in their own; checkpoint and savepoint bodies in snapshots, schedules in schedules.
This package re-exports the first five.
"""

from services.dispatcher.schemas.cluster import (
    ClusterOverview, ConfigEntry, DashboardConfiguration, Empty, ErrorBody, Health, JobManagerLeader,
    JobManagerLeaderInfo, JobManagerLeaderRecord, LogFileInfo, LogListInfo, SlotInfo, TaskManagerDetailsInfo,
    TaskManagerInfo, TaskManagersInfo, WhoAmI,
)
from services.dispatcher.schemas.fields import (
    KINDS, MAX_INT, MAX_PARALLELISM, RESTART_TYPES, JobIdStr, JobName, Kind, Parallelism, PositiveInt, Seconds,
    int_at_least, number_between, parse_duration,
)
from services.dispatcher.schemas.jars import (
    JarEntryInfo, JarFileInfo, JarListInfo, JarRunRequest, JarRunResponse, JarUploadResponse, check_program_args,
)
from services.dispatcher.schemas.jobs import (
    AttemptInfo, ExceptionInfo, JobConfigInfo, JobDetails, JobDetailsInfo, JobDetailsVertexInfo,
    JobExceptionHistory, JobExceptionsInfoWithHistory, JobIdWithStatus, JobIdsWithStatusOverview, JobProgressInfo,
    JobVertexDetailsInfo, MetricValue, MultipleJobsDetails, SubtaskInfo, TaskProgressInfo,
)
from services.dispatcher.schemas.restart import (
    ExponentialDelay, FailureRate, FixedDelay, NoRestart, RestartStrategy, normalise_restart_strategy,
    stored_restart_strategy,
)
from services.dispatcher.strict_fields import EntryName, StrictBool

__all__ = [
    "AttemptInfo", "ClusterOverview", "ConfigEntry", "DashboardConfiguration", "Empty", "EntryName", "ErrorBody",
    "ExceptionInfo", "ExponentialDelay", "FailureRate", "FixedDelay", "Health", "JarEntryInfo", "JarFileInfo",
    "JarListInfo", "JarRunRequest", "JarRunResponse", "JarUploadResponse", "JobConfigInfo", "JobDetails",
    "JobDetailsInfo", "JobDetailsVertexInfo", "JobExceptionHistory", "JobExceptionsInfoWithHistory", "JobIdStr",
    "JobIdWithStatus", "JobIdsWithStatusOverview", "JobManagerLeader", "JobManagerLeaderInfo",
    "JobManagerLeaderRecord", "JobName", "JobProgressInfo", "JobVertexDetailsInfo", "KINDS", "MAX_INT", "Kind", "LogFileInfo",
    "LogListInfo", "MAX_PARALLELISM", "MetricValue", "MultipleJobsDetails", "NoRestart", "Parallelism",
    "PositiveInt", "RESTART_TYPES", "RestartStrategy", "Seconds", "SlotInfo", "StrictBool", "SubtaskInfo",
    "TaskManagerDetailsInfo", "TaskManagerInfo", "TaskManagersInfo", "TaskProgressInfo", "WhoAmI",
    "check_program_args", "int_at_least", "normalise_restart_strategy", "number_between", "parse_duration",
    "stored_restart_strategy",
]
