"""The JobManager's transactional outbox (services/jobmanager/outbox.py) on a real SQLite catalog
and the in-memory bus: what a unit of work decided goes out only after its commit, stays in the
catalog while it cannot be sent, is never sent under another leader's epoch, and is handed to a
new leader to decide again instead of being sent as it is."""

from __future__ import annotations

import pytest

from services.jobmanager.outbox import CANCEL, DEPLOY, STREAM, Outbox
from shared import streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.catalog.repository.rows import StaleEpoch
from shared.messages import CancelTask, ReleaseSlots
from shared.settings import Settings
from shared.transport import InMemoryTransport


class Gateway:
    """The TaskManagers' command queues, recorded; `down` makes every send fail as Redis would."""

    def __init__(self):
        self.sent: list[tuple[str, str, object]] = []
        self.down = False

    def _send(self, kind, queue, cmd):
        if self.down:
            raise ConnectionError("Redis is down")
        self.sent.append((kind, queue, cmd))

    def deploy(self, queue, cmd):
        self._send("deploy", queue, cmd)

    def cancel(self, queue, cmd):
        self._send("cancel", queue, cmd)

    def trigger_checkpoint(self, queue, cmd):
        self._send("checkpoint", queue, cmd)


class FailingTransport(InMemoryTransport):
    down = False

    def publish_many(self, items, **kw):
        if self.down:
            raise ConnectionError("Redis is down")
        super().publish_many(items, **kw)


@pytest.fixture
def catalog(tmp_path):
    c = Catalog(Settings(home=tmp_path).catalog)
    c.migrate()
    with c.session() as s:
        repo.claim_leadership(s, 1, "jm-1")
    return c


def leader(catalog, epoch=1):
    transport, gateway = FailingTransport(sender="jobmanager", epoch=epoch), Gateway()
    return Outbox(catalog, transport, gateway, sender="jobmanager", epoch=epoch), transport, gateway


def release(n: int) -> ReleaseSlots:
    return ReleaseSlots(allocation_id=f"alloc-{n}", reason="test")


def cancel(n: int) -> CancelTask:
    return CancelTask(taskmanager_id="tm-1", execution_id=f"ex-{n}", job_id="job")


def commit(catalog, outbox, effects) -> None:
    """A unit of work: the effects written in its transaction, sent after the commit."""
    with catalog.session() as s:
        deleting = outbox.write(s, effects)
    outbox.committed(deleting)
    outbox.deliver(effects)


def pending_ids(catalog) -> list[str]:
    with catalog.session() as s:
        return [r.id for r in repo.pending_outbox(s, limit=None)]


def test_effects_are_sent_after_the_commit_and_deleted_by_the_next_transaction(catalog):
    outbox, transport, gateway = leader(catalog)
    effects = [outbox.effect(STREAM, streams.RM_STREAM, release(1)), outbox.effect(CANCEL, "tm.tm-1", cancel(1))]
    commit(catalog, outbox, effects)
    assert transport.bodies(streams.RM_STREAM) == [release(1)]
    assert gateway.sent == [("cancel", "tm.tm-1", cancel(1))]
    assert sorted(pending_ids(catalog)) == sorted(e.id for e in effects)  # sent, deleted with the next unit
    commit(catalog, outbox, [])
    assert pending_ids(catalog) == []


def test_an_idle_leader_deletes_what_it_sent_without_waiting_for_the_next_unit_of_work(catalog):
    outbox, _, _ = leader(catalog)
    commit(catalog, outbox, [outbox.effect(STREAM, streams.RM_STREAM, release(1))])
    outbox.forget_sent()
    assert pending_ids(catalog) == []


def test_what_could_not_be_sent_stays_in_the_catalog_and_replay_sends_it_in_order(catalog):
    outbox, transport, gateway = leader(catalog)
    transport.down = gateway.down = True
    effects = [outbox.effect(STREAM, streams.RM_STREAM, release(n)) for n in range(3)]
    commit(catalog, outbox, effects)  # committed; the send failed and nothing was raised
    assert outbox.backlog
    assert len(pending_ids(catalog)) == 3
    with pytest.raises(ConnectionError):
        outbox.replay()  # still down: the loop tries again later
    assert len(pending_ids(catalog)) == 3
    transport.down = gateway.down = False
    assert outbox.replay() == 3
    assert transport.bodies(streams.RM_STREAM) == [release(0), release(1), release(2)]
    assert pending_ids(catalog) == [] and not outbox.backlog


def test_replay_drops_a_deploy_whose_attempt_is_no_longer_deploying(catalog):
    outbox, _, gateway = leader(catalog)
    gateway.down = True
    # The outbox does not read a command's body: a deploy naming no DEPLOYING attempt is stale.
    commit(catalog, outbox, [outbox.effect(DEPLOY, "tm.tm-1", cancel(1), execution_id="gone")])
    gateway.down = False
    assert outbox.replay() == 0
    assert gateway.sent == [] and pending_ids(catalog) == []


def test_a_leader_never_sends_what_another_epoch_committed(catalog):
    old, _, old_gateway = leader(catalog, epoch=1)
    old_gateway.down = True
    commit(catalog, old, [old.effect(CANCEL, "tm.tm-1", cancel(1))])
    with catalog.session() as s:
        repo.claim_leadership(s, 2, "jm-2")
    new, _, new_gateway = leader(catalog, epoch=2)
    assert new.replay() == 0
    assert new_gateway.sent == []
    assert len(pending_ids(catalog)) == 1  # left for take_over to decide


def test_a_new_leader_takes_older_epochs_entries_over_to_decide_them_again(catalog):
    old, _, old_gateway = leader(catalog, epoch=1)
    old_gateway.down = True
    effect = old.effect(CANCEL, "tm.tm-1", cancel(7), execution_id="ex-7")
    commit(catalog, old, [effect])
    with catalog.session() as s:
        repo.claim_leadership(s, 2, "jm-2")
    new, _, new_gateway = leader(catalog, epoch=2)
    with catalog.session() as s:
        inherited = new.take_over(s)
    assert [(e.id, e.kind, e.target, e.body, e.execution_id) for e in inherited] == [
        (effect.id, CANCEL, "tm.tm-1", cancel(7), "ex-7")
    ]
    assert pending_ids(catalog) == [] and new_gateway.sent == []


def test_a_deposed_leaders_replay_deletes_nothing(catalog):
    old, _, gateway = leader(catalog, epoch=1)
    gateway.down = True
    commit(catalog, old, [old.effect(CANCEL, "tm.tm-1", cancel(1))])
    with catalog.session() as s:
        repo.claim_leadership(s, 2, "jm-2")
    gateway.down = False
    with pytest.raises(StaleEpoch):
        old.replay()
    assert len(pending_ids(catalog)) == 1
