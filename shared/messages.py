"""Message contracts between services, and the envelope every message travels in.

Commands are imperative (`RequestSlots`, `DeployTask`), events past tense (`SlotsAllocated`,
`TaskStateChanged`). Messages carry ids, never objects. Every body is frozen and has a literal
`type` so a stream entry decodes to exactly one class.

Ids are the types of `shared.ids` (JobId, ExecutionId, TaskManagerId, ...): plain strings on
the wire, distinct types to a type checker, so a job id cannot be passed where an execution id
is expected.

Which stream carries what is in `shared.streams`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shared.errors import MessageError
from shared.ids import AllocationId, ExecutionId, JobId, MessageId, RequestId, TaskManagerId, new_message_id
from shared.states import ExecutionState
from shared.task_protocol import TaskSpec

SCHEMA_VERSION = 1


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SlotState(_Body):
    """One slot in a slot report: free, or held by an allocation for a job's execution."""

    index: int
    allocation_id: AllocationId | None = None
    job_id: JobId | None = None
    execution_id: ExecutionId | None = None


class TaskReport(_Body):
    """What a TaskManager is running, sent on (re-)registration so a new RM/JM can reconcile."""

    execution_id: ExecutionId
    job_id: JobId
    state: ExecutionState
    allocation_id: AllocationId | None = None


# --- TaskManager -> ResourceManager ------------------------------------------------------


class RegisterTaskManager(_Body):
    type: Literal["RegisterTaskManager"] = "RegisterTaskManager"
    taskmanager_id: TaskManagerId
    host: str
    slots: int
    cores: float
    memory_bytes: int
    queue: str
    slot_report: tuple[SlotState, ...] = ()
    running: tuple[TaskReport, ...] = ()
    simulated: bool = False
    # CLIENT SETNAME of the TaskManager process's Redis connection (see shared.streams).
    liveness_name: str | None = None
    # Ready warm drivers and their parallelism (they serve p <= it): placement prefers them, then
    # drivers still warming up whose SparkSession is up (`warm_warming`).
    warm_ready: int = 0
    warm_parallelism: int = 0
    warm_warming: int = 0
    # Where it serves its log files (http://host:port, its metrics port) and its own log's name: the
    # dispatcher fetches them from there, as registered (services/resourcemanager/claims.py).
    log_endpoint: str | None = None
    main_log: str | None = None


class TaskManagerHeartbeat(_Body):
    type: Literal["TaskManagerHeartbeat"] = "TaskManagerHeartbeat"
    taskmanager_id: TaskManagerId
    slot_report: tuple[SlotState, ...]
    seq: int = 0
    warm_ready: int = 0  # as in RegisterTaskManager; defaults keep older TaskManagers understood
    warm_parallelism: int = 0
    warm_warming: int = 0


class UnregisterTaskManager(_Body):
    type: Literal["UnregisterTaskManager"] = "UnregisterTaskManager"
    taskmanager_id: TaskManagerId
    reason: str = "shutdown"


# --- ResourceManager -> TaskManager (the TaskManager's inbox) -----------------------------


class HeartbeatAck(_Body):
    """The ResourceManager's half of the two-way heartbeat. `rm_session` changes when the RM
    restarts, which tells the TaskManager to register again."""

    type: Literal["HeartbeatAck"] = "HeartbeatAck"
    taskmanager_id: TaskManagerId
    rm_session: str
    known: bool = True


# --- JobManager -> ResourceManager ---------------------------------------------------------


class RequestSlots(_Body):
    type: Literal["RequestSlots"] = "RequestSlots"
    request_id: RequestId
    job_id: JobId
    execution_id: ExecutionId
    slots: int
    timeout_s: float
    submitted_seq: int = 0


class CancelSlotRequest(_Body):
    type: Literal["CancelSlotRequest"] = "CancelSlotRequest"
    request_id: RequestId


class ReleaseSlots(_Body):
    type: Literal["ReleaseSlots"] = "ReleaseSlots"
    allocation_id: AllocationId
    reason: str = ""


# --- ResourceManager -> JobManager ---------------------------------------------------------


class SlotsAllocated(_Body):
    type: Literal["SlotsAllocated"] = "SlotsAllocated"
    request_id: RequestId
    execution_id: ExecutionId
    job_id: JobId
    allocation_id: AllocationId
    taskmanager_id: TaskManagerId
    queue: str
    slot_indices: tuple[int, ...]


class SlotRequestPending(_Body):
    type: Literal["SlotRequestPending"] = "SlotRequestPending"
    request_id: RequestId
    execution_id: ExecutionId
    job_id: JobId
    reason: str


class SlotRequestFailed(_Body):
    type: Literal["SlotRequestFailed"] = "SlotRequestFailed"
    request_id: RequestId
    execution_id: ExecutionId
    job_id: JobId
    reason: str
    # No registered TaskManager could ever hold the request: a restart would only queue it again,
    # so the JobManager fails the job instead of restarting it.
    permanent: bool = False


