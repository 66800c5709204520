"""The no-op task kind: reports its states, sleeps, and optionally fails, with no Spark at all,
so the control plane can be tested and benchmarked at scale. One timer thread serves every
no-op task of the process (thousands of simulated tasks cost no threads of their own).

Config keys (job `config`): `noop.duration` seconds or a duration such as "2 s" (default 1;
< 0 runs until cancelled), `noop.fail-attempts` fail attempts numbered below this (default 0),
`noop.fail-message`, `noop.startup-delay` (default 0: the task stays INITIALIZING this long, like
a pipeline whose import or build() is slow, and is subject to the start-up timeout).
The dispatcher refuses values these cannot read (services/dispatcher/job_config.py); a value
that gets here anyway fails the attempt with `InvalidTaskConfig` naming the option.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Any, Callable, Mapping, Protocol

from shared import job_options
from shared.errors import ConfigError
from shared.states import ExecutionState as ES
from shared.task_protocol import TaskSpec


class InvalidTaskConfig(ConfigError, ValueError):
    """A job option the task cannot read."""


class NoopTask(Protocol):
    """What the runner needs of a task (the supervisor's task_record.Task is one)."""

    spec: TaskSpec
    cancel_requested: bool


def _seconds(cfg: Mapping[str, Any], key: str, default: float, *, allow_negative: bool = False) -> float:
    raw = cfg.get(key, default)
    try:
        return job_options.noop_seconds(raw, allow_negative=allow_negative)
    except ValueError:
        raise InvalidTaskConfig(f"{key}: expected seconds or a duration such as \"2 s\", got {raw!r}") from None


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

    def start(self, task: NoopTask, report: Callable[[Any, ES, str | None], None], *,
              startup_timeout_s: float | None = None, on_startup_timeout: Callable[[Any], None] | None = None) -> None:
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
                self._at(time.monotonic() + duration, task,
                         lambda: report(task, ES.FAILED if fails else ES.FINISHED, cause if fails else None))

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

