"""The checkpoint pointers of ZooKeeper mode follow the catalog: written only after the unit of
work committed, so a completion the leadership check rolls back leaves no pointer; a write that
fails is retried with the next one; a new leader sets the pointers right from the catalog. An
in-memory stand-in for shared.zookeeper.ZooKeeperCheckpointStore (the real one:
tests/integration/test_zookeeper_checkpoint_store.py)."""

from __future__ import annotations

import pytest

from services.jobmanager.checkpoint_store import ZooKeeperStore
from services.jobmanager.job_master import JobMaster
from services.jobmanager.unit_of_work import LeadershipLost
from shared.catalog import repository as repo
from shared.states import ExecutionState as ES
from tests.component.harness import CONFIG, Harness, ack, triggers


class MemoryPointers:
    """What the JobManager uses of ZooKeeperCheckpointStore, in memory; `down` fails every write."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.pointers: dict[str, dict[int, dict]] = {}
        self.down = False

    def next_id(self, job_id: str, *, floor: int = 0) -> int:
        self.counters[job_id] = max(self.counters.get(job_id, 0) + 1, floor + 1)
        return self.counters[job_id]

    def _up(self) -> None:
        if self.down:
            raise ConnectionError("ZooKeeper unreachable")

    def add(self, job_id: str, checkpoint_id: int, pointer: dict) -> None:
        self._up()
        self.pointers.setdefault(job_id, {})[checkpoint_id] = {"id": checkpoint_id, **pointer}

    def remove(self, job_id: str, checkpoint_id: int) -> None:
        self._up()
        self.pointers.get(job_id, {}).pop(checkpoint_id, None)

    def remove_job(self, job_id: str) -> None:
        self._up()
        self.pointers.pop(job_id, None)
        self.counters.pop(job_id, None)

    def completed(self, job_id: str) -> list[dict]:
        self._up()
        return [p for _, p in sorted(self.pointers.get(job_id, {}).items())]


def leader(h: Harness, zk: MemoryPointers, epoch: int, leading: list[bool] | None = None) -> JobMaster:
    flag = leading if leading is not None else [True]
    jm = JobMaster(
        h.settings,
        h.catalog,
        h.t,
        h.gw,
        h.clock,
        epoch=epoch,
        checkpoint_store=ZooKeeperStore(zk),
        still_leading=lambda: flag[0],
    )
    with jm.unit_of_work():
        jm.recover()
    return jm


def running(h: Harness) -> str:
    job = h.submit(config=dict(CONFIG))
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    return job


def statuses(h: Harness, job: str) -> dict[int, str]:
    with h.catalog.session() as s:
        return {r.checkpoint_id: r.status for r in repo.list_checkpoints(s, job)}


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path)


def test_a_completion_rolled_back_by_the_leadership_check_leaves_no_pointer(h):
    zk, leading = MemoryPointers(), [True]
    h.jm = leader(h, zk, epoch=2, leading=leading)
    job = running(h)
    h.clock.advance(1.0)
    h.pump()
    [trig] = triggers(h)
    leading[0] = False  # deposed between the trigger and the acknowledgement
    with pytest.raises(LeadershipLost):
        ack(h, trig)
    assert statuses(h, job) == {trig.checkpoint_id: "IN_PROGRESS"}
    assert zk.completed(job) == []


def test_pointers_are_written_once_committed_and_pruned_with_the_catalog(h):
    zk = MemoryPointers()
    h.jm = leader(h, zk, epoch=2)
    job = running(h)
    for _ in range(3):
        h.clock.advance(1.0)
        h.pump()
        [trig] = triggers(h)
        ack(h, trig)
    assert [p["id"] for p in zk.completed(job)] == [2, 3]  # num-retained 2
    assert statuses(h, job) == {1: "DISCARDED", 2: "COMPLETED", 3: "COMPLETED"}


def test_a_failed_pointer_write_is_retried_and_a_new_leader_reconciles_from_the_catalog(h):
    zk = MemoryPointers()
    h.jm = leader(h, zk, epoch=2)
    job = running(h)
    h.clock.advance(1.0)
    h.pump()
    [first] = triggers(h)
    zk.down = True
    ack(h, first)  # committed in the catalog; the pointer write fails and waits
    zk.down = False
    assert statuses(h, job) == {1: "COMPLETED"} and zk.completed(job) == []
    h.clock.advance(1.0)
    h.pump()
    [second] = triggers(h)
    ack(h, second)  # the next write sends the one that failed first
    assert [p["id"] for p in zk.completed(job)] == [1, 2]

    zk.pointers[job].pop(2)  # lost with a leader that died between its commit and the write
    zk.pointers[job][9] = {"id": 9, "path": "/nowhere", "kind": "checkpoint"}  # never committed
    h.jm = leader(h, zk, epoch=3)
    assert [p["id"] for p in zk.completed(job)] == [1, 2]
    with h.catalog.session() as s:
        assert h.jm.checkpoints.restore_point(s, repo.get_job(s, job))[1] == 2
