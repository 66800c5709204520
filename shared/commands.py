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

Celery's other places: shared/celery_wire.py (the queue items and events written directly),
shared/transport/kombu_redis.py (the TaskManagers' broker transport), shared/schedules.py (cron
and interval arithmetic from `celery.schedules`), and on a TaskManager
services/taskmanager/__main__.py (its worker's app), commands.py (the command tasks) and
remote_control.py (inspection only).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import redis
from celery import Celery

from shared.celery_wire import CeleryWire
from shared.message_auth import ClusterAuth
from shared.messages import CancelTask, DeployTask, TriggerCheckpoint, encode, wrap

DEPLOY_TASK = "headrace.deploy_task"
CANCEL_TASK = "headrace.cancel_task"
TRIGGER_CHECKPOINT = "headrace.trigger_checkpoint"
COMMAND_EXPIRES_S = 60


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

    Given the Redis client of the broker, commands are written as Celery would write them
    (shared/celery_wire.py) without its per-message cost; without one, through `send_task`."""

    def __init__(
        self,
        app: Celery,
        *,
        sender: str,
        epoch: int,
        client: redis.Redis | None = None,
        auth: ClusterAuth | None = None,
    ):
        self.app, self.sender, self.epoch, self.client = app, sender, epoch, client
        self.auth = auth or ClusterAuth.ephemeral()  # without the cluster's keys no TaskManager obeys
        self.wire = CeleryWire(app, db=client.connection_pool.connection_kwargs.get("db", 0)) if client else None
        self._local = threading.local()  # the producer or wire batch open on this thread

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Commands sent inside go to Redis in one pipeline when the block ends, each with its
        task-sent event, instead of two round trips each: 2,000 deploys cost the JobManager
        ~1 ms apiece one by one. If the block raises, nothing of it is sent; the caller's
        outbox keeps those commands for a retry."""
        if getattr(self._local, "open", False):
            yield  # nested: the outer batch sends
            return
        if self.wire is not None:
            self._local.open, self._local.items = True, []
            try:
                yield
                items = self._local.items
            finally:
                self._local.open, self._local.items = False, None
            self._write(items)
            return
        with self.app.producer_or_acquire() as producer, producer.batch():
            self._local.open, self._local.producer = True, producer
            try:
                yield
            finally:
                self._local.open, self._local.producer = False, None

    def deploy(self, queue: str, command: DeployTask) -> None:
        self._send(DEPLOY_TASK, queue, command)

    def cancel(self, queue: str, command: CancelTask) -> None:
        self._send(CANCEL_TASK, queue, command)

    def trigger_checkpoint(self, queue: str, command: TriggerCheckpoint) -> None:
        self._send(TRIGGER_CHECKPOINT, queue, command)

    def _send(self, name: str, queue: str, body) -> None:
        raw = encode(wrap(body, sender=self.sender, epoch=self.epoch))
        payload, signature = raw.decode(), self.auth.sign_command(body.taskmanager_id, raw)
        # A command is only useful for seconds; one stuck in a dead TaskManager's queue must
        # not start a task much later when a TaskManager with that id reappears.
        if self.wire is not None:
            item = (
                queue,
                *self.wire.task(
                    name, queue, [payload, signature], argsrepr=summary(body, self.epoch), expires_s=COMMAND_EXPIRES_S
                ),
            )
            if getattr(self._local, "open", False):
                self._local.items.append(item)
            else:
                self._write([item])
            return
        self.app.send_task(
            name,
            args=[payload, signature],
            queue=queue,
            routing_key=queue,
            expires=COMMAND_EXPIRES_S,
            argsrepr=summary(body, self.epoch),
            producer=getattr(self._local, "producer", None),
        )

    def _write(self, items: list[tuple[str, bytes, bytes | None]]) -> None:
        if not items:
            return
        client, wire = self.client, self.wire
        if client is None or wire is None:  # items are made by the wire, which exists with a client
            raise RuntimeError("Celery wire items written without a Redis client")
        pipe = client.pipeline(transaction=False)
        for queue, message, event in items:
            pipe.lpush(queue, message)
            if event is not None:
                pipe.publish(wire.event_channel, event)
        pipe.execute()


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
