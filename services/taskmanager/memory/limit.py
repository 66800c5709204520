"""A memory limit per task: a task whose processes (driver, JVM, Python daemons and workers, and
anything the pipeline started) hold more than it is killed, and the task FAILS with
`MemoryLimitExceeded` through the normal failure path (the restart strategy applies).

The limit: the job option `headrace.task.memory-limit`, else the `driver_memory_limit` setting,
else driver_memory + 2g (the JVM's heap is driver_memory; its own overhead and Spark's Python
processes come on top: a busy streaming task with a 1g heap holds 1.6-2.3 GB). "off" turns the
cluster default off. A job's option is the pipeline author's, so it is bounded by the operator's
`driver_memory_limit_max` (default: the larger of the TaskManager's memory,
taskmanager_memory_bytes, and the cluster's default limit): a task asking for more, or for "off"
where the maximum is not "off" itself, is refused before its driver gets it
(`MemoryLimitRefused`).

How it is enforced and measured (memory/measure.py): with a memory controller in the driver's
cgroup v2 (drivers/task_processes.py), the kernel enforces memory.max on the cgroup's charge and
memory.events says when it killed; otherwise (no cgroup v2, or one without the memory
controller, as on a host whose memory controller is in cgroup v1) a watchdog sums the PSS of the
task's processes, pages shared between them counted once, and kills them when the sum is above
the limit. Never the plain RSS sum: it counts the pages Spark's forked Python workers share once
per worker (issue 42: tasks killed at 2.5 GB "used" that held 1.2 GB). The TaskManager logs which
applies; a failure cause names the measure and the figure, and the TaskManager page of the
dashboard shows each task's latest figure beside its limit. A warm driver waiting for a task is
bounded by the warm pool instead (warm_driver_max_rss_bytes), with the same PSS measure.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from services.taskmanager.memory.measure import PSS_REFRESH_S, CgroupMeter, Meter, ProcessMeter, Sample, pss_sample
from shared import job_options, sizes
from shared.errors import TaskError

if TYPE_CHECKING:
    from services.taskmanager.drivers.task_processes import TaskProcesses

log = logging.getLogger("headrace.taskmanager.memory")

OPTION = job_options.MEMORY_LIMIT
SETTING = "driver_memory_limit (HEADRACE_DRIVER_MEMORY_LIMIT)"
MAX_SETTING = "driver_memory_limit_max (HEADRACE_DRIVER_MEMORY_LIMIT_MAX)"
ALLOWANCE_BYTES = 2 * 1024**3
WATCH_INTERVAL_S = 0.25
NAME = "MemoryLimitExceeded"


def default_limit(setting: str | None, driver_memory: str) -> int | None:
    """The cluster's limit from the settings; raises ValueError naming the setting."""
    if setting is not None and str(setting).strip():
        try:
            return job_options.memory_limit_bytes(setting)
        except ValueError:
            raise ValueError(f'{SETTING} must be a size such as "3g" or "off", got {setting!r}') from None
    return sizes.parse_bytes(driver_memory, what="driver_memory") + ALLOWANCE_BYTES


UNBOUNDED = -1  # a maximum of "off": a job may set any limit, or none


class MemoryLimitRefused(TaskError, ValueError):
    """A job's headrace.task.memory-limit above what the cluster allows; the message says both."""


def maximum_limit(setting: str | None, *, default: int | None, taskmanager_memory: int) -> int:
    """The highest limit a job may set (UNBOUNDED: any, or "off"); raises ValueError naming the
    setting."""
    if setting is not None and str(setting).strip():
        try:
            value = job_options.memory_limit_bytes(setting)
        except ValueError:
            raise ValueError(f'{MAX_SETTING} must be a size such as "16g" or "off", got {setting!r}') from None
        return UNBOUNDED if value is None else value
    return max(taskmanager_memory, default or 0)


