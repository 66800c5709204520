"""Typed ids. Flink names things by 32-hex ids; so do we, with a readable prefix where it helps
an operator grep logs (TaskManager ids carry the host name)."""

from __future__ import annotations

import os
import re
import socket
from typing import NewType

JobId = NewType("JobId", str)
VertexId = NewType("VertexId", str)
ExecutionId = NewType("ExecutionId", str)
TaskManagerId = NewType("TaskManagerId", str)
# A TaskManager id goes into Redis key patterns, a Redis user's name and file names: no glob
# characters, no ':' (its keys are hr:tm:<id>:...), no spaces.
TASKMANAGER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
AllocationId = NewType("AllocationId", str)
ArtifactId = NewType("ArtifactId", str)
MessageId = NewType("MessageId", str)
RequestId = NewType("RequestId", str)


def _hex() -> str:
    # 128 random bits, as Flink's ids; os.urandom(16).hex() is a quarter of uuid4().hex's cost,
    # which showed when one process sends 10,000 heartbeats a second.
    return os.urandom(16).hex()


def new_job_id() -> JobId:
    return JobId(_hex())


def new_vertex_id() -> VertexId:
    return VertexId(_hex())


def new_execution_id() -> ExecutionId:
    return ExecutionId(_hex())


def new_allocation_id() -> AllocationId:
    return AllocationId(_hex())


def new_message_id() -> MessageId:
    return MessageId(_hex())


def new_request_id() -> RequestId:
    return RequestId(_hex())


def slot_request_id(execution_id: ExecutionId) -> RequestId:
    """An attempt asks for its slots once, so its slot request is named by the attempt: a request
    sent again after a JobManager failover is the same request (the ResourceManager serves it
    once), and an allocation adopted from a slot report gets its request id back."""
    return RequestId(execution_id)


def slot_request_execution(request_id: RequestId) -> ExecutionId:
    """The attempt a slot request is for (see slot_request_id)."""
    return ExecutionId(request_id)


# Where an attempt not placed yet is said to run: a command addressed to it reaches no
# TaskManager, and a TaskManager ignores it.
NO_TASKMANAGER = TaskManagerId("")


def new_artifact_id(filename: str) -> ArtifactId:
    # Flink's jar ids are "<uuid>_<filename>"; keep that shape so scripts written for Flink's
    # REST API recognise it.
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in filename)
    if len(safe) > 80:
        # The stored file is named by the id, and the driver picks .py or .zip by its suffix:
        # a long name cut at 80 characters made a file no driver could load.
        stem, dot, suffix = safe.rpartition(".")
        safe = safe[:80] if not dot or len(suffix) > 16 else f"{stem[: 79 - len(suffix)]}.{suffix}"
    return ArtifactId(f"{_hex()}_{safe}")


def new_taskmanager_id(suffix: str = "") -> TaskManagerId:
    host = socket.gethostname().split(".")[0] or "localhost"
    return TaskManagerId(f"{host}-{suffix or _hex()[:8]}")


def is_hex_id(value: str) -> bool:
    return len(value) == 32 and all(c in "0123456789abcdef" for c in value)
