"""Celery command handlers of a TaskManager process: short, fenced, delegating.

Each returns as soon as the supervisor has taken the command; a pipeline never runs inside a
Celery task. First of all a command must carry, as its second argument, the HMAC of its payload
under the command key of the TaskManager it is for (shared/message_auth.py): one that is unsigned,
badly signed or signed for another TaskManager is dead-lettered and nobody is told (a forger
learns nothing, and cannot make this TaskManager fail a real attempt by rejecting it). Then it
is obeyed only if it comes from the JobManager that leads now: sender "jobmanager" and the
leader epoch currently published in Redis (shared/leader_epoch.py), never "the newest epoch
seen" (one forged command with a future epoch would make every real one after it stale). Then:

- another sender, or an epoch that is not the current one: dropped and logged. A deposed
  leader's command is routine during a failover, and a forged one is told nothing;
- unreadable (not an envelope, a spec that does not validate, sent under another command's
  name): dead-lettered with the error; and if it is the current leader's, reported with
  `CommandRejected` (with the attempt's ids when they can be read), so the JobManager fails the
  attempt over at once instead of waiting for its acknowledgement timer;
- a deploy whose artifact is not the catalog's (outside the artifact directory, or its sha256
  is not the one recorded at upload: services/taskmanager/tasks/artifact_check.py): dead-lettered and
  reported with `CommandRejected`; nothing runs;
- valid, but it cannot be carried out (a TaskManager this process does not run, the supervisor
  raised): reported with `CommandRejected`.

Items whose delivery fails before a command task runs (not a kombu message, a body Celery cannot
unpack) never get here: the broker transport dead-letters them (shared/transport/kombu_redis.py);
Celery's own refusals (an unknown task name, a content type other than JSON, a body that does not
decode: services/taskmanager/remote_control.py) are dead-lettered through its signals, below.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from celery import Celery, signals

from services.taskmanager.tasks.artifact_check import ArtifactChecker
from shared import streams
from shared.commands import CANCEL_TASK, DEPLOY_TASK, TRIGGER_CHECKPOINT
from shared.ids import ExecutionId, JobId, TaskManagerId
from shared.leader_epoch import LeaderEpochFence
from shared.message_auth import ClusterAuth, staleness
from shared.messages import CancelTask, CommandRejected, DeployTask, TriggerCheckpoint, UndecodableMessage, decode
from shared.transport import dead_letters
from shared.transport.base import Transport

log = logging.getLogger("headrace.taskmanager.commands")

JOBMANAGER = "jobmanager"
# The published epoch can be missing for a moment (Redis restarted empty; the leader publishes
# it again every 2 s): wait this long for it before dropping a command.
EPOCH_WAIT_S = 5.0


@dataclass(frozen=True)
class Peek:
    """What can be read of a command that did not decode: enough to fence and to report it."""

    sender: str | None = None
    epoch: int | None = None
    command: str | None = None
    taskmanager_id: TaskManagerId | None = None
    execution_id: ExecutionId | None = None
    job_id: JobId | None = None


def peek(payload: str) -> Peek:
    try:
        env = json.loads(payload)
    except (TypeError, ValueError):
        return Peek()
    if not isinstance(env, dict):
        return Peek()
    body = _object(env.get("body"))
    spec = _object(body.get("spec"))

    def text(*candidates: Any) -> str | None:
        return next((c for c in candidates if isinstance(c, str)), None)

    taskmanager_id = text(body.get("taskmanager_id"))
    execution_id = text(body.get("execution_id"), spec.get("execution_id"))
    job_id = text(body.get("job_id"), spec.get("job_id"))
    epoch = env.get("epoch")
    return Peek(
        sender=text(env.get("sender")),
        epoch=epoch if type(epoch) is int else None,
        command=text(body.get("type")),
        taskmanager_id=TaskManagerId(taskmanager_id) if taskmanager_id is not None else None,
        execution_id=ExecutionId(execution_id) if execution_id is not None else None,
        job_id=JobId(job_id) if job_id is not None else None,
    )


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class CommandTarget(Protocol):
    """What the commands do on a TaskManager (services/taskmanager/supervisor.py's TaskSupervisor)."""

    def deploy(self, cmd: DeployTask) -> None: ...

    def cancel(self, execution_id: ExecutionId, job_id: JobId | None = None) -> None: ...

    def trigger_checkpoint(self, cmd: TriggerCheckpoint) -> None: ...


# The commands a TaskManager obeys.
Command = DeployTask | CancelTask | TriggerCheckpoint


class CommandIntake:
    """Fences, checks and routes one process's commands (see the module docstring)."""

    def __init__(
        self,
        *,
        supervisors: Mapping[TaskManagerId, CommandTarget],
        fence: LeaderEpochFence,
        transport: Transport,
        dead_letter_client: Any,
        auth: ClusterAuth,
        artifacts: ArtifactChecker | None = None,
        dead_letter_stream: str = streams.DLQ_STREAM,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.supervisors, self.fence, self.transport = supervisors, fence, transport
        self.dead_letter_client, self.dead_letter_stream = dead_letter_client, dead_letter_stream
        self.auth = auth
        self.artifacts = artifacts  # an ArtifactChecker; None only where no pipeline can run
        self.clock, self.sleep = clock, sleep
        self._epoch_missing_since: float | None = None

    def handle(self, expected: type[Command], args: tuple, kwargs: dict, queue: str) -> None:
        if len(args) == 1 and not kwargs and isinstance(args[0], str):
            self._dead_letter(
                queue,
                expected,
                "unsigned command: the JobManager signs every command with the TaskManager's command key",
                args[0],
            )
            return
        if len(args) != 2 or kwargs or not all(isinstance(a, str) for a in args):
            self._dead_letter(
                queue,
                expected,
                f"expected two arguments, an envelope's JSON and its signature; got "
                f"{len(args)} positional and {len(kwargs)} keyword arguments",
                repr(args),
            )
            return
        payload, signature = args
        refused = self.auth.check_command(self._addressee(payload, queue), payload.encode(), signature)
        if refused is not None:
            self._dead_letter(queue, expected, refused, payload)
            return
        try:
            env = decode(payload)
        except UndecodableMessage as exc:
            self._undecodable(queue, expected, payload, str(exc))
            return
        stale = staleness(env)
        if stale is not None:
            self._dead_letter(queue, expected, stale, payload)
            return
        body = env.body
        if not self._from_current_leader(env.sender, env.epoch, body.type):
            return
        if not isinstance(body, expected):
            error = f"a {body.type} sent as {expected.__name__}"
            self._dead_letter(queue, expected, error, payload)
            self._reject(
                queue,
                Peek(
                    command=body.type,
                    taskmanager_id=getattr(body, "taskmanager_id", None),
                    execution_id=getattr(body, "execution_id", None),
                    job_id=getattr(body, "job_id", None),
                ),
                error,
            )
            return
        if isinstance(body, DeployTask):
            refused = self.artifacts.refusal(body.spec) if self.artifacts is not None else None
            if refused is not None:
                self._dead_letter(queue, expected, f"DeployTask refused: {refused}", payload)
                self._reject(queue, peek(payload), refused)
                return
        sup = self.supervisors.get(body.taskmanager_id)
        if sup is None:
            self._reject(queue, peek(payload), f"{body.taskmanager_id} is not a TaskManager of this process")
            return
        try:
            ACTIONS[expected](sup, body)
        except Exception as exc:  # the JobManager must hear of it, the worker must go on
            log.exception("%s for %s failed", body.type, body.taskmanager_id)
            self._reject(queue, peek(payload), f"{body.type} failed on the TaskManager: {type(exc).__name__}: {exc}")

    def _addressee(self, payload: str, queue: str) -> TaskManagerId:
        """Whose command key checks this command: the one TaskManager of this process, or (a
        process serving several) the one the command names; a command meant for anyone else
        then fails the check."""
        if len(self.supervisors) == 1:
            return next(iter(self.supervisors))
        named = peek(payload).taskmanager_id
        return named if named is not None and named in self.supervisors else _taskmanager_of(queue)

    # --- verdicts ----------------------------------------------------------------------

    def _from_current_leader(self, sender: str | None, epoch: int | None, command: str | None) -> bool:
        if sender != JOBMANAGER:
            log.warning("dropping %s from sender %r: commands come only from the JobManager", command, sender)
            return False
        if epoch is None or not self._is_current(epoch):
            log.warning(
                "dropping %s from JobManager epoch %s: the current leader's epoch is %s",
                command,
                epoch,
                self.fence.epoch,
            )
            return False
        return True

    def _is_current(self, epoch: int) -> bool:
        while True:
            if self.fence.accept(epoch) or self.fence.epoch is not None:
                self._epoch_missing_since = None
                return self.fence.epoch == epoch
            # Waited for once, not per command: a backlog must not cost EPOCH_WAIT_S each.
            now = self.clock()
            if self._epoch_missing_since is None:
                self._epoch_missing_since = now
            if now - self._epoch_missing_since >= EPOCH_WAIT_S:
                return False
            self.sleep(0.25)

    def _undecodable(self, queue: str, expected: type[Command], payload: str, error: str) -> None:
        self._dead_letter(queue, expected, f"undecodable command: {error}", payload)
        seen = peek(payload)
        if seen.sender == JOBMANAGER and seen.epoch is not None and self.fence.accept(seen.epoch):
            self._reject(queue, seen, f"undecodable {seen.command or expected.__name__}: {error}")

    def _dead_letter(self, queue: str, expected: type[Command], error: str, payload: str) -> None:
        log.error("dead-lettering a %s command from queue %s: %s", expected.__name__, queue, error)
        dead_letters.add_safely(
            self.dead_letter_client,
            error=error,
            stream=self.dead_letter_stream,
            origin={"queue": queue, "task": TASK_NAMES[expected]},
            original={"m": payload},
        )

    def _reject(self, queue: str, seen: Peek, reason: str) -> None:
        tm = seen.taskmanager_id
        if tm is None or tm not in self.supervisors:
            tm = _taskmanager_of(queue)
        try:
            self.transport.publish(
                streams.JM_STREAM,
                CommandRejected(
                    taskmanager_id=tm,
                    command=seen.command,
                    execution_id=seen.execution_id,
                    job_id=seen.job_id,
                    reason=reason[:2000],
                ),
            )
        except Exception:  # the JobManager's acknowledgement timer is the fallback
            log.exception("could not report the rejected %s (%s) to the JobManager", seen.command, reason[:200])


def _taskmanager_of(queue: str) -> TaskManagerId:
    prefix = streams.tm_queue("")
    return TaskManagerId(queue[len(prefix) :] if queue.startswith(prefix) else queue)


# Celery task name <-> message type, and what the supervisor does with each.
TASK_NAMES: dict[type[Command], str] = {
    DeployTask: DEPLOY_TASK,
    CancelTask: CANCEL_TASK,
    TriggerCheckpoint: TRIGGER_CHECKPOINT,
}
ACTIONS: dict[type[Command], Callable[[CommandTarget, Any], None]] = {
    DeployTask: lambda sup, body: sup.deploy(body),
    CancelTask: lambda sup, body: sup.cancel(body.execution_id, body.job_id),
    TriggerCheckpoint: lambda sup, body: sup.trigger_checkpoint(body),
}


def register_commands(app: Celery, intake: CommandIntake) -> None:
    for expected, name in TASK_NAMES.items():
        app.task(name=name, bind=True)(_command_task(expected, intake))
    _dead_letter_celery_refusals(intake)


def _command_task(expected: type[Command], intake: CommandIntake) -> Callable[..., None]:
    def command(task, *args, **kwargs) -> None:
        queue = (task.request.delivery_info or {}).get("routing_key") or "?"
        intake.handle(expected, args, kwargs, queue)

    command.__name__ = f"handle_{expected.__name__}"
    return command


def _dead_letter_celery_refusals(intake: CommandIntake) -> None:
    """Messages Celery itself refuses (an unknown task name, a malformed task message) are
    logged and dropped by Celery; keep them where an operator looks."""

    def refused(message, why: str) -> None:
        raw = getattr(message, "_raw", None)
        original = json.dumps(raw) if isinstance(raw, dict) else getattr(message, "body", b"")
        queue = ((getattr(message, "delivery_info", None) or {}).get("routing_key")) or "?"
        dead_letters.add_safely(
            intake.dead_letter_client,
            error=why,
            origin={"queue": queue},
            original={"item": original},
            stream=intake.dead_letter_stream,
        )

    def on_unknown(sender=None, message=None, exc=None, name=None, **_):
        refused(message, f"unknown task {name!r}: not a Headrace command")

    def on_rejected(sender=None, message=None, exc=None, **_):
        refused(message, f"Celery refused the message: {exc!r}" if exc else "Celery refused the message")

    signals.task_unknown.connect(on_unknown, weak=False)
    signals.task_rejected.connect(on_rejected, weak=False)
