"""JobManager high availability on the real stack: a ZooKeeper server, two JobManagers that elect
a leader, the ResourceManager, TaskManagers and the dispatcher as separate processes, no-op
tasks. The leader dies; the standby takes over, recovers the jobs and restarts no task."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.clusters import leader, leader_child, start_cluster
from tests.servers import missing
from tests.waiting import wait_for

SESSION_S = 3.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    from services.cluster.infrastructure import ZOOKEEPER_HOME

    if not (ZOOKEEPER_HOME / "bin" / "zkServer.sh").exists():
        missing("ZooKeeper (Debian package zookeeper)")
    c = start_cluster(
        tmp_path_factory.mktemp("ha-home"),
        catalog_url=pg_url_module,
        slots=2,
        ha=True,
        jobmanagers=2,
        zookeeper_session_timeout_s=SESSION_S,
    )
    yield c
    c.stop()


def noop(rest, jar, duration):
    return rest.run(
        jar, kind="noop", parallelism=1, restartStrategy={"type": "none"}, config={"noop.duration": duration}
    )


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_standby_takes_over_and_restarts_no_task(cluster, rest, jar, how):
    endless = noop(rest, jar, -1)
    rest.wait_attempt_running(endless, 0)
    before = leader(cluster)
    name = leader_child(cluster)
    os.killpg(cluster.child(name).proc.pid, signal.SIGKILL if how == "kill -9" else signal.SIGTERM)
    cluster.child(name).proc.wait(30)
    # Submitted with no leader: it waits in the stream for the new one.
    quick = noop(rest, jar, 0.2)
    assert rest.wait_state(quick, "FINISHED", timeout_s=60)["state"] == "FINISHED"
    after = leader(cluster)
    assert after["id"] != before["id"] and after["epoch"] > before["epoch"]
    if how == "kill -9":
        # The standby saw the dead leader's Redis connections vanish and deposed it, rather than
        # waiting for its ZooKeeper session to expire.
        standby = leader_child(cluster)
        log_text = (cluster.run_dir / "logs" / f"{standby}.log").read_text()
        assert f"deposed {before['id']} (its process is gone)" in log_text
    # The dashboard's overview names the new leader (it announces itself every 2 s).
    wait_for(
        "the overview naming the new leader",
        lambda: rest.get("/overview"),
        10,
        poll_s=0.2,
        until=lambda overview: (overview["jobmanager"] or {}).get("epoch") == after["epoch"],
    )
    assert rest.get("/overview")["jobmanager"]["id"] == after["id"]
    # The running task was not touched by the leader change; the new leader drives its job.
    assert [(a["attempt"], a["status"]) for a in rest.attempts(endless)] == [(0, "RUNNING")]
    rest.cancel(endless)
    assert rest.wait_state(endless, "CANCELED", timeout_s=30)["state"] == "CANCELED"
    cluster.respawn(name)  # back as the standby
    assert rest.wait_free_slots(4, timeout_s=30) == 4


def test_zookeeper_outage_stops_leading_and_a_leader_returns_with_it(cluster, rest, jar):
    endless = noop(rest, jar, -1)
    rest.wait_attempt_running(endless, 0)
    before = leader(cluster)
    os.killpg(cluster.child("zookeeper").proc.pid, signal.SIGKILL)
    cluster.child("zookeeper").proc.wait(10)
    # The leader cannot prove its session: it stops leading, and the overview says nobody leads.
    wait_for(
        "no JobManager announcing itself without ZooKeeper",
        lambda: rest.get("/overview")["jobmanager"],
        20,
        poll_s=0.3,
        until=lambda announced: announced is None,
    )
    waiting = noop(rest, jar, 0.2)
    time.sleep(3)
    assert rest.job(waiting)["state"] == "INITIALIZING"  # accepted, waiting for a leader
    time.sleep(5)  # a longer outage than the session timeout
    cluster.respawn("zookeeper")
    assert rest.wait_state(waiting, "FINISHED", timeout_s=60)["state"] == "FINISHED"
    assert leader(cluster)["epoch"] > before["epoch"]
    assert [(a["attempt"], a["status"]) for a in rest.attempts(endless)] == [(0, "RUNNING")]
    rest.cancel(endless)
    assert rest.wait_state(endless, "CANCELED", timeout_s=30)["state"] == "CANCELED"


def test_a_frozen_leader_woken_after_the_standby_took_over_changes_nothing(cluster, rest, jar):
    """SIGSTOP keeps the leader's sockets open (so it is not deposed as dead): the standby leads
    once the frozen leader's ZooKeeper session expires, and acts. Woken up, the old leader must
    find itself deposed and change nothing: no job is written with its epoch again, the running
    task keeps its attempt."""
    endless = noop(rest, jar, -1)
    rest.wait_attempt_running(endless, 0)
    before = leader(cluster)
    name = leader_child(cluster)
    pid = cluster.child(name).proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # The standby leads and acts: it drives a job submitted while the old leader is frozen.
        quick = noop(rest, jar, 0.2)
        assert rest.wait_state(quick, "FINISHED", timeout_s=60)["state"] == "FINISHED"
        after = leader(cluster)
        assert after["epoch"] > before["epoch"]
        # A job it starts and keeps running, for the woken leader to trip over.
        second = noop(rest, jar, -1)
        rest.wait_attempt_running(second, 0)
    finally:
        os.kill(pid, signal.SIGCONT)
    log_path = cluster.run_dir / "logs" / f"{name}.log"
    wait_for(
        "the woken leader noticing it no longer leads (its log)",
        log_path.read_text,
        30,
        poll_s=0.3,
        until=lambda text: "revoked" in text or "deposed" in text,
    )
    time.sleep(3)  # let it try whatever it had in hand
    assert leader(cluster)["epoch"] == after["epoch"]
    assert (rest.get("/overview")["jobmanager"] or {}).get("epoch") == after["epoch"]
    for job in (endless, second):
        assert [(a["attempt"], a["status"]) for a in rest.attempts(job)] == [(0, "RUNNING")]
        rest.cancel(job)
        assert rest.wait_state(job, "CANCELED", timeout_s=30)["state"] == "CANCELED"
