"""The parallelism a TaskManager's warm drivers take where a driver serves only tasks of its own
parallelism: on a Spark standalone cluster a driver's cores (spark.cores.max, the executors
dynamic allocation may ask for) are fixed when its SparkContext starts.

A warm driver is there for the task that fails over to this TaskManager, and that task is one
running on another TaskManager now. So the ResourceManager publishes, with its stats
(streams.RM_STATS_KEY, field TASK_SLOTS), how many slots each TaskManager's allocations hold, and
each TaskManager warms drivers of the most common size among the others' tasks that it can hold
(the larger one on a tie). Without it, a TaskManager of 2 slots kept a warm driver of 2 while
the task that failed over to it ran at 1, and started a cold driver for it: 16-19 s to RUNNING
in the compose stack, against about 1.3 s with a driver that fits (issue 42.8).

Pure: the ResourceManager and the TaskManager's driver supply both use it.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Protocol, Sequence

TASK_SLOTS = "task_slots"


class Placed(Protocol):
    @property
    def taskmanager_id(self) -> str: ...

    @property
    def indices(self) -> tuple[int, ...]: ...


def task_slots(allocations: Iterable[Placed]) -> dict[str, list[int]]:
    """Per TaskManager, the slot count of each allocation it holds, largest first."""
    out: dict[str, list[int]] = {}
    for a in allocations:
        out.setdefault(str(a.taskmanager_id), []).append(len(a.indices))
    return {tm: sorted(sizes, reverse=True) for tm, sizes in out.items()}


def standby_parallelism(slots_by_taskmanager: Mapping[str, Sequence[int]], own_id: str, slots: int) -> int | None:
    """The warm parallelism for TaskManager `own_id` of `slots` slots: the most common size among
    the other TaskManagers' tasks that fits here, the larger on a tie; None if there is none."""
    sizes = Counter(
        p
        for tm, ps in slots_by_taskmanager.items()
        if tm != own_id and isinstance(ps, list)
        for p in ps
        if isinstance(p, int) and 1 <= p <= slots
    )
    if not sizes:
        return None
    return max(sizes, key=lambda p: (sizes[p], p))