class TaskManagerLost(_Body):
    type: Literal["TaskManagerLost"] = "TaskManagerLost"
    taskmanager_id: TaskManagerId
    reason: str
    allocations: tuple[str, ...] = ()
    # Wall-clock seconds of its last heartbeat (or registration), for people and logs.
    last_heard_at: float | None = None
    # How long it had been silent when declared lost, measured on the ResourceManager's own
    # monotonic clock: the restart backoff is counted from its last sign of life (see
    # JobMaster._fail_execution) without comparing two hosts' clocks.
    silent_for_s: float | None = None


class ResourceManagerStarted(_Body):
    """A new ResourceManager knows no pending slot requests: the JobManager asks again."""

    type: Literal["ResourceManagerStarted"] = "ResourceManagerStarted"
    rm_session: str


class TaskManagerRegistered(_Body):
    type: Literal["TaskManagerRegistered"] = "TaskManagerRegistered"
    taskmanager_id: TaskManagerId
    running: tuple[TaskReport, ...] = ()


# --- Dispatcher -> JobManager ---------------------------------------------------------------


class SubmitJob(_Body):
    type: Literal["SubmitJob"] = "SubmitJob"
    job_id: JobId


class CancelJob(_Body):
    type: Literal["CancelJob"] = "CancelJob"
    job_id: JobId


SnapshotKind = Literal["checkpoint", "savepoint"]
# What the job does once a savepoint completed: keep running; cancel (Flink's "cancel-job":
# job CANCELED); stop (stop-with-savepoint: the task ends and the job is FINISHED); rescale (the
# task ends and a new attempt restores the savepoint with the operation's parallelism).
AfterSnapshot = Literal["continue", "cancel", "stop", "rescale"]


class RequestCheckpoint(_Body):
    """POST /jobs/{id}/checkpoints: one checkpoint now, outside the interval. `request_id` is the
    catalog operation the dispatcher created; the JobManager completes or fails it."""

    type: Literal["RequestCheckpoint"] = "RequestCheckpoint"
    job_id: JobId
    request_id: RequestId


class RequestSavepoint(_Body):
    """Savepoint (optionally followed by cancel, stop or rescale) of a running job."""

    type: Literal["RequestSavepoint"] = "RequestSavepoint"
    job_id: JobId
    request_id: RequestId
    target_directory: str  # where the savepoint directory is created (already resolved, local path)
    after: AfterSnapshot = "continue"
    drain: bool = False
    parallelism: int | None = None  # for after == "rescale"


# --- JobManager -> TaskManager (Celery commands, one queue per TaskManager) ----------------


class DeployTask(_Body):
    type: Literal["DeployTask"] = "DeployTask"
    taskmanager_id: TaskManagerId  # one process may serve several from one queue (bench/simulated_taskmanagers.py)
    allocation_id: AllocationId
    slot_indices: tuple[int, ...]
    spec: TaskSpec


class CancelTask(_Body):
    type: Literal["CancelTask"] = "CancelTask"
    taskmanager_id: TaskManagerId
    execution_id: ExecutionId
    job_id: JobId


class TriggerCheckpoint(_Body):
    """Take snapshot `checkpoint_id` of the attempt's Spark query into `target` (a directory that
    must not exist yet). The barrier is a micro-batch commit: the snapshot is taken at the first
    committed batch at or after the batch planned when the trigger arrives. `stop_after`: stop
    the query once the snapshot is taken (stop-with-savepoint, rescale), so the task FINISHES."""

    type: Literal["TriggerCheckpoint"] = "TriggerCheckpoint"
    taskmanager_id: TaskManagerId
    job_id: JobId
    execution_id: ExecutionId
    checkpoint_id: int
    kind: SnapshotKind = "checkpoint"
    target: str
    stop_after: bool = False
    drain: bool = False


# --- TaskManager -> JobManager --------------------------------------------------------------


class TaskStateChanged(_Body):
    type: Literal["TaskStateChanged"] = "TaskStateChanged"
    execution_id: ExecutionId
    job_id: JobId
    taskmanager_id: TaskManagerId
    state: ExecutionState
    failure_cause: str | None = None
    failure_name: str | None = None
    at: float = Field(default_factory=time.time)


class TaskProgress(_Body):
    """A committed micro-batch: Spark's commit is the checkpoint barrier (see DESIGN.md)."""

    type: Literal["TaskProgress"] = "TaskProgress"
    execution_id: ExecutionId
    job_id: JobId
    batch_id: int
    num_input_rows: int = 0
    input_rows_per_second: float = 0.0
    processed_rows_per_second: float = 0.0
    at: float = Field(default_factory=time.time)


