"""The JobManager's unit of work: one catalog transaction, fenced by the leadership check, whose
messages and commands go out through the outbox only after it committed.

The job master, the checkpoint coordinator and the schedule beat all change the catalog through
it, with the same few calls: `tx()` (the session of the unit in hand, or a unit of its own),
`emit` / `command` (what to send once committed), `after_commit` (housekeeping outside the
catalog and Redis, dropped on rollback) and `queue_of` (a TaskManager's command queue). The queues
it learns also say which TaskManagers' report streams the JobManager reads (`report_streams`):
a TaskManager reports on a task only after its deploy went to its queue.

Fencing: every unit checks, as its last statement before the commit, that the leadership is
still its own (the ZooKeeper lease not revoked, the catalog's leadership row still holding its
epoch, under a row lock). A deposed leader that wakes up mid-batch commits nothing and sends
nothing; what it sent before is refused by the receivers, which accept only the current
leader's epoch (shared/leader_epoch.py).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

from sqlalchemy.orm import Session

from services.jobmanager.outbox import STREAM, Effect, Outbox
from shared import streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.errors import CoordinationError
from shared.ids import TaskManagerId
from shared.messages import DeployTask

log = logging.getLogger("headrace.jobmanager")


class LeadershipLost(CoordinationError, RuntimeError):
    """This JobManager is no longer the leader: its unit of work was rolled back."""


class UnitOfWork:
    # Batches after a failed one in which every message gets its own savepoint.
    SAFE_BATCHES_AFTER_FAILURE = 3

    def __init__(self, catalog: Catalog, outbox: Outbox, *, epoch: int, still_leading: Callable[[], bool]):
        self.catalog, self.outbox = catalog, outbox
        self.epoch, self.still_leading = epoch, still_leading
        self._batch: Session | None = None  # the session shared by one stream batch (see `batch`)
        self._effects: list[Effect] | None = None
        self._post_commit: list[Callable[[], None]] = []
        self._solo: list[list[Callable[[], None]]] = []  # after-commit actions of open lone transactions
        self._safe_batches = 0
        self._queues: dict[str, str] = {}
        self._report_streams: dict[str, None] = {}  # ordered set: streams.tm_jm_stream of each queue's TaskManager

    @property
    def grouping(self) -> bool:
        """May the batch's messages be handled set-based? Not right after a failed batch: there
        every message goes alone, in its own savepoint."""
        return not self._safe_batches

    @contextlib.contextmanager
    def batch(self) -> Iterator[Session]:
        """One transaction for every handler of a stream batch; what they decided to send goes
        out only after it committed, and the transport acknowledges the batch only after that.
        After a failed batch the next few give each message its own savepoint (see `tx`)."""
        try:
            with self.catalog.session() as s:
                self._batch, self._effects, self._post_commit = s, [], []
                try:
                    yield s
                finally:
                    self._batch = None
                # Same transaction as the decisions: they and what they send commit together.
                deleting = self.outbox.write(s, self._effects)
                self.check_leadership(s)
        except Exception:
            # The transport redelivers the whole batch; give each message its own savepoint
            # for a while so one bad message cannot keep failing its neighbours.
            self._safe_batches = self.SAFE_BATCHES_AFTER_FAILURE
            self._effects = None
            self._post_commit = []
            raise
        self.outbox.committed(deleting)
        self._safe_batches = max(0, self._safe_batches - 1)
        effects, self._effects = self._effects or [], None
        self.outbox.deliver(effects)
        post, self._post_commit = self._post_commit, []
        self._run(post)

    @staticmethod
    def _run(actions: list[Callable[[], None]]) -> None:
        for action in actions:
            try:
                action()
            except Exception:  # housekeeping (file deletion) never undoes a commit
                log.warning("post-commit action failed", exc_info=True)

    def check_leadership(self, s: Session) -> None:
        """The last statement before a commit: still the leader? (lease, then the catalog row
        under lock, so nobody can take over between the check and the commit)."""
        if not self.still_leading():
            raise LeadershipLost(
                f"leadership of epoch {self.epoch} was revoked: nothing of this unit of work is committed"
            )
        try:
            repo.check_leadership(s, self.epoch)
        except repo.StaleEpoch as exc:
            raise LeadershipLost(str(exc)) from None

    @contextlib.contextmanager
    def tx(self) -> Iterator[Session]:
        """The session to change the catalog in: the batch's, or a fenced transaction of its own."""
        if self._batch is None:
            pending: list[Callable[[], None]] = []
            self._solo.append(pending)
            try:
                with self.catalog.session() as s:
                    yield s
                    self.check_leadership(s)
            finally:
                self._solo.pop()
            self._run(pending)
        elif self._safe_batches and self._effects is not None:
            marks = len(self._effects), len(self._post_commit)
            try:
                with self._batch.begin_nested():
                    yield self._batch
            except Exception:
                # What a rolled-back handler meant to send or do is void.
                del self._effects[marks[0] :]
                del self._post_commit[marks[1] :]
                raise
        else:
            yield self._batch

    def emit(self, body: Any) -> None:
        """A message to the ResourceManager's stream, sent once committed."""
        self._add(Outbox.effect(STREAM, streams.RM_STREAM, body))

    def command(self, kind: str, queue: str, cmd: Any) -> None:
        """A command to a TaskManager's queue (`kind`: outbox.DEPLOY, CANCEL or CHECKPOINT)."""
        execution_id = cmd.spec.execution_id if isinstance(cmd, DeployTask) else cmd.execution_id
        self._add(Outbox.effect(kind, queue, cmd, execution_id))

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once the unit of work committed (dropped if it rolls back): side effects
        outside the catalog and Redis, such as deleting discarded snapshot directories."""
        if self._effects is not None:
            self._post_commit.append(action)
        elif self._solo:
            self._solo[-1].append(action)
        else:
            action()

    def _add(self, effect: Effect) -> None:
        if self._effects is None:
            self.outbox.deliver([effect])  # outside a unit of work (unit tests drive timers so)
        else:
            self._effects.append(effect)

    # --- where commands go -------------------------------------------------------------

    def learn_queue(self, taskmanager_id: TaskManagerId, queue: str) -> None:
        self._queues[taskmanager_id] = queue
        reporter = streams.reporter_of_queue(queue)
        if reporter is not None:
            self._report_streams[streams.tm_jm_stream(reporter)] = None

    def learn_queues(self, s: Session) -> None:
        """Every registered TaskManager's queue, from the catalog (a new leader's recovery)."""
        for tm in repo.list_taskmanagers(s):
            self.learn_queue(tm.id, tm.queue)

    def report_streams(self) -> list[str]:
        return list(self._report_streams)

    def queue_of(self, taskmanager_id: TaskManagerId, s: Session | None = None) -> str:
        """The Celery queue of a TaskManager: learned from slot offers, else from the catalog."""
        if taskmanager_id not in self._queues and s is not None:
            try:
                self.learn_queue(taskmanager_id, repo.get_taskmanager(s, taskmanager_id).queue)
            except repo.NotFound:
                pass
        return self._queues.get(taskmanager_id, streams.tm_queue(taskmanager_id))