def task_limit(config: dict | None, default: int | None, maximum: int = UNBOUNDED) -> int | None:
    """The job's own limit if it sets one (the dispatcher checked its spelling), else the default;
    raises MemoryLimitRefused when the job asks for more than `maximum`, or for none while the
    cluster has a limit and a maximum."""
    raw = (config or {}).get(OPTION)
    if raw is None:
        return default
    try:
        limit = job_options.memory_limit_bytes(raw)
    except ValueError:
        return default
    if maximum == UNBOUNDED:
        return limit
    if limit is None and default is not None:
        raise MemoryLimitRefused(
            f"the job option {OPTION}={raw!r} turns the task's memory limit off, which this cluster does not "
            f'allow ({MAX_SETTING} is {gb(maximum)}, not "off"): set a size up to {gb(maximum)}, or ask the '
            f"operator to raise {MAX_SETTING}"
        )
    if limit is not None and limit > maximum:
        raise MemoryLimitRefused(
            f"the job option {OPTION}={raw!r} ({gb(limit)}) is above this cluster's maximum of {gb(maximum)} "
            f"({MAX_SETTING}): set a size up to {gb(maximum)}, or ask the operator to raise {MAX_SETTING}"
        )
    return limit


def gb(n: int) -> str:
    return f"{n / 1024**3:.1f} GB"


def cause(used: Sample, limit: int, *, by_kernel: bool = False) -> str:
    """A failure cause naming the figure, its measure and the limit, and what to change."""
    if by_kernel:
        what = (
            f"the task's processes reached {gb(used.used)} ({used.describe()}) at its limit of {gb(limit)} "
            f"({OPTION}); the kernel's OOM killer ended them at the cgroup's memory.max"
        )
    else:
        what = (
            f"the task's processes used {gb(used.used)} ({used.describe()}), above its limit of {gb(limit)} "
            f"({OPTION}); they were killed"
        )
    return (
        f"{what}. If the pipeline needs more, raise the job option {OPTION} (e.g. "
        f'"{max(1, -(-max(used.used, limit) // 1024**3) + 1)}g") or the cluster\'s {SETTING}; otherwise hold '
        f"less in build() and in each batch"
    )


class MemoryWatch:
    """Measures one task's memory until stopped (the latest figure in `latest`); with a limit,
    calls `on_exceeded(cause)` once it is exceeded, then stops. Without one it only measures, for
    the dashboard."""

    def __init__(
        self,
        *,
        limit: int | None,
        meter: Meter,
        on_exceeded: Callable[[str], None],
        interval_s: float = WATCH_INTERVAL_S,
    ):
        self.limit, self.meter, self.on_exceeded, self.interval_s = limit, meter, on_exceeded, interval_s
        self.latest: Sample | None = None
        self.peak = 0
        self._stop = threading.Event()

    def start(self, name: str) -> "MemoryWatch":
        threading.Thread(target=self._run, name=f"memory-{name}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                sample = self.meter.sample(self.limit)
                killed = self.meter.oom_kills() if self.limit is not None else 0
            except Exception:  # a failed sample is retried at the next interval
                log.debug("memory sample failed", exc_info=True)
                continue
            self.latest, self.peak = sample, max(self.peak, sample.used)
            if self.limit is None or not (killed or sample.used > self.limit):
                continue
            self._stop.set()
            if killed:
                # The kernel stopped the charge at the limit: its peak is the figure that says so.
                peak = self.meter.peak()
                self.on_exceeded(
                    cause(peak if peak is not None else replace(sample, used=self.peak), self.limit, by_kernel=True)
                )
            else:
                self.on_exceeded(cause(sample, self.limit))
            return


def watch(
    processes: "TaskProcesses", limit: int | None, *, uid: int | None, on_exceeded: Callable[[str], None], name: str
) -> MemoryWatch:
    """Start watching a task's processes. The kernel enforces the limit where the driver's cgroup
    has the memory controller (the watch then reads its charge), else the watch does, on their PSS
    (and, with `uid`, the task's own user, the shared memory it holds). Without a limit the task's
    memory is still measured, for the dashboard, less often."""
    meter: Meter = ProcessMeter(processes.pids, read_pss=functools.partial(pss_sample, uid=uid))
    cgroup = processes.cgroup
    if cgroup is not None and processes.memory_file("memory.max") is not None:
        try:
            if limit is not None:
                (cgroup / "memory.max").write_text(str(limit))
                oom_group = processes.memory_file("memory.oom.group")
                if oom_group is not None:
                    oom_group.write_text("1")  # the kernel kills the whole task, not one process of it
            meter = CgroupMeter(cgroup)
        except OSError:
            log.warning("could not set memory.max of driver %s; watching its PSS instead", name, exc_info=True)
    interval_s = WATCH_INTERVAL_S if limit is not None else PSS_REFRESH_S
    return MemoryWatch(limit=limit, meter=meter, on_exceeded=on_exceeded, interval_s=interval_s).start(name)
