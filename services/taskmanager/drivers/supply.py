"""Where a task's Spark driver comes from: a warm one from the pool when one fits, else a cold
one started for it; the pool kept topped up to the free slots, and its status published for
operators and benchmarks. A simulated TaskManager has no launch and starts no driver."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.taskmanager.drivers.process import DriverProcess
from services.taskmanager.drivers.sandbox import DriverSandbox
from services.taskmanager.drivers.warm_pool import DriverFactory, WarmPool
from shared import standby_shape, streams
from shared import task_protocol as tp
from shared.driver_contract import WARM_UP_BATCHES

log = logging.getLogger("headrace.taskmanager")

# What a driver tells its supervisor: each protocol event, and its exit code.
DriverEventHandler = Callable[[DriverProcess, Any], None]
DriverExitHandler = Callable[[DriverProcess, int], None]
# Options of a job that need a driver started with them: a warm driver was started without.
OWN_EXECUTOR_OPTIONS = ("spark.executor.cores", "spark.executor.memory")


@dataclass(frozen=True)
class DriverLaunch:
    """How a TaskManager starts its Spark driver processes (none for simulated TaskManagers)."""

    driver_memory: str
    shuffle_partitions: int
    engine_args: Callable[[dict | None], list[str]]  # a job's configuration -> the runner's arguments
    sandbox: DriverSandbox | None
    warm_up_query: bool = True  # Settings.warm_up_query: drivers in reserve run the warm-up query
    warm_up_batches: int = WARM_UP_BATCHES  # Settings.warm_up_batches: for that many micro-batches
    # The warm pool, given the supply's driver factory; None: every task gets a cold driver.
    warm_pool: Callable[[DriverFactory], WarmPool] | None = None
    # Warm drivers take the size of the tasks on the other TaskManagers (shared/standby_shape.py):
    # where a driver serves only its own parallelism and no warm_parallelism is set.
    follow_standby: bool = False


class DriverSupply:
    def __init__(
        self,
        launch: DriverLaunch | None,
        *,
        taskmanager_id: str,
        workdir: Path,
        on_event: DriverEventHandler,
        on_exit: DriverExitHandler,
        status_client: Any,
    ) -> None:
        self.launch, self.taskmanager_id, self.workdir = launch, taskmanager_id, workdir
        self.on_event, self.on_exit, self.status_client = on_event, on_exit, status_client
        self.warm = launch.warm_pool(self.new_driver) if launch is not None and launch.warm_pool else None

    def for_task(self, spec: tp.TaskSpec) -> tuple[DriverProcess, str]:
        """A driver for `spec` and how it came ("a warm", "a starting warm", "a cold")."""
        own_executors = any(k in (spec.config or {}) for k in OWN_EXECUTOR_OPTIONS)
        driver = self.warm.take(spec.parallelism) if self.warm and not own_executors else None
        if driver is not None:
            return driver, "a warm" if driver.ready.is_set() else "a starting warm"
        return self.new_driver(spec.parallelism, for_task=True, config=spec.config), "a cold"

    def new_driver(self, parallelism: int, for_task: bool = False, config: dict | None = None) -> DriverProcess:
        """A started driver process; `for_task`: a task waits for it (no warm-up query first)."""
        launch = self.launch
        if launch is None:
            raise RuntimeError(f"{self.taskmanager_id} is simulated: it runs no-op tasks only")
        return DriverProcess(
            parallelism=parallelism,
            workdir=self.workdir / "drivers",
            driver_memory=launch.driver_memory,
            shuffle_partitions=launch.shuffle_partitions,
            on_event=self.on_event,
            on_exit=self.on_exit,
            engine_args=launch.engine_args(config),
            warm_up=not for_task,
            warm_up_query=launch.warm_up_query,
            warm_up_batches=launch.warm_up_batches,
            sandbox=launch.sandbox,
        ).start()

    def forget(self, driver: DriverProcess) -> None:
        if self.warm:
            self.warm.forget(driver)

    def replenish(self, free_slots: int) -> None:
        if self.warm is not None:
            self.warm.replenish(free_slots)
            self.publish_status()

    def follow_standby_shape(self, slots: int) -> None:
        """Warm drivers of the size the other TaskManagers' tasks run at, as the ResourceManager
        last published them (shared/standby_shape.py); only where set by `follow_standby`."""
        if self.warm is None or self.status_client is None or self.launch is None or not self.launch.follow_standby:
            return
        try:
            raw = self.status_client.get(streams.RM_STATS_KEY)
            published = json.loads(raw).get(standby_shape.TASK_SLOTS) if raw else None
            wanted = (
                standby_shape.standby_parallelism(published, self.taskmanager_id, slots)
                if isinstance(published, dict)
                else None
            )
        except Exception:  # best effort (Redis away, a stats value not of this shape): keep the pool's shape
            log.debug("could not read the task sizes from the ResourceManager's stats", exc_info=True)
            return
        if wanted is not None:
            self.warm.retarget(wanted)

    def publish_status(self) -> None:
        """For operators and benchmarks: how many warm drivers are ready right now."""
        if self.warm is None or self.status_client is None:
            return
        try:
            self.status_client.set(streams.tm_warm_key(self.taskmanager_id), json.dumps(self.warm.status()), ex=60)
        except Exception:  # status is best effort
            log.debug("could not publish warm status", exc_info=True)

    def shutdown(self) -> None:
        if self.warm:
            self.warm.shutdown()
