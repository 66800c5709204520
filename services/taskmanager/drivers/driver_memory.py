"""The memory of one Spark driver's processes: the limit its task may hold (memory/limit.py, as
the sandbox bounds it), the watch over the processes from the hand-over on, the figure the watch
last read (for the dashboard, memory/task_memory.py), and the check the warm pool makes of a
driver waiting for a task. Every figure is the PSS sum of the driver's processes (memory/measure.py)
or its cgroup's charge."""

from __future__ import annotations

from typing import Callable

from services.taskmanager.drivers.sandbox import DriverSandbox
from services.taskmanager.drivers.task_processes import TaskProcesses, rss_bytes
from services.taskmanager.memory import limit as memory_limit
from services.taskmanager.memory.measure import Sample, pss_sample
from shared import task_protocol as tp


class DriverMemory:
    def __init__(
        self, processes: TaskProcesses, sandbox: DriverSandbox, *, name: str, on_exceeded: Callable[[str], None]
    ) -> None:
        """`on_exceeded(cause)`: the task's processes held more than its limit (the watch stops)."""
        self.processes, self.sandbox, self.name, self.on_exceeded = processes, sandbox, name, on_exceeded
        self._watch: memory_limit.MemoryWatch | None = None

    def task_limit(self, spec: tp.TaskSpec) -> int | None:
        """The limit of `spec`'s task (None: no limit). Raises MemoryLimitRefused for a job that
        asks for more than the operator allows."""
        return memory_limit.task_limit(spec.config, self.sandbox.memory_limit, self.sandbox.memory_limit_max)

    def watch(self, limit: int | None) -> None:
        """Watch the processes from now on (their figure is measured even without a limit)."""
        # The task's user is its own: the shared memory it owns is the task's (memory/shmem_usage.py).
        uid = self.processes.uid if self.sandbox.users.isolated else None
        self._watch = memory_limit.watch(self.processes, limit, uid=uid, on_exceeded=self.on_exceeded, name=self.name)

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def figure(self) -> tuple[Sample, int | None] | None:
        """The task's latest memory figure and its limit (None: no limit); None before the first."""
        watch = self._watch
        sample = watch.latest if watch is not None else None
        return (sample, watch.limit) if watch is not None and sample is not None else None

    def within(self, limit: int) -> bool:
        """Whether every process of the driver holds `limit` or less, PSS summed (the warm pool's
        measure, a task's too). The RSS sum answers first when it can: it bounds the PSS sum from
        above at a hundredth of the cost (a warm driver is checked as a task takes it)."""
        pids = self.processes.pids()
        return rss_bytes(pids) <= limit or pss_sample(pids).used <= limit
