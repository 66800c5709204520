"""Checkpoint metadata in a real ZooKeeper (HA mode): the id counter and the pointers of a job,
and a leader change in the middle of a job's checkpoints — the new leader continues the
numbering, restores from the pointers, and loses or reuses no checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.client import KazooClient

from services.jobmanager.checkpoint_store import ZooKeeperStore
from services.jobmanager.job_master import JobMaster
from shared.catalog import repository as repo
from shared.states import ExecutionState as ES
from shared.zookeeper import ZooKeeperCheckpointStore
from tests.component.harness import CONFIG, Harness, ack, triggers


@pytest.fixture
def zk(zookeeper):
    client = KazooClient(hosts=zookeeper.quorum)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


def test_counter_pointers_and_cleanup(zk):
    store = ZooKeeperCheckpointStore(zk, "/hr")
    assert [store.next_id("j1") for _ in range(3)] == [1, 2, 3]
    assert store.next_id("j1", floor=10) == 11  # never below what the catalog has seen
    assert store.next_id("j2") == 1  # one counter per job
    store.add("j1", 2, {"path": "/c/chk-2", "batch_id": 5, "kind": "checkpoint"})
    store.add("j1", 11, {"path": "/c/chk-11", "batch_id": 9, "kind": "savepoint"})
    store.add("j1", 3, {"path": "/c/chk-3", "batch_id": 7, "kind": "checkpoint"})
    assert [p["id"] for p in store.completed("j1")] == [2, 3, 11]  # numeric order, not text
    store.remove("j1", 2)
    store.remove("j1", 2)  # idempotent
    assert [p["path"] for p in store.completed("j1")] == ["/c/chk-3", "/c/chk-11"]
    store.remove_job("j1")
    assert store.completed("j1") == [] and zk.exists("/hr/jobs/j1") is None
    assert store.next_id("j2") == 2


def leader(h: Harness, zk, epoch: int) -> JobMaster:
    jm = JobMaster(
        h.settings,
        h.catalog,
        h.t,
        h.gw,
        h.clock,
        epoch=epoch,
        checkpoint_store=ZooKeeperStore(ZooKeeperCheckpointStore(zk, "/hr")),
    )
    with jm.unit_of_work():
        jm.recover()
    return jm


def test_a_new_leader_continues_numbering_and_restores_from_the_zookeeper_pointers(tmp_path, zk):
    h = Harness(tmp_path)
    h.jm = leader(h, zk, epoch=1)
    job = h.submit(config=dict(CONFIG), restart={"type": "fixed-delay", "attempts": 3, "delay": 0})
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    paths = []
    for _ in range(3):
        h.clock.advance(1.0)
        h.pump()
        [trig] = triggers(h)
        paths.append(ack(h, trig))
    pointers = ZooKeeperCheckpointStore(zk, "/hr").completed(job)
    assert [p["id"] for p in pointers] == [2, 3]  # num-retained 2: checkpoint 1 was pruned
    assert not Path(paths[0]).exists() and Path(paths[2]).exists()

    # Leader change: a pending checkpoint of the old leader is adopted and completes.
    h.clock.advance(1.0)
    h.pump()
    [pending] = triggers(h)
    h.jm = leader(h, zk, epoch=2)
    # The new leader sends the inherited trigger again under its epoch (served once by the driver).
    assert [t.checkpoint_id for t in triggers(h)] == [pending.checkpoint_id]
    ack(h, pending)
    h.clock.advance(1.0)
    h.pump()
    [next_one] = triggers(h)
    assert (pending.checkpoint_id, next_one.checkpoint_id) == (4, 5)  # no id lost or reused

    # A restart restores from the newest pointer in ZooKeeper.
    h.report(cmd, ES.FAILED, cause="boom")
    h.pump()
    [redeploy] = h.deployed()
    newest = ZooKeeperCheckpointStore(zk, "/hr").completed(job)[-1]
    assert newest["id"] == 4 and redeploy.spec.restore_from == newest["path"]
    assert redeploy.spec.restore_checkpoint_id == 4
    with h.catalog.session() as s:
        statuses = {r.checkpoint_id: r.status for r in repo.list_checkpoints(s, job)}
    assert statuses == {1: "DISCARDED", 2: "DISCARDED", 3: "COMPLETED", 4: "COMPLETED", 5: "FAILED"}


def test_pointers_go_when_the_job_ends(tmp_path, zk):
    h = Harness(tmp_path)
    h.jm = leader(h, zk, epoch=1)
    job = h.submit(config=dict(CONFIG))
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    h.clock.advance(1.0)
    h.pump()
    [trig] = triggers(h)
    path = ack(h, trig)
    assert ZooKeeperCheckpointStore(zk, "/hr").completed(job)
    h.report(cmd, ES.FINISHED)
    assert h.job(job).status == "FINISHED"
    assert zk.exists(f"/hr/jobs/{job}") is None and not Path(path).exists()
