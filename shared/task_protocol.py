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
creates the file TASK_WAITING_MARKER in the driver's directory (beside its work directory, where
the driver cannot write), and the driver cuts its warm-up short (a file, not a signal: it may
arrive before the driver could install a handler).

Events are written by pipeline code's process, so they are bounded where they are read: a line
longer than MAX_EVENT_LINE_BYTES is dropped unread (services/taskmanager/drivers/events.py), and
every string an event carries is cut to its field's bound as it decodes (a traceback keeps its
head and its tail, with a note of what was cut), before anything is published to Redis, the
JobManager or the catalog.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter

from shared.ids import ExecutionId, JobId, VertexId

TASK_WAITING_MARKER = ".task-waiting"

# The bounds of what a driver may send (its process runs the pipeline's code). A line is a few
# hundred bytes; a traceback a few kilobytes: these leave room for any honest one.
MAX_EVENT_LINE_BYTES = 1024 * 1024
MAX_TRACEBACK_CHARS = 64 * 1024
TRACEBACK_HEAD_CHARS = 16 * 1024  # the exception's start; the rest of the bound goes to its end
MAX_TEXT_CHARS = 4096  # a reason, a path, a URL
MAX_NAME_CHARS = 200  # an exception's name
MAX_LIST_ITEMS = 1024  # source offsets, partition lags


