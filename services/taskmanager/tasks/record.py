"""What a TaskManager keeps of one task it runs: its spec, the slots it holds, its driver and
where it stands. The supervisor's lock guards every field (supervisor.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from services.taskmanager.drivers.process import DriverProcess
from services.taskmanager.tasks.startup import DEFAULT_STARTUP_TIMEOUT_S
from shared import task_protocol as tp
from shared.ids import AllocationId
from shared.states import ExecutionState as ES


@dataclass
class Task:
    spec: tp.TaskSpec
    allocation_id: AllocationId
    slots: tuple[int, ...]
    state: ES = ES.DEPLOYING
    driver: DriverProcess | None = None
    cancel_requested: bool = False
    reported_terminal: bool = False
    handed_over: bool = False
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    startup_timer: threading.Timer | None = None
