"""Celery command handlers of a TaskManager process: short, fenced, delegating.

Both return as soon as the supervisor has taken the command; a pipeline never runs inside a
Celery task. Commands from a JobManager epoch older than the newest one seen are dropped.
"""

from __future__ import annotations

import logging
import threading

from celery import Celery

from shared.commands import CANCEL_TASK, DEPLOY_TASK, TRIGGER_CHECKPOINT
from shared.messages import CancelTask, DeployTask, TriggerCheckpoint, UndecodableMessage, decode

log = logging.getLogger("headrace.taskmanager.commands")


class EpochFence:
    def __init__(self):
        self.newest = 0
        self._lock = threading.Lock()

    def accept(self, epoch: int) -> bool:
        with self._lock:
            if epoch < self.newest:
                return False
            self.newest = epoch
            return True


def register_commands(app: Celery, supervisors: dict, fence: EpochFence) -> None:
    def _route(body) -> object | None:
        sup = supervisors.get(body.taskmanager_id)
        if sup is None:
            log.warning("dropping %s for %s: not a TaskManager of this process", body.type, body.taskmanager_id)
        return sup

    def _decode(payload: str, expected: type):
        try:
            env = decode(payload)
        except UndecodableMessage as exc:
            log.error("dropping undecodable command: %s", exc)
            return None
        if not isinstance(env.body, expected):
            log.error("dropping %s sent as %s", env.body.type, expected.__name__)
            return None
        if not fence.accept(env.epoch):
            log.warning("dropping %s from stale JobManager epoch %d (newest %d)", env.body.type, env.epoch,
                        fence.newest)
            return None
        return env.body

    # Celery task name -> (message type, what the TaskManager's supervisor does with it)
    handlers = {
        DEPLOY_TASK: (DeployTask, lambda sup, body: sup.deploy(body)),
        TRIGGER_CHECKPOINT: (TriggerCheckpoint, lambda sup, body: sup.trigger_checkpoint(body)),
        CANCEL_TASK: (CancelTask, lambda sup, body: sup.cancel(body.execution_id, body.job_id)),
    }
    for name, (expected, act) in handlers.items():
        app.task(name=name)(_command_task(expected, act, _decode, _route))


def _command_task(expected: type, act, decode_body, route):
    def command(payload: str) -> None:
        body = decode_body(payload, expected)
        sup = body and route(body)
        if sup is not None:
            act(sup, body)

    command.__name__ = f"handle_{expected.__name__}"
    return command
