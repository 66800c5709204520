"""Contract between a TaskManager and the Spark driver processes it supervises.

A driver process (`python -m services.taskmanager.runtime.runner`) is started by the TaskManager
*before* any task exists (a warm slot): it builds a `local[p]` SparkSession, runs a tiny job so
the JVM and Python workers are hot, then reports `ready` and waits for one `RunTask` on stdin.
It runs exactly one task and exits, so no state leaks from one job into the next.

Wire format: one JSON object per line. Commands go to the driver's stdin; events come back on
the file descriptor named by `--events-fd` (stdout and stderr go to the driver's log file,
because Spark and user code print freely).

Driver events, in order:  ready -> initializing -> running -> progress* -> finished | failed | canceled
A driver that dies without `finished`/`failed`/`canceled` has failed; the TaskManager reports
its exit code and the tail of its log. While running, a `snapshot` command (a checkpoint or
savepoint trigger) is answered by one `snapshot_taken` or `snapshot_declined` event.

A task handed to a driver that is not ready yet waits for its `ready`: the TaskManager then
creates the file TASK_WAITING_MARKER in the driver's work directory, and the driver cuts its
warm-up short (a file, not a signal: it may arrive before the driver could install a handler).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from shared.ids import ExecutionId, JobId, VertexId

TASK_WAITING_MARKER = ".task-waiting"


class _M(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TaskSpec(_M):
    """One attempt's task: what the JobManager deploys (shared.messages.DeployTask carries it, so
    it is validated once, when the command decodes) and what the driver runs."""

    job_id: JobId
    job_name: str = ""
    vertex_id: VertexId
    execution_id: ExecutionId
    attempt: int
    parallelism: int
    kind: Literal["pyspark", "noop"] = "pyspark"
    artifact_path: str | None = None
    entry: str = "build"
    program_args: tuple[str, ...] = ()
    # This attempt's own live Spark checkpoint location. Never shared with another attempt: a
    # restarted attempt starts from a copy of the latest completed snapshot (`restore_from`).
    checkpoint_dir: str
    # A completed checkpoint or savepoint directory (holding `_metadata`) to start from, or None
    # for a fresh start; the driver materialises it into `checkpoint_dir` before the query starts.
    restore_from: str | None = None
    restore_checkpoint_id: int | None = None
    allow_non_restored_state: bool = False
    artifact_sha256: str | None = None  # recorded in each snapshot's metadata (pipeline fingerprint)
    # Sink fencing token: strictly increasing over every attempt the JobManagers deploy (wall-clock
    # microseconds at the deploy decision, kept monotonic), so a later attempt of any job of the
    # same lineage (a restart, a job resumed from a savepoint, a rollback to an older savepoint)
    # takes over its sinks and every earlier attempt is fenced off. 0: use `attempt`.
    fence_token: int = 0
    # The pipeline's own database (pipeline_catalog_url), "" for none; never the control catalog.
    catalog_url: str = ""
    redis_url: str
    # The Kafka brokers the pipeline's Kafka sources and sinks use by default
    # (pipeline_kafka_bootstrap_servers), "" for none.
    kafka_bootstrap_servers: str = ""
    # The pipelines' lake directory (lake_dir) and the other allowed storage roots: where a Delta
    # table may lie (services/taskmanager/runtime/connectors/delta_paths.py); "" / (): none given.
    lake_dir: str = ""
    storage_roots: tuple[str, ...] = ()
    config: dict[str, Any] = Field(default_factory=dict)


class RunTask(_M):
    cmd: Literal["run"] = "run"
    spec: TaskSpec


class CancelRun(_M):
    cmd: Literal["cancel"] = "cancel"


class TakeSnapshot(_M):
    """Snapshot the running query into `target` (see shared.messages.TriggerCheckpoint)."""

    cmd: Literal["snapshot"] = "snapshot"
    checkpoint_id: int
    kind: Literal["checkpoint", "savepoint"] = "checkpoint"
    target: str
    stop_after: bool = False
    drain: bool = False


DriverCommand = Annotated[Union[RunTask, CancelRun, TakeSnapshot], Field(discriminator="cmd")]


class Ready(_M):
    event: Literal["ready"] = "ready"
    pid: int
    parallelism: int
    startup_s: float


class Initializing(_M):
    event: Literal["initializing"] = "initializing"


class Running(_M):
    event: Literal["running"] = "running"
    streaming: bool
    # The driver's Spark UI (sc.uiWebUrl) when the TaskManager's spark_ui setting is on.
    spark_ui: str | None = None


class Progress(_M):
    event: Literal["progress"] = "progress"
    batch_id: int
    num_input_rows: int = 0
    input_rows_per_second: float = 0.0
    processed_rows_per_second: float = 0.0
    batch_duration_ms: int | None = None
    # Entries the sources hold beyond what this batch read, when a source reports it (a Kafka
    # source's lag summed over its partitions); None when none does.
    source_lag: float | None = None
    # Each Kafka partition's lag, "topic/partition" -> records; None without a Kafka source. How
    # many there are is how many Spark tasks can read at once (the autoscaler's cap).
    partition_lag: dict[str, int] | None = None
    # What the batch committed to a table sink (a Delta sink: "version", "files_added"); None
    # for other sinks.
    sink_commit: dict[str, int] | None = None
    # The driver's Spark UI (sc.uiWebUrl) when it runs one; the TaskManager puts its own
    # advertised host in it.
    spark_ui: str | None = None


class Waiting(_M):
    """The running task waits for something outside Headrace (a SQL sink's database); `reason`
    None: it goes on. The attempt's `waiting-reason` shows it meanwhile."""

    event: Literal["waiting"] = "waiting"
    reason: str | None = None


class Finished(_M):
    event: Literal["finished"] = "finished"


class Failed(_M):
    event: Literal["failed"] = "failed"
    error_name: str
    traceback: str


class Canceled(_M):
    event: Literal["canceled"] = "canceled"


class SnapshotTaken(_M):
    event: Literal["snapshot_taken"] = "snapshot_taken"
    checkpoint_id: int
    path: str
    batch_id: int
    state_size: int
    duration_ms: int
    source_offsets: tuple[str, ...] = ()


class SnapshotDeclined(_M):
    event: Literal["snapshot_declined"] = "snapshot_declined"
    checkpoint_id: int
    reason: str
    permanent: bool = False  # this task can never take one (a batch query): stop triggering it


DriverEvent = Annotated[
    Union[Ready, Initializing, Running, Progress, Waiting, Finished, Failed, Canceled, SnapshotTaken,
          SnapshotDeclined],
    Field(discriminator="event"),
]

_CMD: TypeAdapter[DriverCommand] = TypeAdapter(DriverCommand)
_EVT: TypeAdapter[DriverEvent] = TypeAdapter(DriverEvent)


def encode_line(msg: _M) -> bytes:
    return msg.model_dump_json().encode() + b"\n"


def decode_command(line: bytes | str) -> RunTask | CancelRun | TakeSnapshot:
    return _CMD.validate_json(line)


def decode_event(line: bytes | str):
    return _EVT.validate_json(line)


def snapshot_metadata(spec: TaskSpec, *, kind: str, checkpoint_id: int) -> dict:
    """What every snapshot's `_metadata` says about the task that took it (the storage adds the
    Spark side: batch, offsets, state operators, sizes)."""
    return {"kind": kind, "checkpoint_id": checkpoint_id, "job_id": spec.job_id, "job_name": spec.job_name,
            "vertex_id": spec.vertex_id, "execution_id": spec.execution_id, "attempt": spec.attempt,
            "parallelism": spec.parallelism,
            "pipeline": {"kind": spec.kind, "artifact_sha256": spec.artifact_sha256, "entry": spec.entry,
                         "args": list(spec.program_args)}}


def spec_from_json(text: str) -> TaskSpec:
    return TaskSpec.model_validate(json.loads(text))
