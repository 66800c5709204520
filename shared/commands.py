"""Celery adapter: the only module that knows Celery. Commands to TaskManagers (deploy, cancel)
(and checkpoint triggers) travel as Celery tasks routed to one queue per TaskManager; the payload is an encoded
`Envelope`, so the receiver can fence by leader epoch like any other message.

A command task is short: it hands the work to the TaskManager's supervisor and returns. No
Celery task ever runs a pipeline (the Redis broker would redeliver one that outlives the
visibility timeout).
"""

from __future__ import annotations

from celery import Celery

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
    )
    return app


class CommandGateway:
    """The JobManager's side: TaskExecutorGateway.submitTask / cancelTask, in Flink's words."""

    def __init__(self, app: Celery, *, sender: str, epoch: int):
        self.app, self.sender, self.epoch = app, sender, epoch

    def deploy(self, queue: str, command: DeployTask) -> None:
        self._send(DEPLOY_TASK, queue, command)

    def cancel(self, queue: str, command: CancelTask) -> None:
        self._send(CANCEL_TASK, queue, command)

    def trigger_checkpoint(self, queue: str, command: TriggerCheckpoint) -> None:
        self._send(TRIGGER_CHECKPOINT, queue, command)

    def _send(self, name: str, queue: str, body) -> None:
        payload = encode(wrap(body, sender=self.sender, epoch=self.epoch)).decode()
        # A command is only useful for seconds; one stuck in a dead TaskManager's queue must
        # not start a task much later when a TaskManager with that id reappears.
        self.app.send_task(name, args=[payload], queue=queue, routing_key=queue, expires=COMMAND_EXPIRES_S)
