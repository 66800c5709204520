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
its exit code and the tail of its log.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _M(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TaskSpec(_M):
    job_id: str
    job_name: str = ""
    vertex_id: str
    execution_id: str
    attempt: int
    parallelism: int
    kind: Literal["pyspark", "noop"] = "pyspark"
    artifact_path: str | None = None
    entry: str = "build"
    program_args: tuple[str, ...] = ()
    # The Spark checkpoint location of this vertex: the same for every attempt, so a restarted
    # attempt resumes from the last committed micro-batch.
    checkpoint_dir: str
    catalog_url: str
    redis_url: str
    config: dict[str, Any] = Field(default_factory=dict)


class RunTask(_M):
    cmd: Literal["run"] = "run"
    spec: TaskSpec


class CancelTask(_M):
    cmd: Literal["cancel"] = "cancel"


DriverCommand = Annotated[Union[RunTask, CancelTask], Field(discriminator="cmd")]


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


class Progress(_M):
    event: Literal["progress"] = "progress"
    batch_id: int
    num_input_rows: int = 0
    input_rows_per_second: float = 0.0
    processed_rows_per_second: float = 0.0


class Finished(_M):
    event: Literal["finished"] = "finished"


class Failed(_M):
    event: Literal["failed"] = "failed"
    error_name: str
    traceback: str


class Canceled(_M):
    event: Literal["canceled"] = "canceled"


DriverEvent = Annotated[
    Union[Ready, Initializing, Running, Progress, Finished, Failed, Canceled], Field(discriminator="event")
]

_CMD = TypeAdapter(DriverCommand)
_EVT = TypeAdapter(DriverEvent)


def encode_line(msg: _M) -> bytes:
    return msg.model_dump_json().encode() + b"\n"


def decode_command(line: bytes | str) -> RunTask | CancelTask:
    return _CMD.validate_json(line)


def decode_event(line: bytes | str):
    return _EVT.validate_json(line)


def spec_from_json(text: str) -> TaskSpec:
    return TaskSpec.model_validate(json.loads(text))
