"""API contracts: request bodies (validated, with messages that name the field and say how to fix
it) and response shapes (Flink REST v1 field names, hyphens and all). Separate from the catalog
tables in `shared.catalog.models`; `views` turns rows into these shapes."""

from __future__ import annotations

import difflib
import math
import re
import shlex
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, WithJsonSchema, model_validator,
)
from pydantic_core import PydanticCustomError

from services.dispatcher.strict_fields import EntryName, StrictBool  # noqa: F401 - EntryName re-exported
from shared import durations, restart
from shared.job_options import MAX_INT

RESTART_TYPES = restart.STRATEGY_TYPES  # ("none", "fixed-delay", "failure-rate", "exponential-delay")
KINDS = ("pyspark", "noop")
MAX_PARALLELISM = MAX_INT


# --- field validators: each raises a PydanticCustomError whose context says what is expected ---


def _repr(value: Any) -> str:
    """The offending value as echoed in a message: a hostile request may send megabytes."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fail(kind: str, message: str, expected: str, **ctx: Any) -> PydanticCustomError:
    return PydanticCustomError(kind, message, {"expected": expected, **ctx})


def _bounds(schema: dict[str, Any], minimum: float | None, maximum: float | None) -> dict[str, Any]:
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def _as_int(value: Any, minimum: int, maximum: int | None = MAX_INT) -> int:
    ok = not isinstance(value, bool) and (
        isinstance(value, int)
        or (isinstance(value, float) and value.is_integer())
        # Digits bounded: int() of a longer string raises (CPython refuses > 4300 digits).
        or (isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,30}\s*", value) is not None)
    )
    if ok and maximum is not None and int(value) > maximum:
        # The upper bound is named only when it is what was crossed: it is rarely the mistake.
        raise _fail("integer", "must be an {expected}, got {got}", f"integer between {minimum} and {maximum}",
                    got=_repr(value))
    if not ok or int(value) < minimum:
        raise _fail("integer", "must be an {expected}, got {got}", f"integer >= {minimum}", got=_repr(value))
    return int(value)


def int_at_least(minimum: int, maximum: int | None = MAX_INT) -> Any:
    return Annotated[int, BeforeValidator(lambda v: _as_int(v, minimum, maximum)),
                     WithJsonSchema(_bounds({"type": "integer"}, minimum, maximum))]


def _as_number(value: Any, minimum: float, maximum: float | None, expected: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < minimum or (maximum is not None and value > maximum):
        raise _fail("number", "must be a {expected}, got {got}", expected, got=_repr(value))
    return float(value)


def number_between(minimum: float, maximum: float | None = None) -> Any:
    expected = f"number >= {minimum}" if maximum is None else f"number between {minimum} and {maximum}"
    return Annotated[float, BeforeValidator(lambda v: _as_number(v, minimum, maximum, expected)),
                     WithJsonSchema(_bounds({"type": "number"}, minimum, maximum))]


_DURATION_EXPECTED = f"{durations.EXPECTED}, at most 100 years"


def parse_duration(value: Any) -> float:
    """Seconds from a number of seconds or a Flink-style duration string ("10 s", "500 ms"):
    shared/durations.py, with the error pydantic reports."""
    try:
        return durations.parse_duration(value)
    except durations.InvalidDuration:
        raise _fail("duration", "must be {expected}, got {got}", _DURATION_EXPECTED, got=_repr(value)) from None


Seconds = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema({
    "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "examples": ["10 s", "500 ms", "2 min"]}],
    "description": "seconds, or a duration string with a unit"})]
PositiveInt = int_at_least(1)
Parallelism = int_at_least(1, MAX_PARALLELISM)


def _job_id(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{32}", value):
        return value.lower()
    raise _fail("job_id", "must be {expected}, got {got}", "32 hexadecimal characters (a Flink JobID)",
                got=_repr(value), hint="leave jobId out to have one generated")


def _kind(value: Any) -> str:
    if value in KINDS:
        return value
    raise _fail("kind", "must be {expected}, got {got}", "'pyspark' or 'noop'", got=_repr(value))


def _job_name(value: Any) -> str:
    # Control characters: PostgreSQL refuses NUL in text (a 500), and none belongs in a name.
    if isinstance(value, str) and value.strip() and len(value) <= 255 and not any(ord(c) < 32 for c in value):
        return value.strip()
    raise _fail("job_name", "must be {expected}, got {got}",
                "a non-empty string of at most 255 characters, without control characters",
                got=_repr(value))


JobIdStr = Annotated[str, BeforeValidator(_job_id), WithJsonSchema({"type": "string", "pattern": "^[0-9a-fA-F]{32}$"})]
Kind = Annotated[Literal["pyspark", "noop"], BeforeValidator(_kind)]
JobName = Annotated[str, BeforeValidator(_job_name)]


class _Strict(BaseModel):
    """Unknown keys are refused with the list of accepted ones (a typo is never silently ignored)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            accepted = [f.alias or name for name, f in cls.model_fields.items()]
            known = set(accepted) | set(cls.model_fields)
            for key in data:
                if key not in known:
                    close = difflib.get_close_matches(str(key), accepted, n=1, cutoff=0.6)
                    hint = (f"did you mean {close[0]!r}? " if close else "") + "accepted: " + ", ".join(accepted)
                    raise PydanticCustomError(
                        "unknown_field", "unknown field", {"subfield": str(key), "expected": "one of: "
                                                           + ", ".join(accepted), "hint": hint})
        return data


