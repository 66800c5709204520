"""What a driver asks its TaskManager for while its task runs: a files sink's directory
(services/taskmanager/tasks/sink_claims.py), a view of a snapshot of its lineage it was not given
(tasks/storage.py). A request goes out as an event, its answer comes back on stdin
(shared/task_protocol.py ClaimDirectory / ViewSnapshot / Granted), and the caller waits for it,
bounded by ANSWER_TIMEOUT_S. Redis streams for the task's lineage go further, to the JobManager
(ClaimRedisKeys), and are answered in the task's Redis connection (connectors/redis_key_access.py).

The driver process runs one task, so there is one channel per process (`install`, by the
Driver); without one (a sink used outside a TaskManager's driver: tests, tools) a sink keeps its
records in its directory as before, and a snapshot is read where it is.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any

from shared.errors import TaskError
from shared.task_protocol import ClaimDirectory, ClaimRedisKeys, Granted, ViewSnapshot, Waiting

ANSWER_TIMEOUT_S = 120.0


class ClaimFailed(TaskError, RuntimeError):
    """The TaskManager refused a request for a reason other than a sink's ownership or fence."""


class Grants:
    def __init__(self, emit: Any, timeout_s: float = ANSWER_TIMEOUT_S):
        self.emit, self.timeout_s = emit, timeout_s
        self._ids = itertools.count(1)
        self._waiting: dict[int, queue.Queue[Granted]] = {}
        self._lock = threading.Lock()

    def claim_directory(self, path: str, *, kind: str, attempt: int = 0, restored_batch_id: int = -1) -> str:
        """The record path of `path` once the TaskManager handed it over; raises what it refused
        with (SinkOwnedError, SinkFencedError, ClaimFailed) or TimeoutError."""
        return self._ask(
            lambda rid: ClaimDirectory(
                request_id=rid, path=path, kind=kind, attempt=attempt, restored_batch_id=restored_batch_id
            ),
            f"the directory {path}",
        )

    def view_of(self, snapshot: str) -> str:
        """A path this task may read the snapshot `snapshot` at (ClaimFailed when it is not its
        lineage's)."""
        return self._ask(lambda rid: ViewSnapshot(request_id=rid, path=snapshot), f"a view of {snapshot}")

    def claim_redis_keys(self, *, read: tuple[str, ...], write: tuple[str, ...]) -> None:
        """Ask for Redis streams for the task's lineage (services/jobmanager/redis_key_claims.py).
        Nothing answers here: the grant shows in the task's own Redis connection, a refusal as
        the attempt being failed."""
        self.emit(ClaimRedisKeys(read=read, write=write))

    def waiting(self, reason: str | None) -> None:
        """What the task waits for meanwhile (the attempt's waiting-reason), None once it goes on."""
        self.emit(Waiting(reason=reason))

    def _ask(self, make: Any, what: str) -> str:
        request_id = next(self._ids)
        answer: queue.Queue[Granted] = queue.Queue(maxsize=1)
        with self._lock:
            self._waiting[request_id] = answer
        try:
            self.emit(make(request_id))
            try:
                reply = answer.get(timeout=self.timeout_s)
            except queue.Empty:
                raise TimeoutError(
                    f"the TaskManager did not answer the request for {what} within {self.timeout_s:.0f} s"
                ) from None
        finally:
            with self._lock:
                self._waiting.pop(request_id, None)
        if reply.error_name is None:
            return reply.path
        raise _refusal(reply)

    def answer(self, reply: Granted) -> None:
        """An answer from stdin (the driver's command reader), to its waiting request."""
        with self._lock:
            waiting = self._waiting.get(reply.request_id)
        if waiting is not None:
            waiting.put_nowait(reply)


def _refusal(reply: Granted) -> Exception:
    from .connectors.ownership import SinkOwnedError
    from .connectors.sinks import SinkFencedError

    try:
        if reply.error_name == "SinkOwnedError":
            return SinkOwnedError(*reply.error_args)
        if reply.error_name == "SinkFencedError":
            return SinkFencedError(*reply.error_args)
    except TypeError:
        pass
    return ClaimFailed(f"{reply.error_name}: {reply.error}")


_current: Grants | None = None


def install(grants: Grants | None) -> None:
    global _current
    _current = grants


def current() -> Grants | None:
    return _current


def readable(snapshot: str) -> str:
    """Where this task may read `snapshot`: a view the TaskManager makes, or the path itself
    outside a TaskManager's driver."""
    channel = current()
    return channel.view_of(snapshot) if channel is not None else snapshot