class TaskWaiting(_Body):
    """A running task waits for something outside Headrace (a SQL sink's database away): `reason`
    says what, None once it goes on. The JobManager keeps it as the attempt's waiting reason."""

    type: Literal["TaskWaiting"] = "TaskWaiting"
    execution_id: ExecutionId
    job_id: JobId
    reason: str | None = None
    at: float = Field(default_factory=time.time)


class CheckpointAcknowledged(_Body):
    """The task took snapshot `checkpoint_id` at Spark batch `batch_id` (its commit is the barrier)."""

    type: Literal["CheckpointAcknowledged"] = "CheckpointAcknowledged"
    job_id: JobId
    execution_id: ExecutionId
    taskmanager_id: TaskManagerId
    checkpoint_id: int
    path: str
    batch_id: int
    state_size: int = 0  # bytes in the snapshot
    duration_ms: int = 0  # trigger received -> snapshot written
    source_offsets: tuple[str, ...] = ()  # Spark's end offsets of the batch, one JSON text per source


class CheckpointDeclined(_Body):
    type: Literal["CheckpointDeclined"] = "CheckpointDeclined"
    job_id: JobId
    execution_id: ExecutionId
    taskmanager_id: TaskManagerId
    checkpoint_id: int
    reason: str
    permanent: bool = False  # the task can never checkpoint (a batch query): not a failure, stop triggering


class RedisKeysClaimed(_Body):
    """A running attempt's Redis connectors claim the streams they read and write (its job declares
    no Redis keys: shared/redis_key_grants.py "connectors"); the JobManager grants them to the
    lineage's Redis user or fails the attempt with why."""

    type: Literal["RedisKeysClaimed"] = "RedisKeysClaimed"
    execution_id: ExecutionId
    job_id: JobId
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()


class CommandRejected(_Body):
    """A TaskManager refused or could not carry out a JobManager command (it did not decode, its
    spec failed validation, the deploy broke before the task started): the JobManager fails the
    attempt over at once instead of waiting for its acknowledgement timeout. `command` is the
    command's type when it could be read."""

    type: Literal["CommandRejected"] = "CommandRejected"
    taskmanager_id: TaskManagerId
    command: str | None = None
    execution_id: ExecutionId | None = None
    job_id: JobId | None = None
    reason: str
    at: float = Field(default_factory=time.time)


Message = Annotated[
    Union[
        RegisterTaskManager,
        TaskManagerHeartbeat,
        UnregisterTaskManager,
        HeartbeatAck,
        RequestSlots,
        CancelSlotRequest,
        ReleaseSlots,
        SlotsAllocated,
        SlotRequestPending,
        SlotRequestFailed,
        TaskManagerLost,
        TaskManagerRegistered,
        ResourceManagerStarted,
        SubmitJob,
        CancelJob,
        RequestCheckpoint,
        RequestSavepoint,
        DeployTask,
        CancelTask,
        TriggerCheckpoint,
        TaskStateChanged,
        TaskProgress,
        TaskWaiting,
        CheckpointAcknowledged,
        CheckpointDeclined,
        CommandRejected,
        RedisKeysClaimed,
    ],
    Field(discriminator="type"),
]


class Envelope(BaseModel):
    """What goes on the wire. `epoch` is the fencing token of the JobManager leader that sent
    (or, for non-JobManager senders, last saw) the message; receivers accept a JobManager
    message only if its epoch is the current leader's, as published in Redis
    (shared/leader_epoch.py), never merely the highest one seen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    message_id: MessageId = Field(default_factory=new_message_id)
    sender: str
    sent_at: float = Field(default_factory=time.time)
    epoch: int = 0
    body: Message


_ENVELOPE = TypeAdapter(Envelope)


class UndecodableMessage(MessageError, ValueError):
    """A stream entry that is not a valid envelope of a known schema version."""


def encode(envelope: Envelope) -> bytes:
    return envelope.model_dump_json().encode()


def decode(raw: bytes | str) -> Envelope:
    try:
        env = _ENVELOPE.validate_json(raw)
    except ValidationError as exc:
        raise UndecodableMessage(_short(exc)) from None
    if env.schema_version != SCHEMA_VERSION:
        raise UndecodableMessage(f"schema version {env.schema_version}, expected {SCHEMA_VERSION}")
    return env


def wrap(body: Any, *, sender: str, epoch: int = 0) -> Envelope:
    return Envelope(sender=sender, epoch=epoch, body=body)


def _short(exc: ValidationError) -> str:
    errs = exc.errors()
    first = errs[0] if errs else {"loc": (), "msg": str(exc)}
    loc = ".".join(str(p) for p in first.get("loc", ()))
    return f"{loc}: {first.get('msg')}" + (f" (+{len(errs) - 1} more)" if len(errs) > 1 else "")
