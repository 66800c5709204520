"""`headrace up` supervises its children: a service process that dies (kill -9 of its PID, not
of its group) is started again with the same id and the cluster works on."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import redis

from tests.clusters import start_cluster
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(tmp_path_factory.mktemp("supervision-home"), catalog_url=pg_url_module, taskmanagers=1, slots=2)
    c.supervise()
    yield c
    c.stop()


def noop(rest, jar, duration):
    return rest.run(
        jar, kind="noop", parallelism=1, restartStrategy={"type": "none"}, config={"noop.duration": duration}
    )


def kill_pid(cluster, name: str) -> int:
    """kill -9 of the process itself, as the OOM killer or an operator would."""
    pid = cluster.child(name).proc.pid
    os.kill(pid, signal.SIGKILL)
    return pid


def wait_replaced(cluster, name: str, old_pid: int, timeout_s: float = 20) -> int:
    def replaced() -> int | None:
        proc = cluster.child(name).proc
        return proc.pid if proc.pid != old_pid and proc.poll() is None else None

    try:
        return wait_for(f"{name} (pid {old_pid}) restarted", replaced, timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {cluster.supervisor.view().get(name)}") from None


def liveness_names(cluster) -> set[str]:
    with redis.Redis.from_url(cluster.redis_url) as r:
        return {c.get("name") for c in r.client_list(_type="normal") if c.get("name", "").startswith("hr-tm-")}


def runs_on(rest, jar, taskmanager_id: str) -> None:
    job = noop(rest, jar, duration=-1)
    attempt = rest.wait_attempt_running(job, 0, timeout_s=30)[-1]
    assert attempt["taskmanager-id"] == taskmanager_id
    rest.cancel(job)
    assert rest.wait_state(job, "CANCELED", timeout_s=20)["state"] == "CANCELED"


def test_a_killed_taskmanager_comes_back_with_its_id_and_takes_work(cluster, rest, jar):
    killed_at_ms = time.time() * 1000
    old = kill_pid(cluster, "taskmanager-1")
    new = wait_replaced(cluster, "taskmanager-1", old)
    # The new process opens its own liveness connection (hr-tm-<host>-<pid>-...), registers
    # tm-1 again and heartbeats: only it can, the old one is dead.
    wait_for(f"a liveness connection of pid {new}", lambda: any(f"-{new}-" in n for n in liveness_names(cluster)))
    tm = wait_for(
        "tm-1 registered again",
        lambda: (lambda t: t if t["state"] == "REGISTERED" and t["timeSinceLastHeartbeat"] > killed_at_ms else None)(
            rest.get("/taskmanagers/tm-1")
        ),
    )
    assert tm["slotsNumber"] == 2
    runs_on(rest, jar, "tm-1")

    view = cluster.supervisor.view()["taskmanager-1"]
    assert view["restarts"] == 1 and view["last_exit"] == -signal.SIGKILL
    assert json.loads((cluster.run_dir / "cluster.json").read_text())["processes"]["taskmanager-1"] == new
    assert "exited with code -9; starting it again" in cluster.child("taskmanager-1").log.read_text()


def test_a_killed_resourcemanager_comes_back_and_allocates(cluster, rest, jar):
    old = kill_pid(cluster, "resourcemanager")
    wait_replaced(cluster, "resourcemanager", old)
    # The TaskManager sees the new ResourceManager's session and registers with it; only then
    # can a job get slots.
    runs_on(rest, jar, "tm-1")
    assert cluster.supervisor.view()["resourcemanager"]["restarts"] == 1


def test_stopping_the_cluster_stops_supervision_first(tmp_path, pg_url):
    c = start_cluster(tmp_path / "home", catalog_url=pg_url, taskmanagers=1, slots=1)
    try:
        c.supervise()
        pids = {c.name: c.proc.pid for c in c.children}
    finally:
        c.stop()
    time.sleep(1.5)  # longer than the first restart's backoff
    assert all(child.proc.poll() is not None for child in c.children)
    assert {ch.name: ch.proc.pid for ch in c.children} == pids, "a child was restarted while the cluster stopped"