# --- restart strategies (Flink's names, parameters and defaults; durations in seconds) -----


class NoRestart(_Strict):
    """Never restart: the first failure fails the job."""

    type: Literal["none"]


class FixedDelay(_Strict):
    """Restart up to `attempts` times, waiting `delay` between attempts."""

    type: Literal["fixed-delay"]
    attempts: int_at_least(0) = 1
    delay: Seconds = 1.0


class FailureRate(_Strict):
    """Restart unless more than `max-failures-per-interval` failures happen within `failure-rate-interval`."""

    type: Literal["failure-rate"]
    max_failures_per_interval: int_at_least(1) = Field(1, alias="max-failures-per-interval")
    failure_rate_interval: Seconds = Field(60.0, alias="failure-rate-interval")
    delay: Seconds = 1.0


class ExponentialDelay(_Strict):
    """Back off exponentially between restarts; reset after `reset-backoff-threshold` of smooth running."""

    type: Literal["exponential-delay"]
    initial_backoff: Seconds = Field(1.0, alias="initial-backoff")
    max_backoff: Seconds = Field(60.0, alias="max-backoff")
    backoff_multiplier: number_between(1.0) = Field(1.5, alias="backoff-multiplier")
    reset_backoff_threshold: Seconds = Field(3600.0, alias="reset-backoff-threshold")
    jitter_factor: number_between(0.0, 1.0) = Field(0.1, alias="jitter-factor")
    attempts_before_reset_backoff: int_at_least(1) | None = Field(
        None, alias="attempts-before-reset-backoff", description="default: unlimited")

    @model_validator(mode="after")
    def _backoff_order(self) -> "ExponentialDelay":
        if self.max_backoff < self.initial_backoff:
            raise PydanticCustomError(
                "backoff_order", "must not be smaller than initial-backoff ({initial}s), got {got}s",
                {"subfield": "max-backoff", "expected": "max-backoff >= initial-backoff",
                 "initial": self.initial_backoff, "got": self.max_backoff})
        return self


def _restart_type(value: Any) -> Any:
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        return {**value, "type": restart.strategy_type(value["type"]) or value["type"].strip().lower()}
    if isinstance(value, dict) and "type" not in value:
        raise _fail("restart_type", "field required: must be {expected}", "one of " + ", ".join(RESTART_TYPES),
                    subfield="type")
    if not isinstance(value, dict):
        raise _fail("restart_object", "must be {expected}, got {got}",
                    'a JSON object such as {"type": "fixed-delay", "attempts": 3, "delay": "10 s"}', got=_repr(value))
    return value


RestartStrategy = Annotated[
    Union[NoRestart, FixedDelay, FailureRate, ExponentialDelay],
    Field(discriminator="type"),
    BeforeValidator(_restart_type),
]
_RESTART = TypeAdapter(RestartStrategy)


def stored_restart_strategy(strategy: NoRestart | FixedDelay | FailureRate | ExponentialDelay) -> dict[str, Any]:
    """A restart strategy as stored in the catalog and read by `shared.restart`: Flink's
    kebab-case names, defaults filled in, durations in seconds. `shared.restart.normalise` has the
    last word (raises InvalidRestartStrategy), so the dispatcher never stores what the
    JobManager would refuse."""
    out = strategy.model_dump(by_alias=True, exclude_none=True)
    return restart.normalise(out)


def normalise_restart_strategy(raw: dict[str, Any]) -> dict[str, Any]:
    """`stored_restart_strategy` of a raw object (the cluster default from settings).
    Raises pydantic.ValidationError or InvalidRestartStrategy."""
    return stored_restart_strategy(_RESTART.validate_python(raw))


# --- POST /jars/{jarid}/run ----------------------------------------------------------------


