"""A task's driver on a Spark standalone cluster: the Spark settings that map the task's parallelism
to executor cores, and the watch that fails the task when the cluster gives it no executors.

Executors come and go with the work (dynamic allocation with shuffle tracking; the standalone
master needs no external shuffle service for that): a warm driver waiting for a task holds no
executor, and a running task holds at most `parallelism` cores (spark.cores.max)."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from shared.errors import TaskError

# An executor idle this long goes back to the cluster; long enough to outlive the pause between
# two micro-batches of a busy streaming query, short enough that a finished warm-up frees it.
EXECUTOR_IDLE_TIMEOUT = "60s"


@dataclass(frozen=True)
class Engine:
    master: str = "local"
    executor_cores: int = 1
    executor_memory: str = "1g"
    executor_timeout_s: float = 300.0
    host: str = "127.0.0.1"  # where executors reach this driver

    @property
    def local(self) -> bool:
        return self.master == "local"

    def master_url(self, parallelism: int) -> str:
        return f"local[{parallelism}]" if self.local else self.master

    def spark_conf(self, parallelism: int) -> dict[str, str]:
        if self.local:
            return {}
        cores = max(1, min(self.executor_cores, parallelism))
        return {
            "spark.cores.max": str(parallelism),
            "spark.executor.cores": str(cores),
            "spark.executor.memory": self.executor_memory,
            "spark.dynamicAllocation.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.minExecutors": "0",
            "spark.dynamicAllocation.initialExecutors": "0",
            "spark.dynamicAllocation.maxExecutors": str(math.ceil(parallelism / cores)),
            "spark.dynamicAllocation.executorIdleTimeout": EXECUTOR_IDLE_TIMEOUT,
            "spark.dynamicAllocation.schedulerBacklogTimeout": "1s",
        }


class NoExecutors(TaskError, RuntimeError):
    """The Spark cluster gave this task no executor while it had work waiting."""


def executor_count(spark) -> int:
    """Executors registered with this driver (the driver's own block manager not counted)."""
    return max(0, spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1)


def waiting_work(spark) -> bool:
    return bool(spark.sparkContext.statusTracker().getActiveStageIds())


class ExecutorWatch:
    """Calls `on_starved(NoExecutors)` once when work has waited `timeout_s` with no executor."""

    def __init__(
        self, spark, engine: Engine, parallelism: int, on_starved: Callable[[NoExecutors], None], poll_s: float = 1.0
    ):
        self.spark, self.engine, self.parallelism = spark, engine, parallelism
        self.on_starved, self.poll_s = on_starved, poll_s
        self._stop = threading.Event()
        self.waiting_since: float | None = None

    def start(self) -> "ExecutorWatch":
        if not self.engine.local:
            threading.Thread(target=self._run, name="executor-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                starved = waiting_work(self.spark) and executor_count(self.spark) == 0
            except Exception:  # noqa: BLE001 - the session is stopping
                return
            now = time.monotonic()
            if not starved:
                self.waiting_since = None
                continue
            self.waiting_since = self.waiting_since or now
            if now - self.waiting_since >= self.engine.executor_timeout_s:
                e = self.engine
                executor_cores = min(e.executor_cores, self.parallelism)
                self.on_starved(
                    NoExecutors(
                        f"the Spark master {e.master} gave this task no executor within {e.executor_timeout_s:.0f} s "
                        f"(it asks for {self.parallelism} cores in executors of {executor_cores} "
                        f"cores and {e.executor_memory}): the cluster's workers are busy, gone, or too small; "
                        f"see the master's web UI, or lower the job's parallelism or spark.executor.memory"
                    )
                )
                return
