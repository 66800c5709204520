"""The JobManager's transactional outbox.

Every message (to the ResourceManager's stream) and command (to a TaskManager's Celery queue)
that a unit of work decides on is written to the catalog's `outbox` table in the same
transaction as the state change that caused it, and sent only after that transaction
committed. Sent entries are deleted in the next transaction (no extra commit per batch). If the
send fails (Redis unreachable) or the JobManager dies between commit and send, the entries stay
and `replay()` sends them later, from this process or from the next JobManager.

Sending twice is harmless by design: slot requests are idempotent by request id, releases by
allocation id, cancels by execution id; a deploy is replayed only while its attempt is still
DEPLOYING (and a TaskManager ignores a deploy for an attempt it already runs).

Epochs are never laundered: an entry goes out only under the epoch that committed it. A new
leader takes the entries of older epochs out (`take_over`) and decides afresh from the catalog
what they should become (`Reconciliation._redecide`, reconciliation.py); a deposed leader's
replay sends nothing of a newer leader's and deletes nothing unless it still holds the
leadership row.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.ids import ExecutionId, new_message_id
from shared.messages import UndecodableMessage, decode, encode, wrap
from shared.states import ExecutionState as ES

log = logging.getLogger("headrace.jobmanager.outbox")

STREAM, DEPLOY, CANCEL, CHECKPOINT = "stream", "deploy", "cancel", "checkpoint"


@dataclass(frozen=True)
class Effect:
    id: str
    kind: str  # STREAM | DEPLOY | CANCEL | CHECKPOINT
    target: str  # stream key, or the TaskManager's queue
    body: object
    execution_id: ExecutionId | None = None


class Outbox:
    REPLAY_BATCH = 1000

    def __init__(self, catalog: Catalog, transport, gateway, *, sender: str, epoch: int):
        self.catalog, self.transport, self.gateway = catalog, transport, gateway
        self.sender, self.epoch = sender, epoch
        self._sent: list[str] = []  # delivered, to be deleted by the next transaction
        # A previous JobManager may have left entries: look once at start, and after any failure.
        self.backlog = True

    @staticmethod
    def effect(kind: str, target: str, body, execution_id: ExecutionId | None = None) -> Effect:
        return Effect(new_message_id(), kind, target, body, execution_id)

    def write(self, s, effects: list[Effect]) -> list[str]:
        """Inside the unit of work's transaction: record the effects and delete what was sent.
        Returns the ids whose deletion this transaction carries (see `committed`)."""
        deleting = list(self._sent)
        repo.delete_outbox(s, deleting)
        base = time.time_ns()
        repo.add_outbox(
            s,
            [
                {
                    "id": e.id,
                    "seq": base + i,
                    "kind": e.kind,
                    "target": e.target,
                    "execution_id": e.execution_id,
                    "envelope": encode(wrap(e.body, sender=self.sender, epoch=self.epoch)).decode(),
                }
                for i, e in enumerate(effects)
            ],
        )
        return deleting

    def forget_sent(self) -> None:
        """When idle: delete sent entries now rather than with the next unit of work, so a
        JobManager that stops during a quiet spell leaves nothing to send twice."""
        if self._sent:
            deleting, self._sent = self._sent, []
            try:
                with self.catalog.session() as s:
                    repo.delete_outbox(s, deleting)
            except Exception:
                self._sent = deleting + self._sent
                raise

    def committed(self, deleting: list[str]) -> None:
        done = set(deleting)
        self._sent = [i for i in self._sent if i not in done]

    def deliver(self, effects: list[Effect]) -> None:
        """After commit. A failure leaves the entries for `replay`; it never undoes the commit."""
        if not effects:
            return
        try:
            self._send(effects)
        except Exception:  # Redis down: the entries wait in the catalog
            log.warning(
                "could not send %d committed effects; they stay in the outbox and are retried",
                len(effects),
                exc_info=True,
            )
            self.backlog = True
            return
        self._sent.extend(e.id for e in effects)

    def _send(self, effects: list[Effect]) -> None:
        publishes = [(e.target, e.body) for e in effects if e.kind == STREAM]
        if publishes:
            self.transport.publish_many(publishes)
        commands = [e for e in effects if e.kind in (DEPLOY, CANCEL, CHECKPOINT)]
        if not commands:
            return
        batch = getattr(self.gateway, "batch", None)
        with batch() if batch is not None else contextlib.nullcontext():
            for e in commands:
                if e.kind == DEPLOY:
                    self.gateway.deploy(e.target, e.body)
                elif e.kind == CANCEL:
                    self.gateway.cancel(e.target, e.body)
                else:
                    self.gateway.trigger_checkpoint(e.target, e.body)

    def take_over(self, s) -> list[Effect]:
        """In the new leader's first transaction: remove what older epochs left and return it,
        decoded, for the leader to decide again (it is never sent as it is)."""
        inherited, drop = [], []
        for r in repo.pending_outbox(s, limit=None):
            try:
                env = decode(r.envelope)
            except UndecodableMessage as exc:
                log.error("dropping undecodable outbox entry %s: %s", r.id, exc)
                drop.append(r.id)
                continue
            if env.epoch < self.epoch:
                inherited.append(Effect(r.id, r.kind, r.target, env.body, r.execution_id))
                drop.append(r.id)
        repo.delete_outbox(s, drop)
        if inherited:
            log.info("%d outbox entries of earlier leaders are decided again from the catalog", len(inherited))
        return inherited

    def replay(self) -> int:
        """Send what this leader's committed transactions left unsent, oldest first. Returns how
        many."""
        total = 0
        while True:
            with self.catalog.session() as s:
                rows = repo.pending_outbox(s, limit=self.REPLAY_BATCH)
                states = repo.execution_states(s, [r.execution_id for r in rows if r.kind == DEPLOY and r.execution_id])
            effects, stale = [], []
            foreign = 0
            for r in rows:
                try:
                    env = decode(r.envelope)
                except UndecodableMessage as exc:
                    log.error("dropping undecodable outbox entry %s: %s", r.id, exc)
                    stale.append(r.id)
                    continue
                body = env.body
                if env.epoch != self.epoch:
                    foreign += 1  # an older leader's (the next take_over decides) or a newer one's
                    continue
                if r.kind == DEPLOY and (not r.execution_id or states.get(r.execution_id) != ES.DEPLOYING.value):
                    stale.append(r.id)  # the attempt moved on: deploying it now would be wrong
                    continue
                effects.append(Effect(r.id, r.kind, r.target, body, r.execution_id))
            self._send(effects)  # raises if Redis is still down: the loop retries later
            with self.catalog.session() as s:
                repo.delete_outbox(s, [e.id for e in effects] + stale)
                repo.check_leadership(s, self.epoch)  # a deposed leader deletes nothing
            total += len(effects)
            if len(rows) < self.REPLAY_BATCH or foreign >= len(rows):
                break
        if total:
            log.info("sent %d effects left in the outbox", total)
        self.backlog = False
        return total
