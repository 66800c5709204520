"""The no-op task kind: reports its states, sleeps, and optionally fails, with no Spark at all,
so the control plane can be tested and benchmarked at scale. One timer thread serves every
no-op task of the process (thousands of simulated tasks cost no threads of their own).

Config keys (job `config`): `noop.duration` seconds (default 1; < 0 runs until cancelled),
`noop.fail-attempts` fail attempts numbered below this (default 0), `noop.fail-message`.
"""

from __future__ import annotations

import heapq
import logging
import itertools
import threading
import time
from typing import Callable

from shared.states import ExecutionState as ES


class NoopRunner:
    def __init__(self):
        self._heap: list[tuple[float, int, object, Callable]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stop = False
        threading.Thread(target=self._loop, name="noop-tasks", daemon=True).start()

    def start(self, task, report: Callable) -> None:
        cfg = task.spec.config
        duration = float(cfg.get("noop.duration", 1.0))
        fails = task.spec.attempt < int(cfg.get("noop.fail-attempts", 0))
        report(task, ES.INITIALIZING, None)
        report(task, ES.RUNNING, None)
        if duration < 0:
            return
        cause = str(cfg.get("noop.fail-message", f"no-op task failed on request (attempt {task.spec.attempt})"))
        self._at(time.monotonic() + duration, task,
                 lambda: report(task, ES.FAILED if fails else ES.FINISHED, cause if fails else None))

    def cancel(self, task) -> None:
        # The task itself carries the verdict (`cancel_requested`), not a set of ids: ids of
        # collected objects are reused, and a remembered id once silenced an unrelated new task.
        task.cancel_requested = True

    def _at(self, when: float, task, action: Callable) -> None:
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
            except Exception:  # noqa: BLE001 - a Redis hiccup must not stop every no-op task
                logging.getLogger("headrace.taskmanager.noop").exception("no-op report failed; retrying in 1 s")
                self._at(time.monotonic() + 1.0, task, action)

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
