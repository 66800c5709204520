"""Each running task's latest memory figure beside its limit, where operators look: the dashboard's
TaskManager page ("memory 1.2 GB of 3.0 GB (PSS)"), from `streams.tm_memory_key`, which the
TaskManager rewrites every heartbeat and the dispatcher reads (GET /taskmanagers/{id}), and the
Prometheus series headrace_task_memory_bytes / headrace_task_memory_limit_bytes
(metrics.TaskManagerCollector).

The figures are the memory watch's own (memory/limit.py): nothing is measured for them. They go
through Redis, not the heartbeat's slot report: they change at every heartbeat, and the
ResourceManager, which records slot reports in the catalog when slots change, has no use for them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from shared import streams
from shared import task_protocol as tp

if TYPE_CHECKING:
    from services.taskmanager.drivers.process import DriverProcess

log = logging.getLogger("headrace.taskmanager.memory")


@dataclass(frozen=True)
class TaskMemory:
    execution_id: str
    job_id: str
    used: int  # bytes, by `measure`
    limit: int | None  # bytes; None: no limit ("off")
    measure: str  # measure.py's Sample.label(): "PSS", "PSS, RSS for 2", "cgroup charge"


def figures(task_drivers: list[tuple[tp.TaskSpec, DriverProcess]]) -> list[TaskMemory]:
    """The latest figure of each task whose driver measured one (supervisor.task_drivers())."""
    out = []
    for spec, driver in task_drivers:
        figure = driver.memory.figure()
        if figure is not None:
            sample, limit = figure
            out.append(TaskMemory(spec.execution_id, spec.job_id, sample.used, limit, sample.label()))
    return out


def publish(client: Any, taskmanager_id: str, figures: list[TaskMemory], *, ttl_s: float) -> None:
    """Best effort: the figures are for people; a TaskManager without tasks leaves its key to expire."""
    if client is None or not figures:
        return
    value = json.dumps({f.execution_id: {k: v for k, v in asdict(f).items() if k != "execution_id"} for f in figures})
    try:
        client.set(streams.tm_memory_key(taskmanager_id), value, px=max(1000, int(ttl_s * 1000)))
    except Exception:  # Redis away: the next heartbeat writes them again
        log.debug("could not publish the tasks' memory figures", exc_info=True)
