"""Request bodies of the checkpoint and savepoint endpoints, spelled as Flink 2.3's REST client
sends them (kebab-case for the savepoint trigger and disposal, camelCase for stop and the manual
checkpoint), and their response shapes for /docs. Unknown keys are refused with the accepted
ones listed, as Flink's strict JSON mapper refuses them; every key Flink's own clients send
(`formatType`, `triggerId`, nulls included) is accepted."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SerializerFunctionWrapHandler, WithJsonSchema, model_serializer

from services.dispatcher.guards.strict_fields import StrictBool
from services.dispatcher.schemas.fields import _fail, _Out, _repr, _Strict

FORMAT_TYPES = ("CANONICAL", "NATIVE")
CHECKPOINT_TYPES = ("CONFIGURED", "FULL", "INCREMENTAL")


def _trigger_id(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{32}", value):
        return value.lower()
    raise _fail(
        "trigger_id",
        "must be {expected}, got {got}",
        "32 hexadecimal characters (a Flink TriggerId)",
        got=_repr(value),
        hint="leave triggerId out to have one generated",
    )


def _upper_choice(choices: tuple[str, ...]):
    def check(value: Any) -> str:
        if isinstance(value, str) and value.strip().upper() in choices:
            return value.strip().upper()
        raise _fail("choice", "must be {expected}, got {got}", "one of " + ", ".join(choices), got=_repr(value))

    return check


TriggerIdStr = Annotated[
    str, BeforeValidator(_trigger_id), WithJsonSchema({"type": "string", "pattern": "^[0-9a-fA-F]{32}$"})
]
FormatType = Annotated[
    str, BeforeValidator(_upper_choice(FORMAT_TYPES)), WithJsonSchema({"type": "string", "enum": list(FORMAT_TYPES)})
]
CheckpointType = Annotated[
    str,
    BeforeValidator(_upper_choice(CHECKPOINT_TYPES)),
    WithJsonSchema({"type": "string", "enum": list(CHECKPOINT_TYPES)}),
]


class SavepointTriggerRequest(_Strict):
    """Flink's SavepointTriggerRequestBody."""

    target_directory: str | None = Field(
        None, alias="target-directory", description="plain path or file:// URI; default: state.savepoints.dir"
    )
    cancel_job: StrictBool | None = Field(
        None, alias="cancel-job", description="cancel the job once the savepoint is taken"
    )
    formatType: FormatType | None = Field(None, description="CANONICAL (default) or NATIVE; both are the same here")
    triggerId: TriggerIdStr | None = Field(None, description="idempotency key: the same id never triggers twice")


class StopWithSavepointRequest(_Strict):
    """Flink's StopWithSavepointRequestBody."""

    targetDirectory: str | None = Field(None, description="plain path or file:// URI; default: state.savepoints.dir")
    drain: StrictBool | None = Field(
        None, description="advance the event-time watermark to the end first, so every open window fires"
    )
    formatType: FormatType | None = None
    triggerId: TriggerIdStr | None = None


class SavepointDisposalRequest(_Strict):
    """Flink's SavepointDisposalRequest."""

    savepoint_path: str = Field(alias="savepoint-path", description="a savepoint or retained checkpoint directory")


class CheckpointTriggerRequest(_Strict):
    """Flink's CheckpointTriggerRequestBody."""

    checkpointType: CheckpointType | None = Field(
        None, description="CONFIGURED (default), FULL or INCREMENTAL; every checkpoint here is a full one"
    )
    triggerId: TriggerIdStr | None = None


# --- responses ----------------------------------------------------------------------------


class TriggerResponse(_Out):
    request_id: str = Field(alias="request-id", description="poll the operation's status resource with it")


class QueueStatus(_Out):
    id: Literal["IN_PROGRESS", "COMPLETED"]


class OperationWaiting(_Out):
    reason: str = Field(description="why the snapshot is not triggered yet (where the job's task is)")
    since: int = Field(description="when the request began to wait (epoch ms)")
    deadline: int = Field(
        description="when it fails if the task is still not RUNNING (epoch ms): the request "
        "time plus execution.checkpointing.timeout"
    )


class AsynchronousOperationResult(_Out):
    """A failed operation is COMPLETED with a failure cause, as in Flink."""

    status: QueueStatus
    operation: dict[str, Any] | None = Field(
        description='savepoint: {"location"} or {"failure-cause"}; checkpoint: {"checkpointId"} or '
        '{"failureCause"}; disposal and rescaling: {} or {"failure-cause"}'
    )
    waiting: OperationWaiting | None = Field(
        None,
        description="Headrace's, present only while IN_PROGRESS because the job's task is not RUNNING yet: "
        "the snapshot waits for it (Flink fails such a request at once)",
    )

    @model_serializer(mode="wrap")
    def _without_absent_wait(self, handler: SerializerFunctionWrapHandler):  # unannotated: the schema stays the model's
        # Flink's shape exactly when nothing waits: {"status", "operation"} and no third key.
        out = handler(self)
        if out.get("waiting") is None:
            out.pop("waiting", None)
        return out


class StatsSummary(_Out):
    min: int
    max: int
    avg: int
    p50: float
    p90: float
    p95: float
    p99: float
    p999: float


class CheckpointingStatistics(_Out):
    counts: dict[str, int]
    summary: dict[str, StatsSummary]
    latest: dict[str, dict[str, Any] | None]
    history: list[dict[str, Any]]


class CheckpointConfigInfo(_Out):
    mode: str
    interval: int
    timeout: int
    min_pause: int
    max_concurrent: int
    externalization: dict[str, bool]
    state_backend: str
    checkpoint_storage: str
    unaligned_checkpoints: bool
    tolerable_failed_checkpoints: int
    aligned_checkpoint_timeout: int
    checkpoints_after_tasks_finish: bool
    state_changelog_enabled: bool
    changelog_periodic_materialization_interval: int
    changelog_storage: str