def cut(text: object, limit: int, head: int | None = None) -> object:
    """`text` cut to `limit` characters: its first `head` (default all but a note's worth) and
    its last ones, with a note of how much was cut between them. Not a string: as it is (the
    field's type check answers)."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    note = f"\n[... {len(text) - limit} characters cut: the driver sent {len(text)}, at most {limit} are kept ...]\n"
    keep = max(0, limit - len(note))
    first = min(keep, head if head is not None else keep)
    return text[:first] + note + (text[len(text) - (keep - first) :] if keep > first else "")


def _bounded(limit: int, head: int | None = None):
    return BeforeValidator(lambda v: cut(v, limit, head))


def _first(limit: int):
    """A name: its first `limit` characters, no note (a name is shown whole, on one line)."""
    return BeforeValidator(lambda v: v[:limit] if isinstance(v, str) else v)


def _items(limit: int):
    """At most `limit` items of a list or mapping (the rest dropped)."""

    def take(v: object) -> object:
        if isinstance(v, dict) and len(v) > limit:
            return dict(list(v.items())[:limit])
        if isinstance(v, (list, tuple)) and len(v) > limit:
            return list(v)[:limit]
        return v

    return BeforeValidator(take)


Text = Annotated[str, _bounded(MAX_TEXT_CHARS)]
Name = Annotated[str, _first(MAX_NAME_CHARS)]
Traceback = Annotated[str, _bounded(MAX_TRACEBACK_CHARS, TRACEBACK_HEAD_CHARS)]


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
    # The cluster's Redis as this task's lineage's own user (shared/pipeline_redis.py), or the
    # pipelines' Redis URL as configured.
    redis_url: str
    # The lineage the control plane placed the job in (shared/job_lineage.py); None: the
    # driver reads it from the snapshot it restores, as before the control plane decided it.
    lineage_id: str | None = None
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


class Granted(_M):
    """The TaskManager's answer to a request of the driver (ClaimDirectory, ViewSnapshot): what it
    granted at `path` (a files sink's records, services/taskmanager/tasks/sink_claims.py; a view of a
    snapshot, tasks/storage.py); or the refusal, as the exception the driver raises (`error_name`
    SinkOwnedError or SinkFencedError with its arguments, else any other name with `error`, its
    message)."""

    cmd: Literal["granted"] = "granted"
    request_id: int
    path: str = ""
    error_name: str | None = None
    error: str | None = None
    error_args: tuple[Any, ...] = ()


DriverCommand = Annotated[Union[RunTask, CancelRun, TakeSnapshot, Granted], Field(discriminator="cmd")]


class Ready(_M):
    event: Literal["ready"] = "ready"
    pid: int
    parallelism: int
    startup_s: float


class Warming(_M):
    """A driver in reserve has its SparkSession up and runs its warm-up before Ready: a task
    placed on it now waits for no JVM, only for the warm-up to stop."""

    event: Literal["warming"] = "warming"
    startup_s: float


class Initializing(_M):
    event: Literal["initializing"] = "initializing"


class Running(_M):
    event: Literal["running"] = "running"
    streaming: bool
    # The driver's Spark UI (sc.uiWebUrl) when the TaskManager's spark_ui setting is on.
    spark_ui: Text | None = None


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
    partition_lag: Annotated[dict[Name, int] | None, _items(MAX_LIST_ITEMS)] = None
    # What the batch committed to a table sink (a Delta sink: "version", "files_added"); None
    # for other sinks.
    sink_commit: Annotated[dict[Name, int] | None, _items(MAX_LIST_ITEMS)] = None
    # The driver's Spark UI (sc.uiWebUrl) when it runs one; the TaskManager puts its own
    # advertised host in it.
    spark_ui: Text | None = None


class Waiting(_M):
    """The running task waits for something outside Headrace (a SQL sink's database); `reason`
    None: it goes on. The attempt's `waiting-reason` shows it meanwhile."""

    event: Literal["waiting"] = "waiting"
    reason: Text | None = None


class Finished(_M):
    event: Literal["finished"] = "finished"


class Failed(_M):
    event: Literal["failed"] = "failed"
    error_name: Name
    traceback: Traceback


class Canceled(_M):
    event: Literal["canceled"] = "canceled"


class SnapshotTaken(_M):
    event: Literal["snapshot_taken"] = "snapshot_taken"
    checkpoint_id: int
    path: Text
    batch_id: int
    state_size: int
    duration_ms: int
    source_offsets: Annotated[tuple[Annotated[str, _bounded(MAX_TRACEBACK_CHARS)], ...], _items(MAX_LIST_ITEMS)] = ()


class SnapshotDeclined(_M):
    event: Literal["snapshot_declined"] = "snapshot_declined"
    checkpoint_id: int
    reason: Text
    permanent: bool = False  # this task can never take one (a batch query): stop triggering it


class ClaimDirectory(_M):
    """A files sink asks for its directory before it writes (answered by Granted)."""

    event: Literal["claim_directory"] = "claim_directory"
    request_id: int
    path: Text
    kind: Literal["streaming", "batch"] = "streaming"
    attempt: int = 0
    restored_batch_id: int = -1


class ViewSnapshot(_M):
    """The task asks to read a snapshot of its lineage other than the one it was given (a sink
    committed a newer one): answered by Granted with a view of it it may read."""

    event: Literal["view_snapshot"] = "view_snapshot"
    request_id: int
    path: Text


# A Redis key a connector claims: whole, never cut (a cut name would be another key).
RedisKey = Annotated[str, Field(min_length=1, max_length=256)]
MAX_CLAIMED_KEYS = 64


class ClaimRedisKeys(_M):
    """A Redis source or sink of a job that declares no Redis keys asks for the stream it reads
    or writes (shared/redis_key_grants.py, "connectors"): the TaskManager forwards it to the
    JobManager, which adds the keys to the lineage's Redis user or fails the attempt saying why.
    No answer comes back here: the driver sees the grant in its own connection."""

    event: Literal["claim_redis_keys"] = "claim_redis_keys"
    read: Annotated[tuple[RedisKey, ...], Field(max_length=MAX_CLAIMED_KEYS)] = ()
    write: Annotated[tuple[RedisKey, ...], Field(max_length=MAX_CLAIMED_KEYS)] = ()


DriverEvent = Annotated[
    Union[
        Ready,
        Warming,
        Initializing,
        Running,
        Progress,
        Waiting,
        Finished,
        Failed,
        Canceled,
        SnapshotTaken,
        SnapshotDeclined,
        ClaimDirectory,
        ViewSnapshot,
        ClaimRedisKeys,
    ],
    Field(discriminator="event"),
]

_CMD: TypeAdapter[DriverCommand] = TypeAdapter(DriverCommand)
_EVT: TypeAdapter[DriverEvent] = TypeAdapter(DriverEvent)


def encode_line(msg: _M) -> bytes:
    return msg.model_dump_json().encode() + b"\n"


def decode_command(line: bytes | str) -> RunTask | CancelRun | TakeSnapshot | Granted:
    return _CMD.validate_json(line)


def decode_event(line: bytes | str):
    return _EVT.validate_json(line)


def snapshot_metadata(spec: TaskSpec, *, kind: str, checkpoint_id: int) -> dict:
    """What every snapshot's `_metadata` says about the task that took it (the storage adds the
    Spark side: batch, offsets, state operators, sizes)."""
    return {
        "kind": kind,
        "checkpoint_id": checkpoint_id,
        "job_id": spec.job_id,
        "job_name": spec.job_name,
        "vertex_id": spec.vertex_id,
        "execution_id": spec.execution_id,
        "attempt": spec.attempt,
        "parallelism": spec.parallelism,
        "pipeline": {
            "kind": spec.kind,
            "artifact_sha256": spec.artifact_sha256,
            "entry": spec.entry,
            "args": list(spec.program_args),
        },
    }


def spec_from_json(text: str) -> TaskSpec:
    return TaskSpec.model_validate(json.loads(text))
