"""What the JobManager's rooms share: settings, the unit of work, the checkpoint coordinator, the
timers and the leader's epoch. Built once by the JobMaster and handed to each room."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.jobmanager.checkpoint_coordinator import CheckpointCoordinator
    from services.jobmanager.timers import Timers
    from services.jobmanager.unit_of_work import UnitOfWork
    from shared.clock import Clock
    from shared.settings import Settings


@dataclass(frozen=True)
class Context:
    settings: "Settings"
    uow: "UnitOfWork"
    checkpoints: "CheckpointCoordinator"
    timers: "Timers"
    epoch: int
    # Failure times stored in the catalog are read by the next leader, on another host:
    # wall-clock seconds there, the injected clock in tests.
    restart_clock: "Clock"
