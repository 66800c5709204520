"""Which JobManager messages the ResourceManager obeys (Flink's fenced ResourceManagerGateway).

A message is the JobManager's if its sender is "jobmanager" or its type is one only the
JobManager may send (`RequestSlots`, `ReleaseSlots`, `CancelSlotRequest`). It is obeyed only if
both hold and its epoch is the current leader's, as published in Redis
(shared/leader_epoch.py); never "the highest epoch seen", or one forged message with a future
epoch would make every real one after it stale.

The published epoch can be missing for a moment (Redis restarted empty; the leader publishes it
again every 2 s). Messages that arrive meanwhile are held, in order, for up to `hold_s` and
judged once it is back; refusing them would lose a slot request nobody sends again. They are
held in memory, acknowledged in the stream: a ResourceManager that restarts meanwhile loses
them, and the JobManager sends its requests again when it hears `ResourceManagerStarted`.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from typing import Callable

from shared.leader_epoch import LeaderEpochFence
from shared.messages import CancelSlotRequest, Envelope, ReleaseSlots, RequestSlots

log = logging.getLogger("headrace.resourcemanager")

JOBMANAGER = "jobmanager"
JOBMANAGER_ONLY = (RequestSlots, ReleaseSlots, CancelSlotRequest)


class Verdict(enum.Enum):
    ACCEPT = "accept"
    REFUSE = "refuse"
    HOLD = "hold"  # the current epoch is not known yet: ask again later


def from_jobmanager(env: Envelope) -> bool:
    return env.sender == JOBMANAGER or isinstance(env.body, JOBMANAGER_ONLY)


class JobManagerFence:
    def __init__(self, epochs: LeaderEpochFence, *, clock: Callable[[], float], hold_s: float = 10.0):
        self.epochs, self.clock, self.hold_s = epochs, clock, hold_s
        self.held: deque[tuple[float, Envelope]] = deque()
        self.refused = 0

    def admit(self, env: Envelope) -> bool:
        """Handle `env` now? Otherwise it is held (see `release`) or refused and logged."""
        if not from_jobmanager(env):
            return True
        if self.held:  # keep the JobManager's order: nothing overtakes a held message
            self.held.append((self.clock(), env))
            return False
        verdict, why = self.judge(env)
        if verdict is Verdict.HOLD:
            log.warning("holding %s until the leader epoch is published again (%s)", env.body.type, why)
            self.held.append((self.clock(), env))
        elif verdict is Verdict.REFUSE:
            self._refuse(env, why)
        return verdict is Verdict.ACCEPT

    def release(self) -> list[Envelope]:
        """Held messages that may be handled now, in order; refused or expired ones are dropped."""
        out = []
        while self.held:
            since, env = self.held[0]
            verdict, why = self.judge(env)
            if verdict is Verdict.HOLD and self.clock() - since < self.hold_s:
                break
            self.held.popleft()
            if verdict is Verdict.ACCEPT:
                out.append(env)
            else:
                self._refuse(env, why if verdict is Verdict.REFUSE else f"{why} for {self.hold_s:g} s")
        return out

    def _refuse(self, env: Envelope, why: str) -> None:
        self.refused += 1
        log.warning("refusing %s %s from %s: %s", env.body.type, env.message_id, env.sender, why)

    def judge(self, env: Envelope) -> tuple[Verdict, str]:
        """(verdict, why) for a message `from_jobmanager`."""
        if env.sender != JOBMANAGER:
            return Verdict.REFUSE, f"only the JobManager sends {env.body.type}, not {env.sender!r}"
        if self.epochs.accept(env.epoch):
            return Verdict.ACCEPT, ""
        if self.epochs.epoch is None:
            return Verdict.HOLD, "the current leader epoch is not published (yet)"
        return Verdict.REFUSE, f"epoch {env.epoch} is not the current leader's ({self.epochs.epoch})"
