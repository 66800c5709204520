"""What a driver's protocol events (shared/task_protocol.py) become for the JobManager, as
tables: the events forwarded as a message of their own, and the events that end a task; and how
their lines are read (`bounded_lines`, `decoded_events`): the driver runs the pipeline's code, so a
line may be of any length, and must not be what sizes this process's memory, nor may a garbled
one stop the reading."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from shared import task_protocol as tp
from shared.messages import (
    CheckpointAcknowledged,
    CheckpointDeclined,
    Message,
    RedisKeysClaimed,
    TaskProgress,
    TaskWaiting,
)
from shared.states import ExecutionState as ES

log = logging.getLogger("headrace.taskmanager.driver")


def _progress(spec: tp.TaskSpec, tm: str, e: tp.Progress) -> Message:
    return TaskProgress(
        execution_id=spec.execution_id,
        job_id=spec.job_id,
        batch_id=e.batch_id,
        num_input_rows=e.num_input_rows,
        input_rows_per_second=e.input_rows_per_second,
        processed_rows_per_second=e.processed_rows_per_second,
    )


def _snapshot_taken(spec: tp.TaskSpec, tm: str, e: tp.SnapshotTaken) -> Message:
    return CheckpointAcknowledged(
        job_id=spec.job_id,
        execution_id=spec.execution_id,
        taskmanager_id=tm,
        checkpoint_id=e.checkpoint_id,
        path=e.path,
        batch_id=e.batch_id,
        state_size=e.state_size,
        duration_ms=e.duration_ms,
        source_offsets=e.source_offsets,
    )


def _snapshot_declined(spec: tp.TaskSpec, tm: str, e: tp.SnapshotDeclined) -> Message:
    return CheckpointDeclined(
        job_id=spec.job_id,
        execution_id=spec.execution_id,
        taskmanager_id=tm,
        checkpoint_id=e.checkpoint_id,
        reason=e.reason,
        permanent=e.permanent,
    )


def _waiting(spec: tp.TaskSpec, tm: str, e: tp.Waiting) -> Message:
    return TaskWaiting(execution_id=spec.execution_id, job_id=spec.job_id, reason=e.reason)


def _redis_keys(spec: tp.TaskSpec, tm: str, e: tp.ClaimRedisKeys) -> Message:
    return RedisKeysClaimed(execution_id=spec.execution_id, job_id=spec.job_id, read=e.read, write=e.write)


# event type -> the message to the JobManager's stream (spec, taskmanager id, event)
FORWARDED: dict[type, Callable[[tp.TaskSpec, str, Any], Message]] = {
    tp.Progress: _progress,
    tp.Waiting: _waiting,
    tp.SnapshotTaken: _snapshot_taken,
    tp.SnapshotDeclined: _snapshot_declined,
    tp.ClaimRedisKeys: _redis_keys,
}

# event type -> (final state, failure cause, failure name)
ENDINGS: dict[type, Callable[[Any], tuple[ES, str | None, str | None]]] = {
    tp.Finished: lambda e: (ES.FINISHED, None, None),
    tp.Canceled: lambda e: (ES.CANCELED, None, None),
    tp.Failed: lambda e: (ES.FAILED, e.traceback, e.error_name),
}


READ_CHUNK = 64 * 1024


def bounded_lines(
    fd: int, max_bytes: int = tp.MAX_EVENT_LINE_BYTES, on_dropped: Callable[[int], None] = lambda n: None
) -> Iterator[bytes]:
    """The lines read from `fd` until EOF (with their newline; a last line without one too). A
    line longer than `max_bytes` is dropped as it is read, never held whole: `on_dropped` gets
    its length (counted to its newline or EOF), and the next line is read as usual."""
    buf = bytearray()
    dropping = 0  # > 0: the bytes of an over-long line seen so far; the rest of it is skipped
    while True:
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
            break
        start = 0
        while start < len(chunk):
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl + 1
            if dropping:
                dropping += end - start
            else:
                buf += chunk[start:end]
                if len(buf) > max_bytes:
                    dropping, buf = len(buf), bytearray()
            if nl >= 0:
                if dropping:
                    on_dropped(dropping)
                    dropping = 0
                elif buf:
                    yield bytes(buf)
                buf = bytearray()
            start = end
    if dropping:
        on_dropped(dropping)
    elif buf:
        yield bytes(buf)


def decoded_events(fd: int, driver_id: str) -> Iterator[Any]:
    """The events driver `driver_id` writes to `fd`, decoded, until EOF. A line too long or
    unreadable is logged and skipped: a garbled line must not stop the reader."""

    def dropped(n: int) -> None:
        log.warning(
            "driver %s sent an event line of %d bytes, above the %d a line may have: dropped unread",
            driver_id,
            n,
            tp.MAX_EVENT_LINE_BYTES,
        )

    for line in bounded_lines(fd, on_dropped=dropped):
        try:
            event = tp.decode_event(line)
        except Exception:  # noqa: BLE001 - a garbled line must not kill the reader
            log.warning("driver %s sent an unreadable event line: %r", driver_id, line[:200])
            continue
        yield event
