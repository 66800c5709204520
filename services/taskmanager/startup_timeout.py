"""The start-up timeout of a task (`headrace.task.startup-timeout`): how long a task may take to
become RUNNING after its driver got it, and the failure cause that says where it was stuck."""

from __future__ import annotations

import threading

from shared import job_options

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
    advice = advice or f"If it needs longer, raise the job option {STARTUP_TIMEOUT_OPTION} (e.g. \"10 min\")"
    text = f"the pipeline did not start within {timeout_s:g} s: it was still {phase}; the task was stopped. {advice}."
    return f"{text}\n{where}" if where else text


def driver_start_timeout_s(task_startup_timeout_s: float) -> float:
    """How long a driver handed a task may take to become ready: the task's start-up timeout
    (a job that allows its pipeline 10 minutes allows its JVM as long), at least the floor."""
    return max(MIN_DRIVER_START_TIMEOUT_S, task_startup_timeout_s)
