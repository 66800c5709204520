"""The TaskManager's task supervisor: slots, running tasks, their driver processes, reports.

It owns the slot table of one TaskManager, turns DeployTask/CancelTask/TriggerCheckpoint commands
into driver process actions, maps driver events to ExecutionState reports and checkpoint
acknowledgements for the JobManager, and frees slots when an attempt ends. Celery command handlers
call `deploy`/`cancel` and return at once; everything long-running happens in driver processes and
their reader threads.

A task is reported INITIALIZING as soon as this TaskManager has taken it: that is the JobManager's
acknowledgement of the deploy, which must not wait for a cold Spark driver (~10-30 s) to start.

Start-up timeout: a task that is not RUNNING `headrace.task.startup-timeout` after its driver got
it (the pipeline hangs at import, in build(), or while its query starts) fails with
`PipelineStartupTimeout`: the driver dumps its threads' stacks into its log, the failure cause
says which phase it was in and where, and the driver is killed. The JobManager then treats it
like any other failure (restart strategy). A driver that is not ready within that timeout (at least 2 min) after
it was handed a task fails it the same way. A deploy that breaks before its task starts (an
option the task cannot read, a driver that cannot be started) fails the attempt and frees its
slots, rather than leaving it DEPLOYING.

Its rooms: tasks/record.py (what is kept of a task), tasks/slot_table.py (which allocation holds each
slot), drivers/supply.py (warm or cold drivers, the warm pool's upkeep), tasks/startup.py (the
start-up timers), tasks/driver_tasks.py (tasks in a Spark driver: the hand-over, cancel and
snapshot, the driver's events and exit), tasks/noop.py (tasks without a driver). One lock, this
class's, guards them all.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from services.taskmanager.drivers.process import DriverProcess
from services.taskmanager.drivers.supply import DriverLaunch, DriverSupply
from services.taskmanager.drivers.warm_pool import WarmPool
from services.taskmanager.tasks.driver_tasks import DriverTasks
from services.taskmanager.tasks.held_reports import HeldReports
from services.taskmanager.tasks.noop import NOOP_KIND, NoopRunner, NoopTasks
from services.taskmanager.tasks.record import Task
from services.taskmanager.tasks.reports import TaskReports
from services.taskmanager.tasks.slot_table import SlotTable
from services.taskmanager.tasks.startup import DEFAULT_STARTUP_TIMEOUT_S, StartupWatch, startup_timeout_s
from shared import task_protocol as tp
from shared.ids import ExecutionId, JobId, TaskManagerId
from shared.messages import DeployTask, SlotState, TaskReport, TriggerCheckpoint
from shared.states import ExecutionState as ES
from shared.transport.base import Transport

if TYPE_CHECKING:
    from services.taskmanager.metrics import TaskMetrics

log = logging.getLogger("headrace.taskmanager")


class TaskSupervisor:
    def __init__(
        self,
        *,
        taskmanager_id: TaskManagerId,
        slots: int,
        transport: Transport,
        workdir: Path,
        cancel_timeout_s: float,
        noop: NoopRunner,
        drivers: DriverLaunch | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        reports: HeldReports | None = None,
        metrics: TaskMetrics | None = None,
    ) -> None:
        self.taskmanager_id = taskmanager_id
        self.startup_timeout_s = startup_timeout_s
        self.noop = noop
        self.slots = SlotTable(slots)
        self.tasks: dict[ExecutionId, Task] = {}
        self._lock = threading.RLock()
        self.startup = StartupWatch(lock=self._lock, still_starting=self._still_starting, fail=self._fail)
        held = reports or HeldReports(transport)  # shared by the process's TaskManagers
        self.reports = TaskReports(taskmanager_id=taskmanager_id, transport=transport, held=held, metrics=metrics)
        self.driver_tasks = DriverTasks(
            lock=self._lock,
            tasks=self.tasks,
            reports=self.reports,
            startup=self.startup,
            cancel_timeout_s=cancel_timeout_s,
            finish=self._finish,
            on_warm_ready=self.publish_warm_status,
        )
        self.drivers = DriverSupply(
            drivers,
            taskmanager_id=taskmanager_id,
            workdir=workdir,
            on_event=self.driver_tasks.on_event,
            on_exit=self._on_driver_exit,
            status_client=transport.redis_client,
        )
        self.noop_tasks = NoopTasks(
            noop,
            taskmanager_id=taskmanager_id,
            transport=transport,
            reports=held,
            on_state=self._on_noop_state,
            on_startup_timeout=self.startup.expired,
            finish=self._finish,
            decline=self.reports.declined,
        )

    @property
    def warm(self) -> WarmPool | None:
        """The warm pool (services/taskmanager/drivers/warm_pool.py), None without one."""
        return self.drivers.warm

    def start(self) -> None:
        """Start warming up the drivers the free slots may want."""
        self._replenish()

    # --- commands ----------------------------------------------------------------------

    def deploy(self, cmd: DeployTask) -> None:
        spec = cmd.spec
        with self._lock:
            if spec.execution_id in self.tasks:
                return  # a redelivered command
            busy = self.slots.taken_by_others(cmd.slot_indices, cmd.allocation_id)
            if busy:
                self.reports.state(
                    spec,
                    ES.FAILED,
                    cause=f"slots {busy} of {self.taskmanager_id} are not free",
                    name="SlotOccupiedException",
                )
                return
            self.slots.take(cmd.slot_indices, cmd.allocation_id)
            task = Task(
                spec=spec,
                allocation_id=cmd.allocation_id,
                slots=tuple(cmd.slot_indices),
                startup_timeout_s=startup_timeout_s(spec.config, self.startup_timeout_s),
            )
            self.tasks[spec.execution_id] = task
        try:
            self._start(task)
        except Exception as exc:  # whatever broke, the attempt fails and frees its slots
            log.exception("task %s could not be started", spec.execution_id)
            with self._lock:
                task.cancel_requested = True
                driver = task.driver
            self._fail(task, type(exc).__name__, f"the task could not be started on {self.taskmanager_id}: {exc}")
            if driver is not None:
                driver.kill()

    def _start(self, task: Task) -> None:
        spec = task.spec
        noop = self._noop_of(task)
        if noop is not None:
            noop.start(task)
            return
        with self._lock:
            driver, kind = self.drivers.for_task(spec)
            driver.execution_id = spec.execution_id
            task.driver = driver
        self.driver_tasks.start(task, driver, kind)
        self._replenish()

    def cancel(self, execution_id: ExecutionId, job_id: JobId | None = None) -> None:
        with self._lock:
            task = self.tasks.get(execution_id)
            if task is None:
                if job_id:
                    self.reports.canceled_elsewhere(execution_id, job_id)
                return
            if task.reported_terminal:
                return
            task.cancel_requested = True
            noop = self._noop_of(task)
            if noop is not None:
                noop.cancel(task)
                return
            driver = task.driver
            task.state = ES.CANCELING
        if driver is not None:
            self.driver_tasks.cancel(execution_id, driver)

    def trigger_checkpoint(self, cmd: TriggerCheckpoint) -> None:
        """Hand a checkpoint or savepoint trigger to the task's driver (or take a no-op task's
        snapshot). Anything that cannot even reach a driver is declined, so the JobManager never
        waits for its timeout in silence."""
        with self._lock:
            task = self.tasks.get(cmd.execution_id)
            state = task.state if task else None
        if task is None or task.reported_terminal or task.cancel_requested:
            self.reports.declined(cmd, f"task {cmd.execution_id} is not running on {self.taskmanager_id}")
            return
        noop = self._noop_of(task)
        if noop is not None:
            noop.snapshot(task, cmd)
            return
        self.driver_tasks.snapshot(task, state, cmd)

    def _noop_of(self, task: Task) -> NoopTasks | None:
        """Where no-op tasks part from the others (the rest run in a driver, DriverTasks): every
        branch for them asks here."""
        return self.noop_tasks if task.spec.kind == NOOP_KIND else None

    # --- driver exits and no-op task states -------------------------------------------

    def _on_driver_exit(self, driver: DriverProcess, code: int) -> None:
        self.drivers.forget(driver)
        self.driver_tasks.on_exit(driver, code)
        self._replenish()

    def _on_noop_state(self, task: Task, state: ES, cause: str | None) -> None:
        if state.is_terminal:
            self._finish(task, state, cause=cause, name="NoopTaskFailure" if cause else None)
        else:
            with self._lock:
                task.state = state
            self.reports.state(task.spec, state)

    # --- bookkeeping -------------------------------------------------------------------

    def _still_starting(self, task: Task) -> bool:
        with self._lock:
            return (
                self.tasks.get(task.spec.execution_id) is task
                and not task.reported_terminal
                and not task.cancel_requested
                and task.state not in (ES.RUNNING, ES.CANCELING)
            )

    def _fail(self, task: Task, name: str, cause: str) -> None:
        self._finish(task, ES.FAILED, name=name, cause=cause)

    def _finish(self, task: Task, state: ES, *, cause: str | None = None, name: str | None = None) -> None:
        with self._lock:
            if task.reported_terminal:
                return
            task.reported_terminal = True
            task.state = state
            self.tasks.pop(task.spec.execution_id, None)
            if task.startup_timer is not None:
                task.startup_timer.cancel()
            self.slots.release(task.slots, task.allocation_id)
        self.reports.ended(task.spec, state, cause=cause, name=name)
        self._replenish()

    def _replenish(self) -> None:
        self.drivers.replenish(self.free_slots())

    def publish_warm_status(self) -> None:
        """For operators and benchmarks: how many warm drivers are ready right now; and the warm
        drivers' size kept to the tasks that may fail over here."""
        self.drivers.follow_standby_shape(len(self.slots))
        self.drivers.publish_status()

    def free_slots(self) -> int:
        with self._lock:
            return self.slots.free()

    def task_drivers(self) -> list[tuple[tp.TaskSpec, DriverProcess]]:
        """Each task that has a driver, with it (memory/task_memory.py reads their memory figures)."""
        with self._lock:
            return [(t.spec, t.driver) for t in self.tasks.values() if t.driver is not None]

    def slot_report(self) -> tuple[SlotState, ...]:
        with self._lock:
            by_alloc = {t.allocation_id: t for t in self.tasks.values()}
            out = []
            for i, a in self.slots.holders():
                t = by_alloc.get(a) if a else None
                out.append(
                    SlotState(
                        index=i,
                        allocation_id=a,
                        job_id=t.spec.job_id if t else None,
                        execution_id=t.spec.execution_id if t else None,
                    )
                )
            return tuple(out)

    def abandon_tasks(self, why: str) -> int:
        """Cancel every task here: they were failed over elsewhere. Returns how many."""
        with self._lock:
            ids = [(t.spec.execution_id, t.spec.job_id) for t in self.tasks.values() if not t.reported_terminal]
        for execution_id, job_id in ids:
            log.warning("stopping task %s of job %s: %s", execution_id, job_id, why)
            self.cancel(execution_id, job_id)
        return len(ids)

    def running_reports(self) -> tuple[TaskReport, ...]:
        with self._lock:
            return tuple(
                TaskReport(
                    execution_id=t.spec.execution_id, job_id=t.spec.job_id, state=t.state, allocation_id=t.allocation_id
                )
                for t in self.tasks.values()
            )

    def shutdown(self) -> None:
        """Stop everything this TaskManager started; nothing may outlive it."""
        self.drivers.shutdown()  # first, so the task drivers' exits below start no replacements
        with self._lock:
            drivers = [t.driver for t in self.tasks.values() if t.driver]
        for d in drivers:
            d.kill()
        self.noop.shutdown()