def check_program_args(text: str | None, listed: list[str] | None) -> None:
    """programArgs (one shell-quoted string) or programArgsList, not both; the string must split."""
    if text is not None and listed is not None:
        raise PydanticCustomError(
            "confusing_args", "Confusing request: programArgs and programArgsList are both specified",
            {"subfield": "programArgs", "expected": "only one of programArgs / programArgsList",
             "hint": "use only programArgsList"})
    if text is not None:
        try:
            shlex.split(text)
        except ValueError as exc:
            raise PydanticCustomError(
                "program_args", "cannot be split into arguments: {error}",
                {"subfield": "programArgs", "expected": "a shell-quoted argument string",
                 "error": str(exc), "hint": "balance the quotes, or send programArgsList"}) from None


class JarRunRequest(_Strict):
    """Flink's JarRunRequestBody plus Headrace's fields. Every field is optional."""

    entryClass: EntryName | None = Field(None, description="entry function of the module (default 'build')")
    parallelism: Parallelism | None = Field(None, description="Spark parallelism of each task (default 1)")
    programArgs: str | None = Field(None, description="program arguments as one string, split like a shell")
    programArgsList: list[str] | None = Field(None, description="program arguments as a list")
    jobId: JobIdStr | None = Field(None, description="32-hex job id; generated when absent")
    jobName: JobName | None = Field(None, description="default: the uploaded file's name without extension")
    restartStrategy: RestartStrategy | None = Field(None, description="default: the cluster's restart strategy")
    config: dict[str, Any] | None = Field(None, description="job configuration (Spark and Headrace options)")
    flinkConfiguration: dict[str, Any] | None = Field(None, description="merged into `config` (config wins)")
    kind: Kind | None = Field(None, description="'pyspark' (default) or 'noop' (runs nothing, for tests)")
    savepointPath: str | None = Field(None, description="start from this savepoint or retained checkpoint "
                                                         "(a path, file:///path or file:/path)")
    allowNonRestoredState: StrictBool | None = Field(None, description="drop snapshot state the new pipeline has no "
                                                                 "operator for")
    claimMode: str | None = Field(None, description="NO_CLAIM (default) or CLAIM")
    restoreMode: str | None = Field(None, description="Flink's older name of claimMode (LEGACY reads as NO_CLAIM)")

    @model_validator(mode="after")
    def _one_way_of_args(self) -> "JarRunRequest":
        check_program_args(self.programArgs, self.programArgsList)
        return self

    def program_args(self) -> list[str] | None:
        if self.programArgsList is not None:
            return list(self.programArgsList)
        if self.programArgs is not None:
            return shlex.split(self.programArgs)
        return None


# --- responses (Flink REST v1 shapes) ------------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")


class JarUploadResponse(_Out):
    filename: str = Field(description="where the file is stored")
    status: Literal["success"] = "success"
    id: str = Field(description="the jar id to use in /jars/{jarid}/run")


class JarEntryInfo(_Out):
    name: str
    description: str | None = None


class JarFileInfo(_Out):
    id: str
    name: str
    uploaded: int = Field(description="epoch ms")
    entry: list[JarEntryInfo]


class JarListInfo(_Out):
    address: str
    files: list[JarFileInfo]


class JarRunResponse(_Out):
    jobid: str


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
        None, description="the leading JobManager (Headrace addition); null: none leads, submissions wait")


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
    schedule_id: str | None = Field(None, alias="schedule-id", description="the schedule that started this job")


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


class TaskManagersInfo(_Out):
    taskmanagers: list[TaskManagerInfo]


class SlotInfo(_Out):
    index: int | None = None
    allocation_id: str | None = None
    job_id: str | None = None
    execution_id: str | None = None


class TaskManagerDetailsInfo(TaskManagerInfo):
    allocatedSlots: list[SlotInfo]
    state: str
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


# --- operator endpoints: logs, JobManager facts, live task figures (docs/runbooks/logs.md) ---


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
    numInputRows: int | None = None
    timestamp: int | None = Field(None, description="epoch ms when the TaskManager recorded the batch")
    sparkUi: str | None = Field(None, description="the driver's Spark UI, when the TaskManager runs it")


class JobProgressInfo(_Out):
    tasks: list[TaskProgressInfo]


class MetricValue(_Out):
    id: str
    value: str | None = None


class WhoAmI(_Out):
    auth: Literal["off", "required"] = Field(description="off: no token needed, anyone may do everything")
    role: Literal["viewer", "operator", "admin"]
    name: str | None = Field(None, description="the token's name (headrace token list)")
