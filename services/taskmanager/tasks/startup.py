"""The start-up timeout of a task (`headrace.task.startup-timeout`): how long a task may take to
become RUNNING after its driver got it, and the failure cause that says where it was stuck.

The start-up timer of each task (`StartupWatch`): a task that is not RUNNING that long after
its driver got it, or whose driver is still not ready within that timeout (at least
MIN_DRIVER_START_TIMEOUT_S) after it was handed the task, fails with where it was stuck (the
driver's thread dump or its last log lines) and its driver is killed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from services.taskmanager.drivers.startup_report import STARTUP_LOG_LINES, startup_report
from shared import job_options

if TYPE_CHECKING:  # the task record imports this module's default
    from services.taskmanager.tasks.record import Task

log = logging.getLogger("headrace.taskmanager")

STARTUP_TIMEOUT_OPTION = job_options.STARTUP_TIMEOUT
DEFAULT_STARTUP_TIMEOUT_S = 300.0
STARTUP_TIMEOUT_NAME = "PipelineStartupTimeout"
# A driver handed a task gets the task's start-up timeout to become ready, but never less than
# this: a cold JVM takes ~10-30 s, and a job's short timeout is meant for its pipeline, not for
# the JVM (the warm pool gives its own drivers as long, WarmPool.ready_timeout_s).
MIN_DRIVER_START_TIMEOUT_S = 120.0
STACK_DUMP_WAIT_S = 1.0  # for the driver to write its thread dump before it is killed


def startup_timeout_s(config: dict, default_s: float) -> float:
    """The job's `headrace.task.startup-timeout`, else the cluster's (shared/job_options.py)."""
    value = job_options.startup_timeout_s(config, default_s)
    return value if 0 < value < threading.TIMEOUT_MAX else default_s


def startup_timeout_cause(timeout_s: float, phase: str, where: str = "", advice: str | None = None) -> str:
    """The failure cause of an attempt that did not start in time."""
    advice = advice or f'If it needs longer, raise the job option {STARTUP_TIMEOUT_OPTION} (e.g. "10 min")'
    text = f"the pipeline did not start within {timeout_s:g} s: it was still {phase}; the task was stopped. {advice}."
    return f"{text}\n{where}" if where else text


def driver_start_timeout_s(task_startup_timeout_s: float) -> float:
    """How long a driver handed a task may take to become ready: the task's start-up timeout
    (a job that allows its pipeline 10 minutes allows its JVM as long), at least the floor."""
    return max(MIN_DRIVER_START_TIMEOUT_S, task_startup_timeout_s)


class StartupWatch:
    def __init__(
        self, *, lock: threading.RLock, still_starting: Callable[[Task], bool], fail: Callable[[Task, str, str], None]
    ) -> None:
        """`lock`: the supervisor's; `still_starting(task)`: the task is neither RUNNING nor ended;
        `fail(task, failure name, cause)`: end it as FAILED."""
        self._lock, self._still_starting, self._fail = lock, still_starting, fail

    def arm(self, task: Task, timeout_s: float, *, waiting_for_driver: bool = False) -> None:
        """(Re)start the task's timer; `waiting_for_driver`: it runs until the driver is ready."""
        timer = threading.Timer(timeout_s, self.expired, args=(task, timeout_s, waiting_for_driver))
        timer.daemon = True
        with self._lock:
            previous, task.startup_timer = task.startup_timer, timer
        if previous is not None:
            previous.cancel()
        timer.start()

    def expired(self, task: Task, timeout_s: float | None = None, waiting_for_driver: bool = False) -> None:
        """The task is not RUNNING `timeout_s` after its driver got it (or its driver is still
        not ready): fail it with where it was, and stop it."""
        if not self._still_starting(task) or (waiting_for_driver and task.handed_over):
            return
        timeout_s = task.startup_timeout_s if timeout_s is None else timeout_s
        driver = task.driver
        advice = None
        if driver is None:  # a no-op task (noop.startup-delay)
            phase, where = "starting (a no-op task whose noop.startup-delay is longer)", ""
        elif not task.handed_over:
            phase = "waiting for its Spark driver process to start"
            advice = (
                "The driver's JVM or Spark did not come up: see its log (memory, Java, Spark install); "
                f"if the machine is only slow, raise the job option {STARTUP_TIMEOUT_OPTION}"
            )
            where = f"The driver's last log lines ({driver.log_path}):\n{driver.log_tail(40)}"
        else:
            driver.dump_stacks()  # into its log, read below
            time.sleep(STACK_DUMP_WAIT_S)
            reported_phase, logged = startup_report(driver.log_tail(STARTUP_LOG_LINES))
            phase = reported_phase or "importing or building the pipeline"
            where = f"Where it was (the driver's thread dump and log since, from {driver.log_path}):\n{logged}"
        with self._lock:
            if not self._still_starting(task):
                return  # it started while the stacks were dumped
            # Its driver's exit is this failure, not another one; a no-op task's timers stop.
            task.cancel_requested = True
        log.warning(
            "task %s (job %s attempt %d) did not start within %g s; stopping it",
            task.spec.execution_id,
            task.spec.job_id,
            task.spec.attempt,
            timeout_s,
        )
        self._fail(task, STARTUP_TIMEOUT_NAME, startup_timeout_cause(timeout_s, phase, where, advice))
        if driver is not None:
            driver.kill()
