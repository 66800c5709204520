"""A memory limit per task: a task whose processes (driver, JVM, Python daemons and workers, and
anything the pipeline started) hold more than it is killed, and the task FAILS with
`MemoryLimitExceeded` through the normal failure path (the restart strategy applies).

The limit: the job option `headrace.task.memory-limit`, else the `driver_memory_limit` setting,
else driver_memory + 2g (the JVM's heap is driver_memory; its own overhead and Spark's Python
processes come on top: a busy streaming task with a 1g heap holds 1.6-2.3 GB). "off" turns the
cluster default off.

How it is enforced: with a memory controller in the driver's cgroup (task_processes.py), the kernel
enforces memory.max and memory.events says when it killed; otherwise a watchdog sums the resident
memory of the task's processes every WATCH_INTERVAL_S and kills them when the sum is above the
limit (summed RSS counts pages shared after a fork in each process: a slight overestimate). The
TaskManager logs which one applies. A warm driver waiting for a task is bounded by the warm pool
instead (warm_driver_max_rss_bytes), with the same measure.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from shared import job_options, sizes

log = logging.getLogger("headrace.taskmanager.memory")

OPTION = job_options.MEMORY_LIMIT
SETTING = "driver_memory_limit (HEADRACE_DRIVER_MEMORY_LIMIT)"
ALLOWANCE_BYTES = 2 * 1024**3
WATCH_INTERVAL_S = 0.25
NAME = "MemoryLimitExceeded"


def default_limit(setting: str | None, driver_memory: str) -> int | None:
    """The cluster's limit from the settings; raises ValueError naming the setting."""
    if setting is not None and str(setting).strip():
        try:
            return job_options.memory_limit_bytes(setting)
        except ValueError:
            raise ValueError(f"{SETTING} must be a size such as \"3g\" or \"off\", got {setting!r}") from None
    return sizes.parse_bytes(driver_memory, what="driver_memory") + ALLOWANCE_BYTES


def task_limit(config: dict | None, default: int | None) -> int | None:
    """The job's own limit if it sets one (the dispatcher checked it), else the default."""
    raw = (config or {}).get(OPTION)
    if raw is None:
        return default
    try:
        return job_options.memory_limit_bytes(raw)
    except ValueError:
        return default


def gb(n: int) -> str:
    return f"{n / 1024**3:.1f} GB"


def cause(used: int, limit: int, how: str) -> str:
    return (f"the task's processes used {gb(used)}, above its limit of {gb(limit)} ({OPTION}; {how}); "
            f"they were killed. If the pipeline needs more, raise the job option {OPTION} (e.g. "
            f"\"{max(1, -(-used // 1024**3) + 1)}g\") or the cluster's {SETTING}; otherwise hold less in "
            f"build() and in each batch")


class MemoryWatch:
    """Checks one task's memory until stopped; calls `on_exceeded(cause)` once, then stops."""

    def __init__(self, *, limit: int, measure: Callable[[], int], on_exceeded: Callable[[str], None],
                 oom_events: Callable[[], int] | None = None, interval_s: float = WATCH_INTERVAL_S):
        self.limit, self.measure, self.on_exceeded = limit, measure, on_exceeded
        self.oom_events, self.interval_s = oom_events, interval_s
        self.peak = 0
        self._stop = threading.Event()

    def start(self, name: str) -> "MemoryWatch":
        threading.Thread(target=self._run, name=f"memory-{name}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        how = "the kernel's cgroup limit" if self.oom_events is not None else "summed resident memory"
        while not self._stop.wait(self.interval_s):
            try:
                used = self.measure()
                killed = self.oom_events() if self.oom_events is not None else 0
            except Exception:  # a failed sample is retried at the next interval
                log.debug("memory sample failed", exc_info=True)
                continue
            self.peak = max(self.peak, used)
            if killed or used > self.limit:
                self._stop.set()
                self.on_exceeded(cause(max(self.peak, self.limit + 1) if killed else used, self.limit, how))
                return
