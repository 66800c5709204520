"""The no-op task kind: reports its states, sleeps, and optionally fails, with no Spark at all,
so the control plane can be tested and benchmarked at scale. One timer thread serves every
no-op task of the process (thousands of simulated tasks cost no threads of their own).

Config keys (job `config`): `noop.duration` seconds or a duration such as "2 s" (default 1;
< 0 runs until cancelled), `noop.fail-attempts` fail attempts numbered below this (default 0),
`noop.fail-message`, `noop.startup-delay` (default 0: the task stays INITIALIZING this long, like
a pipeline whose import or build() is slow, and is subject to the start-up timeout).
The dispatcher refuses values these cannot read (services/dispatcher/job_config.py); a value
that gets here anyway fails the attempt with `InvalidTaskConfig` naming the option.

What a TaskManager does for a no-op task (kind "noop", `NoopTasks`): no driver process; its state
changes come from NoopRunner's timers, its snapshots are the metadata alone. The supervisor hands
every no-op task there and decides that in one place (TaskSupervisor._noop_of).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from services.taskmanager.tasks.held_reports import HeldReports
from services.taskmanager.tasks.record import Task
from shared import job_options, streams
from shared import task_protocol as tp
from shared.errors import ConfigError
from shared.ids import TaskManagerId
from shared.messages import CheckpointAcknowledged, TriggerCheckpoint
from shared.states import ExecutionState as ES
from shared.task_protocol import TaskSpec
from shared.transport.base import Transport

NOOP_KIND = "noop"


class InvalidTaskConfig(ConfigError, ValueError):
    """A job option the task cannot read."""


class NoopTask(Protocol):
    """What the runner needs of a task (the supervisor's Task, tasks/record.py, is one)."""

    spec: TaskSpec
    cancel_requested: bool


def _seconds(cfg: Mapping[str, Any], key: str, default: float, *, allow_negative: bool = False) -> float:
    raw = cfg.get(key, default)
    try:
        return job_options.noop_seconds(raw, allow_negative=allow_negative)
    except ValueError:
        raise InvalidTaskConfig(f'{key}: expected seconds or a duration such as "2 s", got {raw!r}') from None


def _count(cfg: Mapping[str, Any], key: str) -> int:
    raw = cfg.get(key, 0)
    try:
        if isinstance(raw, bool):
            raise ValueError
        return int(raw)
    except (TypeError, ValueError):
        raise InvalidTaskConfig(f"{key}: expected an integer, got {raw!r}") from None


class NoopRunner:
    def __init__(self):
        self._heap: list[tuple[float, int, NoopTask, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stop = False
        threading.Thread(target=self._loop, name="noop-tasks", daemon=True).start()

    def start(
        self,
        task: NoopTask,
        report: Callable[[Any, ES, str | None], None],
        *,
        startup_timeout_s: float | None = None,
        on_startup_timeout: Callable[[Any], None] | None = None,
    ) -> None:
        """Raises InvalidTaskConfig, before reporting anything, for an option it cannot read. A
        task still starting after `startup_timeout_s` is handed to `on_startup_timeout(task)`,
        as a Spark task stuck in its pipeline's build() is."""
        cfg = task.spec.config
        duration = _seconds(cfg, "noop.duration", 1.0, allow_negative=True)
        delay = _seconds(cfg, "noop.startup-delay", 0.0)
        fails = task.spec.attempt < _count(cfg, "noop.fail-attempts")
        cause = str(cfg.get("noop.fail-message", f"no-op task failed on request (attempt {task.spec.attempt})"))
        report(task, ES.INITIALIZING, None)
        now = time.monotonic()
        if startup_timeout_s is not None and on_startup_timeout is not None and delay > startup_timeout_s:
            self._at(now + startup_timeout_s, task, lambda: on_startup_timeout(task))
            return

        def running() -> None:
            report(task, ES.RUNNING, None)
            if duration >= 0:
                self._at(
                    time.monotonic() + duration,
                    task,
                    lambda: report(task, ES.FAILED if fails else ES.FINISHED, cause if fails else None),
                )

        if delay > 0:
            self._at(now + delay, task, running)
        else:
            running()

    def cancel(self, task: NoopTask) -> None:
        # The task itself carries the verdict (`cancel_requested`), not a set of ids: ids of
        # collected objects are reused, and a remembered id once silenced an unrelated new task.
        task.cancel_requested = True

    def _at(self, when: float, task: NoopTask, action: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._heap, (when, next(self._seq), task, action))
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cv.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                if self._stop:
                    return
                _, _, task, action = heapq.heappop(self._heap)
                if task.cancel_requested:
                    continue
            try:
                action()
            except Exception:  # a Redis hiccup must not stop every no-op task
                logging.getLogger("headrace.taskmanager.noop").exception("no-op report failed; retrying in 1 s")
                self._at(time.monotonic() + 1.0, task, action)

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()


class NoopTasks:
    def __init__(
        self,
        runner: NoopRunner,
        *,
        taskmanager_id: TaskManagerId,
        transport: Transport,
        reports: HeldReports,
        on_state: Callable[[Task, ES, str | None], None],
        on_startup_timeout: Callable[[Task], None],
        finish: Callable[[Task, ES], None],
        decline: Callable[[TriggerCheckpoint, str], None],
    ) -> None:
        self.runner, self.taskmanager_id, self.transport, self.reports = runner, taskmanager_id, transport, reports
        self.on_state, self.on_startup_timeout, self.finish, self.decline = (
            on_state,
            on_startup_timeout,
            finish,
            decline,
        )

    def start(self, task: Task) -> None:
        # A no-op task reports INITIALIZING and RUNNING within this call: one round trip
        # to Redis for both (or for a whole burst of deploys, see tasks/held_reports.py).
        with self.reports.hold():
            self.runner.start(
                task,
                self.on_state,
                startup_timeout_s=task.startup_timeout_s,
                on_startup_timeout=self.on_startup_timeout,
            )

    def cancel(self, task: Task) -> None:
        self.runner.cancel(task)
        self.finish(task, ES.CANCELED)

    def snapshot(self, task: Task, cmd: TriggerCheckpoint) -> None:
        """A no-op task has no state: its snapshot is the metadata alone."""
        from shared import checkpoint_storage as storage

        started = time.monotonic()
        try:
            info = storage.take_empty_snapshot(
                Path(cmd.target),
                metadata=tp.snapshot_metadata(task.spec, kind=cmd.kind, checkpoint_id=cmd.checkpoint_id),
            )
        except Exception as exc:  # noqa: BLE001 - any failure is a decline with its reason
            self.decline(cmd, f"{type(exc).__name__}: {exc}")
            return
        self.transport.publish(
            streams.JM_STREAM,
            CheckpointAcknowledged(
                job_id=cmd.job_id,
                execution_id=cmd.execution_id,
                taskmanager_id=self.taskmanager_id,
                checkpoint_id=cmd.checkpoint_id,
                path=info.path,
                batch_id=info.batch_id,
                state_size=info.state_size,
                duration_ms=int((time.monotonic() - started) * 1000),
            ),
        )
        if cmd.stop_after:
            self.runner.cancel(task)
            self.finish(task, ES.FINISHED)
