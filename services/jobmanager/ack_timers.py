"""Acknowledgement timers: a deploy that no TaskManager answers within `deploy_ack_timeout_s`
fails the attempt over; a cancel not confirmed within `cancel_ack_timeout_s` is sent again, and
after a second timeout the attempt is given up as CANCELED (its sinks fence it off anyway). A
TaskManager's refusal of a command ends the wait at once."""

from __future__ import annotations

import logging

from services.jobmanager import transitions as tr
from services.jobmanager.context import Context
from services.jobmanager.outbox import CANCEL
from services.jobmanager.restarts import Restarts
from services.jobmanager.transitions import Fx
from shared.catalog import repository as repo
from shared.ids import NO_TASKMANAGER, ExecutionId
from shared.messages import CancelTask, CommandRejected, ReleaseSlots
from shared.states import ExecutionState as ES

log = logging.getLogger("headrace.jobmanager")


class AckTimers:
    def __init__(self, ctx: Context, restarts: Restarts):
        self.ctx, self.restarts = ctx, restarts

    def arm(self, execution_id: ExecutionId, state: ES, *, resent: bool = False) -> None:
        settings = self.ctx.settings
        timeout = settings.deploy_ack_timeout_s if state == ES.DEPLOYING else settings.cancel_ack_timeout_s
        self.ctx.timers.call_later(timeout, lambda: self._timed_out(execution_id, state, timeout, resent))

    def _timed_out(self, execution_id: ExecutionId, state: ES, timeout: float, resent: bool) -> None:
        with self.ctx.uow.tx() as s:
            try:
                ex = repo.get_execution(s, execution_id, lock=True)
            except repo.NotFound:
                return
            decision = tr.on_ack_timeout(ES(ex.state), state, resent=resent)
            tm, job_id = ex.taskmanager_id, ex.job_id
        if Fx.FAIL_OVER in decision:
            self.restarts.fail(
                execution_id,
                cause_name="DeploymentTimeoutException",
                cause=f"TaskManager {tm} did not acknowledge the deployment within {timeout:g} s "
                "(deploy_ack_timeout_s): the command was lost or refused; failing over",
                expected_tm=None,
            )
        elif Fx.RESEND_CANCEL in decision:
            log.warning("cancel of %s not confirmed by %s within %g s; sending it again", execution_id, tm, timeout)
            target = tm or NO_TASKMANAGER
            self.ctx.uow.command(
                CANCEL,
                self.ctx.uow.queue_of(target),
                CancelTask(taskmanager_id=target, execution_id=execution_id, job_id=job_id),
            )
            self.arm(execution_id, ES.CANCELING, resent=True)
        elif Fx.GIVE_UP_CANCEL in decision:
            self.give_up_cancel(
                execution_id,
                f"TaskManager {tm} did not confirm the cancellation within "
                f"{2 * timeout:g} s (cancel_ack_timeout_s, sent twice)",
            )

    def give_up_cancel(self, execution_id: ExecutionId, why: str) -> None:
        """CANCELING -> CANCELED without the TaskManager's word: its slots go back, and its sinks
        refuse whatever the task may still write (fenced by the next attempt's token)."""
        ctx = self.ctx
        release = None
        with ctx.uow.tx() as s:
            ex = repo.get_execution(s, execution_id, lock=True)
            decision = tr.give_up_cancel(ES(ex.state))
            if decision.execution is None:
                return
            repo.transition_execution(s, ex, decision.execution, failure_cause=why)
            repo.record_exception(
                s,
                job_id=ex.job_id,
                exception_name="CancelTimeoutException",
                stacktrace=why,
                execution_id=ex.id,
                attempt=ex.attempt,
                taskmanager_id=ex.taskmanager_id,
                keep=ctx.settings.exception_history_size,
            )
            release = ex.allocation_id
            ctx.checkpoints.on_execution_ended(s, ex.job_id, ex.id, decision.execution)
            self.restarts.settle(s, ex.job_id)
        log.warning("%s: %s", execution_id, why)
        if release:
            ctx.uow.emit(ReleaseSlots(allocation_id=release, reason="cancel not confirmed"))

    def on_command_rejected(self, msg: CommandRejected) -> None:
        fx = tr.on_command_rejected(msg.command, names_attempt=bool(msg.execution_id))
        if not msg.execution_id:
            log.warning(
                "TaskManager %s rejected a %s command: %s", msg.taskmanager_id, msg.command or "unreadable", msg.reason
            )
        elif fx == Fx.GIVE_UP_CANCEL:
            self.give_up_cancel(msg.execution_id, f"TaskManager {msg.taskmanager_id} rejected the cancel: {msg.reason}")
        elif fx == Fx.FAIL_OVER:
            self.restarts.fail(
                msg.execution_id,
                cause_name="CommandRejected",
                cause=f"TaskManager {msg.taskmanager_id} rejected the deployment: {msg.reason}",
                expected_tm=msg.taskmanager_id,
            )
        else:
            log.warning(
                "TaskManager %s rejected %s for %s: %s", msg.taskmanager_id, msg.command, msg.execution_id, msg.reason
            )
