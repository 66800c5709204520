"""Leader election through a real ZooKeeper server (shared/zookeeper.py)."""

from __future__ import annotations

import threading
import time

from shared.zookeeper import LeaderElection


def _contender(zookeeper, name, **kw):
    e = LeaderElection(zookeeper.quorum, root="/t", contender_id=name, session_timeout_s=kw.pop("session", 4.0), **kw)
    e.start()
    return e


def _campaign_for(election, seconds, floor=0):
    deadline = time.monotonic() + seconds
    return election.campaign(stop=lambda: time.monotonic() > deadline, epoch_floor=lambda: floor, poll_s=0.2)


def test_one_leader_at_a_time_and_every_term_has_a_higher_epoch(zookeeper):
    a, b = _contender(zookeeper, "a"), _contender(zookeeper, "b")
    try:
        lease_a = _campaign_for(a, 10)
        assert lease_a is not None and lease_a.epoch == 1
        assert a.leader()["id"] == "a" and a.leader()["epoch"] == 1
        assert _campaign_for(b, 1.5) is None  # a leads: b stays standby
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("lease", _campaign_for(b, 10)))
        t.start()
        time.sleep(0.5)
        a.resign()
        t.join(15)
        assert lease_a.revoked.is_set()
        assert got["lease"] is not None and got["lease"].epoch == 2
        assert b.leader()["id"] == "b"
    finally:
        a.close()
        b.close()


def test_epoch_starts_above_the_floor_the_catalog_gives(zookeeper):
    a = _contender(zookeeper, "a")
    try:
        assert _campaign_for(a, 10, floor=41).epoch == 42
    finally:
        a.close()


def test_leadership_is_revoked_when_zookeeper_is_unreachable(zookeeper):
    a = _contender(zookeeper, "a")
    try:
        lease = _campaign_for(a, 10)
        assert lease is not None and not lease.revoked.is_set()
        zookeeper.stop()
        assert lease.revoked.wait(10), "leadership not revoked after ZooKeeper went away"
        assert "SUSPENDED" in lease.reason or "LOST" in lease.reason
    finally:
        a.close()


def test_a_leader_whose_client_goes_away_without_resigning_is_replaced(zookeeper):
    a, b = _contender(zookeeper, "a", session=2.0), _contender(zookeeper, "b")
    try:
        lease_a = _campaign_for(a, 10)
        # The client closes its session without resigning; ZooKeeper removes its nodes. (A
        # killed process's session only ends at its timeout: tests/integration/test_jobmanager_ha.py.)
        a.zk.stop()
        lease_b = _campaign_for(b, 20)
        assert lease_b is not None and lease_b.epoch == lease_a.epoch + 1
        assert b.leader()["id"] == "b"
    finally:
        b.close()
