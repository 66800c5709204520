"""The consumer of a TaskManager's worker: Celery's own, with remote control for inspection only
and messages it cannot decode reported like the ones it refuses.

Celery lets whoever may publish to the remote-control channel shut a worker down, revoke its
tasks, add or cancel the queues it consumes, change its rate and time limits, restart or resize
its pool. On a TaskManager none of that is Celery's to do: the worker lives and dies with its
TaskManager process (stopped by its supervisor: `headrace up`, systemd, compose), and commands
reach it only through its own queue, signed by the JobManager. The TaskManagers' Redis users may
not publish to that channel at all (services/cluster/redis_auth.py), and this worker answers only the
inspection commands below, so `celery control shutdown` does not stop it even when the admin
user sends it. Flower and `celery inspect` keep working.

The worker's consumer gets its own handler table (Celery's Panel registry is left alone):
use `app.conf.worker_consumer = "services.taskmanager.remote_control:Consumer"`.

Celery logs a task message whose body does not decode (not JSON, say) and drops it; it sends
`task_rejected` for the ones it refuses otherwise. This consumer sends `task_rejected` for both,
so the TaskManager dead-letters them all in one place (services/taskmanager/commands.py).
"""

from __future__ import annotations

import logging

from celery import signals
from celery.worker import control
from celery.worker.consumer import Consumer as CeleryConsumer
from celery.worker.consumer.control import Control

log = logging.getLogger(__name__)

# Read-only questions about the worker. Left out although Celery files them under "inspect":
# `conf` (it lists the worker's settings, its broker URL with its Redis password among them),
# `memdump`, `memsample`, `objgraph` (they cost the worker memory and seconds of CPU) and
# `hello` (mingle, which TaskManagers do not use).
INSPECTION = frozenset(
    {
        "ping",
        "stats",
        "report",
        "clock",
        "active_queues",
        "registered",
        "dump_tasks",
        "active",
        "dump_active",
        "reserved",
        "dump_reserved",
        "scheduled",
        "dump_schedule",
        "revoked",
        "dump_revoked",
        "query_task",
        # A control command, but all it does is make the worker send one heartbeat event now.
        "heartbeat",
    }
)


def refusal(method: str):
    def refuse(state, **_arguments):
        log.warning(
            "refused Celery remote control command %r: a TaskManager's worker answers only inspection "
            "(docs/runbooks/auth.md, Redis users)",
            method,
        )
        return {
            "error": f"{method!r} is disabled on Headrace TaskManagers: they answer inspection only; stop or "
            f"restart a TaskManager through its supervisor, cancel a job through the REST API"
        }

    return refuse


def handlers() -> dict:
    """Celery's remote-control handlers with every one outside INSPECTION replaced by a refusal."""
    return {name: fun if name in INSPECTION else refusal(name) for name, fun in control.Panel.data.items()}


class InspectionOnlyControl(Control):
    """Celery's remote-control bootstep, its mailbox node answering with handlers()."""

    name = "headrace.inspection_only_control"

    def __init__(self, c, **kwargs):
        super().__init__(c, **kwargs)
        # A command Celery does not know is a KeyError in kombu's Node.dispatch, which replies
        # with the error: the table stays complete so every refusal says why instead.
        self.box.node.handlers = handlers()


CELERY_CONTROL_STEP = "celery.worker.consumer.control:Control"


class Consumer(CeleryConsumer):
    class Blueprint(CeleryConsumer.Blueprint):
        default_steps = [
            f"{__name__}:InspectionOnlyControl" if step == CELERY_CONTROL_STEP else step
            for step in CeleryConsumer.Blueprint.default_steps
        ]

    def on_decode_error(self, message, exc):
        super().on_decode_error(message, exc)
        signals.task_rejected.send(sender=self, message=message, exc=exc)
