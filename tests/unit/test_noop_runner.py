"""The no-op task runner's timers, with stand-in tasks (no TaskManager, no Redis)."""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass, field

from services.taskmanager.tasks.noop import NoopRunner
from shared.states import ExecutionState as ES


@dataclass
class _Spec:
    config: dict
    attempt: int = 0


@dataclass
class _Task:
    spec: _Spec
    cancel_requested: bool = False
    seen: list = field(default_factory=list)


def _run(runner, duration, reports, done):
    task = _Task(_Spec({"noop.duration": duration}))

    def report(t, state, cause):
        reports.append((id(t), state))
        if state.is_terminal:
            done.set()

    runner.start(task, report)
    return task


def test_a_cancelled_endless_task_never_silences_a_later_task():
    # Regression: cancellations were remembered by id(task); once the cancelled task was garbage
    # collected, a new task at the same address lost its FINISHED report and its job hung RUNNING.
    runner = NoopRunner()
    try:
        for _ in range(15):  # gc makes the next task reuse the address within a few rounds
            reports, done = [], threading.Event()
            endless = _run(runner, -1, reports, threading.Event())
            endless.cancel_requested = True
            runner.cancel(endless)
            del endless
            gc.collect()
            _run(runner, 0.0, reports, done)
            assert done.wait(2), reports
            assert reports[-1][1] == ES.FINISHED
    finally:
        runner.shutdown()


def test_a_cancelled_task_with_a_pending_timer_reports_nothing_more():
    runner = NoopRunner()
    try:
        reports, done = [], threading.Event()
        task = _run(runner, 0.2, reports, done)
        task.cancel_requested = True
        runner.cancel(task)
        assert not done.wait(0.6)
        assert [s for _, s in reports] == [ES.INITIALIZING, ES.RUNNING]
    finally:
        runner.shutdown()
