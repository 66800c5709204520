"""The start-up timeout of a task (`headrace.task.startup-timeout`): how long a task may take to
become RUNNING after its driver got it, and the failure cause that says where it was stuck."""

from __future__ import annotations

import threading

from shared import job_options

STARTUP_TIMEOUT_OPTION = job_options.STARTUP_TIMEOUT
DEFAULT_STARTUP_TIMEOUT_S = 300.0
STARTUP_TIMEOUT_NAME = "PipelineStartupTimeout"
STACK_DUMP_WAIT_S = 1.0  # for the driver to write its thread dump before it is killed
# A driver still not ready this long after it got a task is stuck (a cold one takes ~10-30 s);
# the warm pool gives its own drivers as long (WarmPool.ready_timeout_s).
DRIVER_START_TIMEOUT_S = 120.0


def startup_timeout_s(config: dict, default_s: float) -> float:
    """The job's `headrace.task.startup-timeout`, else the cluster's (shared/job_options.py)."""
    value = job_options.startup_timeout_s(config, default_s)
    return value if 0 < value < threading.TIMEOUT_MAX else default_s


def startup_timeout_cause(timeout_s: float, phase: str, where: str = "", advice: str | None = None) -> str:
    """The failure cause of an attempt that did not start in time."""
    advice = advice or f"If it needs longer, raise the job option {STARTUP_TIMEOUT_OPTION} (e.g. \"10 min\")"
    text = f"the pipeline did not start within {timeout_s:g} s: it was still {phase}; the task was stopped. {advice}."
    return f"{text}\n{where}" if where else text
