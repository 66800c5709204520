"""What a TaskManager does for a no-op task (kind "noop", noop_task.py): no driver process; its
state changes come from NoopRunner's timers, its snapshots are the metadata alone. The
supervisor hands every no-op task here and decides that in one place (TaskSupervisor._noop_of)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from services.taskmanager.held_reports import HeldReports
from services.taskmanager.noop_task import NoopRunner
from services.taskmanager.task_record import Task
from shared import streams
from shared import task_protocol as tp
from shared.ids import TaskManagerId
from shared.messages import CheckpointAcknowledged, TriggerCheckpoint
from shared.states import ExecutionState as ES
from shared.transport.base import Transport

NOOP_KIND = "noop"


class NoopTasks:
    def __init__(self, runner: NoopRunner, *, taskmanager_id: TaskManagerId, transport: Transport, reports: HeldReports,
                 on_state: Callable[[Task, ES, str | None], None], on_startup_timeout: Callable[[Task], None],
                 finish: Callable[[Task, ES], None], decline: Callable[[TriggerCheckpoint, str], None]) -> None:
        self.runner, self.taskmanager_id, self.transport, self.reports = runner, taskmanager_id, transport, reports
        self.on_state, self.on_startup_timeout, self.finish, self.decline = (
            on_state,
            on_startup_timeout,
            finish,
            decline,
        )

    def start(self, task: Task) -> None:
        # A no-op task reports INITIALIZING and RUNNING within this call: one round trip
        # to Redis for both (or for a whole burst of deploys, see held_reports.py).
        with self.reports.hold():
            self.runner.start(task, self.on_state, startup_timeout_s=task.startup_timeout_s,
                              on_startup_timeout=self.on_startup_timeout)

    def cancel(self, task: Task) -> None:
        self.runner.cancel(task)
        self.finish(task, ES.CANCELED)

    def snapshot(self, task: Task, cmd: TriggerCheckpoint) -> None:
        """A no-op task has no state: its snapshot is the metadata alone."""
        from shared import checkpoint_storage as storage

        started = time.monotonic()
        try:
            info = storage.take_empty_snapshot(Path(cmd.target), metadata=tp.snapshot_metadata(
                task.spec, kind=cmd.kind, checkpoint_id=cmd.checkpoint_id))
        except Exception as exc:  # noqa: BLE001 - any failure is a decline with its reason
            self.decline(cmd, f"{type(exc).__name__}: {exc}")
            return
        self.transport.publish(streams.JM_STREAM, CheckpointAcknowledged(
            job_id=cmd.job_id, execution_id=cmd.execution_id, taskmanager_id=self.taskmanager_id,
            checkpoint_id=cmd.checkpoint_id, path=info.path, batch_id=info.batch_id, state_size=info.state_size,
            duration_ms=int((time.monotonic() - started) * 1000)))
        if cmd.stop_after:
            self.runner.cancel(task)
            self.finish(task, ES.FINISHED)
