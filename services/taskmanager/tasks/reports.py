"""What one TaskManager tells the JobManager about its tasks: their state changes (held while a
burst of commands is handled, tasks/held_reports.py), the snapshots it declines without asking a
driver, and the driver events forwarded as messages of their own (drivers/events.py), whose
progress the TaskManager's metrics record too."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from services.taskmanager.drivers.events import FORWARDED
from services.taskmanager.tasks.held_reports import HeldReports
from shared import streams
from shared import task_protocol as tp
from shared.ids import ExecutionId, JobId, TaskManagerId
from shared.messages import CheckpointDeclined, TaskStateChanged, TriggerCheckpoint
from shared.states import ExecutionState as ES
from shared.transport.base import Transport

if TYPE_CHECKING:
    from services.taskmanager.metrics import TaskMetrics

log = logging.getLogger("headrace.taskmanager")


class TaskReports:
    def __init__(
        self, *, taskmanager_id: TaskManagerId, transport: Transport, held: HeldReports, metrics: TaskMetrics | None
    ) -> None:
        self.taskmanager_id, self.transport, self.held, self.metrics = taskmanager_id, transport, held, metrics

    def state(self, spec: tp.TaskSpec, state: ES, *, cause: str | None = None, name: str | None = None) -> None:
        self.held.publish(
            streams.JM_STREAM,
            TaskStateChanged(
                execution_id=spec.execution_id,
                job_id=spec.job_id,
                taskmanager_id=self.taskmanager_id,
                state=state,
                failure_cause=cause,
                failure_name=name,
            ),
        )

    def canceled_elsewhere(self, execution_id: ExecutionId, job_id: JobId) -> None:
        """A task to cancel that is not running here (finished meanwhile, or lost with a
        predecessor process): answered anyway, so a job waiting in CANCELLING can end."""
        self.transport.publish(
            streams.JM_STREAM,
            TaskStateChanged(
                execution_id=execution_id, job_id=job_id, taskmanager_id=self.taskmanager_id, state=ES.CANCELED
            ),
        )

    def declined(self, cmd: TriggerCheckpoint, reason: str) -> None:
        log.warning("declining checkpoint %d of %s: %s", cmd.checkpoint_id, cmd.execution_id, reason)
        self.transport.publish(
            streams.JM_STREAM,
            CheckpointDeclined(
                job_id=cmd.job_id,
                execution_id=cmd.execution_id,
                taskmanager_id=self.taskmanager_id,
                checkpoint_id=cmd.checkpoint_id,
                reason=reason,
            ),
        )

    def forwarded(self, spec: tp.TaskSpec, event: Any) -> bool:
        """Send a driver event that is a message of its own; False for any other event."""
        forward = FORWARDED.get(type(event))
        if forward is None:
            return False
        if isinstance(event, tp.Progress) and self.metrics is not None:
            self.metrics.progress(self.taskmanager_id, spec, event)
        self.transport.publish(streams.JM_STREAM, forward(spec, self.taskmanager_id, event))
        return True

    def ended(self, spec: tp.TaskSpec, state: ES, *, cause: str | None = None, name: str | None = None) -> None:
        """The task's last report: its metrics series end with it."""
        if self.metrics is not None:
            self.metrics.forget(self.taskmanager_id, spec)
        self.state(spec, state, cause=cause, name=name)
