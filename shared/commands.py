"""Celery adapter: every Celery app of ours (`make_celery`) and the JobManager's `CommandGateway`.
Commands to TaskManagers (deploy, cancel, checkpoint trigger) travel as Celery tasks routed to
one queue per TaskManager; the payload is an encoded `Envelope`, so the receiver can fence by
leader epoch like any other message, and the second argument is its HMAC under the command key
of the TaskManager it is for (shared/message_auth.py): only the control plane can make one, and
it covers the epoch, so it proves "the leader of this epoch sent this to that TaskManager".

A command task is short: it hands the work to the TaskManager's supervisor and returns. No
Celery task ever runs a pipeline. Commands are acknowledged when the worker takes them, and the
TaskManager's transport keeps no "unacked" copy (shared/transport/kombu_redis.py): a command
lost with a TaskManager is the JobManager's acknowledgement timer's to handle, never
redelivered minutes later.

Celery's own tools work against a running cluster: TaskManager workers send task events (and,
with their heartbeat on, worker heartbeats), the JobManager a task-sent event per command, and
`celery_app` below is the app for the `celery` command, built on first use from the settings
(HEADRACE_CONFIG / HEADRACE_REDIS_URL; an operator uses the admin URL of `headrace up`'s
<run>/config.yaml):

    HEADRACE_CONFIG=~/.headrace/runs/<run>/config.yaml celery -A shared.commands:celery_app inspect ping
    ... celery -A shared.commands:celery_app inspect active_queues
    ... celery -A shared.commands:celery_app events      # or: pip install flower; ... flower

Celery's other places: shared/transport/kombu_redis.py (the TaskManagers' broker transport: a
delivery that fails is dead-lettered), shared/schedules.py (cron and interval arithmetic from
`celery.schedules`), and on a TaskManager services/taskmanager/__main__.py (its worker's app),
commands.py (the command tasks) and remote_control.py (its consumer: inspection only).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from celery import Celery

from shared.message_auth import ClusterAuth
from shared.messages import CancelTask, DeployTask, TriggerCheckpoint, encode, wrap

DEPLOY_TASK = "headrace.deploy_task"
CANCEL_TASK = "headrace.cancel_task"
TRIGGER_CHECKPOINT = "headrace.trigger_checkpoint"
COMMAND_EXPIRES_S = 60
# kombu's batch flushes every 1,000 Redis commands by default; a unit of work's commands (2,000
# deploys are 4,000 writes with their events) go in one pipeline, so a block that raises sends none.
ONE_PIPELINE = 1_000_000


def make_celery(redis_url: str, name: str) -> Celery:
    app = Celery(name, broker=redis_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=False,
        worker_prefetch_multiplier=4,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        broker_transport_options={"visibility_timeout": 300},
        # Events for Flower and `celery events`: a few small PUBLISHes per command, on Redis
        # pub/sub channels (nothing is stored when nobody listens).
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    return app


def __getattr__(name: str):
    # Built on first access, not at import: the services import this module with their own
    # settings, and a missing HEADRACE_CONFIG must not break them.
    if name == "celery_app":
        import sys

        from shared.settings import load_settings

        try:
            settings = load_settings()
        except ValueError as exc:  # pydantic's ValidationError is one too
            # The `celery` command would print a traceback; an operator needs the reason.
            print(f"headrace: invalid settings for the Celery app: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        app = make_celery(settings.redis_url, "headrace")
        globals()["celery_app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CommandGateway:
    """The JobManager's side: TaskExecutorGateway.submitTask / cancelTask, in Flink's words.

    Commands go out through Celery's own producer (`send_task`): Celery writes the task message
    and its task-sent event, so a Celery upgrade changes both on the two sides at once."""

    def __init__(self, app: Celery, *, sender: str, epoch: int, auth: ClusterAuth | None = None):
        self.app, self.sender, self.epoch = app, sender, epoch
        self.auth = auth or ClusterAuth.ephemeral()  # without the cluster's keys no TaskManager obeys
        self._local = threading.local()  # the producer whose batch is open on this thread

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Commands sent inside go to Redis in one pipeline when the block ends (kombu's
        `Producer.batch`), each with its task-sent event, instead of two round trips each:
        2,000 deploys cost the JobManager ~1 ms apiece one by one. If the block raises, nothing
        of it is sent; the caller's outbox keeps those commands for a retry."""
        if getattr(self._local, "producer", None) is not None:
            yield  # nested: the outer batch sends
            return
        with self.app.producer_or_acquire() as producer, producer.batch(max_size=ONE_PIPELINE):
            self._local.producer = producer
            try:
                yield
            finally:
                self._local.producer = None

    def deploy(self, queue: str, command: DeployTask) -> None:
        self._send(DEPLOY_TASK, queue, command)

    def cancel(self, queue: str, command: CancelTask) -> None:
        self._send(CANCEL_TASK, queue, command)

    def trigger_checkpoint(self, queue: str, command: TriggerCheckpoint) -> None:
        self._send(TRIGGER_CHECKPOINT, queue, command)

    def _send(self, name: str, queue: str, body) -> None:
        raw = encode(wrap(body, sender=self.sender, epoch=self.epoch))
        self.app.send_task(
            name,
            args=[raw.decode(), self.auth.sign_command(body.taskmanager_id, raw)],
            queue=queue,
            routing_key=queue,
            # A command is only useful for seconds; one stuck in a dead TaskManager's queue must
            # not start a task much later when a TaskManager with that id reappears.
            expires=COMMAND_EXPIRES_S,
            argsrepr=summary(body, self.epoch),
            producer=getattr(self._local, "producer", None),
            # A TaskManager queue is a plain Redis list that needs no declaring; checking that it
            # was declared cost a fifth of each send.
            declare=[],
            # Not retried here: a command that could not be written stays in the JobManager's
            # outbox, which sends it again with its unit of work.
            retry=False,
        )


def summary(body, epoch: int) -> str:
    """What Celery's events (Flower, `celery events`) show of a command instead of its payload:
    the ids an operator looks for, and nothing of the task spec (its catalog URL may hold a
    password)."""
    spec = getattr(body, "spec", None)
    fields = {
        "job": getattr(body, "job_id", None) or getattr(spec, "job_id", None),
        "execution": getattr(body, "execution_id", None) or getattr(spec, "execution_id", None),
        "attempt": getattr(spec, "attempt", None),
        "checkpoint": getattr(body, "checkpoint_id", None),
        "taskmanager": getattr(body, "taskmanager_id", None),
        "epoch": epoch,
    }
    return f"{body.type}(" + ", ".join(f"{k}={v}" for k, v in fields.items() if v is not None) + ")"
