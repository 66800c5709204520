"""Issue-3 scenarios on the real stack: separate RM, JM, TaskManager and dispatcher processes,
a real redis-server, a PostgreSQL catalog, jobs submitted over REST. Tasks are the no-op kind
(no Spark), so these exercise the control plane itself; Spark failover is in tests/e2e."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.clusters import start_cluster
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(tmp_path_factory.mktemp("cp-home"), catalog_url=pg_url_module, slots=4)
    yield c
    c.stop()


def noop(rest, jar, *, duration=0.5, fail_attempts=0, restart=None, parallelism=1, **config):
    return rest.run(
        jar,
        kind="noop",
        parallelism=parallelism,
        restartStrategy=restart or {"type": "none"},
        config={"noop.duration": duration, "noop.fail-attempts": fail_attempts, **config},
    )


def test_fixed_delay_fails_twice_then_finishes_with_three_attempts(rest, jar):
    job = noop(rest, jar, fail_attempts=2, restart={"type": "fixed-delay", "attempts": 3, "delay": "200 ms"})
    final = rest.wait_state(job, ("FINISHED", "FAILED"))
    assert final["state"] == "FINISHED"
    attempts = rest.attempts(job)
    assert [(a["attempt"], a["status"]) for a in attempts] == [(0, "FAILED"), (1, "FAILED"), (2, "FINISHED")]
    assert "RESTARTING" in final["timestamps"] and final["timestamps"]["RESTARTING"] > 0
    history = rest.get(f"/jobs/{job}/exceptions")["exceptionHistory"]["entries"]
    assert len(history) == 2


def test_failure_rate_exceeded_fails_the_job(rest, jar):
    job = noop(
        rest,
        jar,
        duration=0.1,
        fail_attempts=10,
        restart={
            "type": "failure-rate",
            "max-failures-per-interval": 2,
            "failure-rate-interval": "1 min",
            "delay": "100 ms",
        },
    )
    final = rest.wait_state(job, ("FINISHED", "FAILED"))
    assert final["state"] == "FAILED"
    assert len(rest.attempts(job)) == 3  # two restarts allowed, the third failure is over the rate


def test_slot_request_that_cannot_be_met_fails_with_message(rest, jar):
    job = noop(rest, jar, parallelism=5, **{"slot.request.timeout": "2 s"})
    final = rest.wait_state(job, ("FAILED",), timeout_s=30)
    root = rest.get(f"/jobs/{job}/exceptions")["root-exception"]
    # No registered TaskManager has 5 slots: refused for good once the ResourceManager has seen its
    # TaskManagers register (a heartbeat timeout after its start), else after the request's timeout.
    assert "parallelism 5 needs 5 slots on one TaskManager" in root or (
        "could not allocate 5 slots" in root and "slots free" in root
    ), root
    assert final["state"] == "FAILED"
    assert len(rest.attempts(job)) <= 1 or "could not allocate" in root  # a permanent refusal is not restarted


def test_cancel_running_job_frees_its_slots(rest, jar):
    free_before = rest.free_slots()
    job = noop(rest, jar, duration=-1, parallelism=2)
    rest.wait_running_task(job)
    assert rest.wait_free_slots(free_before - 2) == free_before - 2
    rest.cancel(job)
    assert rest.wait_state(job, "CANCELED", timeout_s=15)["state"] == "CANCELED"
    assert rest.wait_free_slots(free_before) == free_before


def test_twenty_concurrent_jobs_wait_visibly_and_start_in_submission_order(rest, jar):
    jobs = [noop(rest, jar, duration=1.0, parallelism=2) for _ in range(20)]
    # 2 TaskManagers x 4 slots = four jobs of parallelism 2 at a time; the rest wait.
    reasons = wait_for(
        "a waiting reason among the queued jobs",
        lambda: {rest.job(j).get("waiting-reason") for j in jobs[4:]} - {None},
        3,
    )
    assert any(r and r.startswith("waiting for 2 slots;") for r in reasons), reasons
    finals = [rest.wait_state(j, ("FINISHED", "FAILED", "CANCELED"), timeout_s=90) for j in jobs]
    assert [f["state"] for f in finals] == ["FINISHED"] * 20
    started = [rest.attempts(j)[0]["timestamps"]["DEPLOYING"] for j in jobs]
    # Served first come, first served: each wave of four starts no earlier than the one before.
    waves = [max(started[i : i + 4]) for i in range(0, 20, 4)]
    assert all(min(started[i + 4 : i + 8]) >= waves[i // 4] - 50 for i in range(0, 16, 4)), started


def test_killed_taskmanager_fails_over_to_the_other(cluster, rest, jar):
    job = noop(rest, jar, duration=-1, restart={"type": "fixed-delay", "attempts": 2, "delay": "100 ms"})
    rest.wait_running_task(job)
    tm = rest.attempts(job)[0]["taskmanager-id"]
    name = {"tm-1": "taskmanager-1", "tm-2": "taskmanager-2"}[tm]
    t0 = time.monotonic()
    os.killpg(cluster.child(name).proc.pid, signal.SIGKILL)
    attempts = rest.wait_attempt_running(job, 1, timeout_s=20)
    took = time.monotonic() - t0
    assert attempts[0]["status"] == "FAILED" and "TaskManager lost" in attempts[0]["failure-cause"]
    assert attempts[-1]["status"] == "RUNNING" and attempts[-1]["taskmanager-id"] != tm
    assert took < 10, f"failover took {took:.1f} s"
    rest.cancel(job)
    rest.wait_state(job, "CANCELED", timeout_s=15)
    # Leave the shared cluster as we found it: the killed TaskManager comes back.
    cluster.child(name).proc.wait(10)
    cluster.respawn(name)
    assert rest.wait_free_slots(8, timeout_s=30) == 8


def _kill_and_wait(cluster, name):
    os.killpg(cluster.child(name).proc.pid, signal.SIGKILL)
    cluster.child(name).proc.wait(10)


def test_resourcemanager_restart_keeps_tasks_running_and_taskmanagers_reregister(cluster, rest, jar):
    job = noop(rest, jar, duration=-1, parallelism=2)
    before = rest.wait_attempt_running(job, 0)
    _kill_and_wait(cluster, "resourcemanager")
    time.sleep(1)
    cluster.respawn("resourcemanager")
    # The TaskManagers see a new ResourceManager session and register again with their slot
    # reports: the running task's two slots are still allocated, nothing restarted.
    assert rest.wait_free_slots(6, timeout_s=20) == 6
    after = rest.attempts(job)
    assert [(a["attempt"], a["status"]) for a in after] == [(0, "RUNNING")]
    assert after[0]["taskmanager-id"] == before[0]["taskmanager-id"]
    tm = rest.get(f"/taskmanagers/{after[0]['taskmanager-id']}")
    assert [s["execution_id"] for s in tm["allocatedSlots"]] == [job_execution_id(rest, job)] * 2
    # And the new ResourceManager allocates: a second job runs on the remaining slots.
    other = noop(rest, jar, duration=0.2)
    assert rest.wait_state(other, "FINISHED", timeout_s=30)["state"] == "FINISHED"
    rest.cancel(job)
    assert rest.wait_state(job, "CANCELED", timeout_s=15)["state"] == "CANCELED"
    assert rest.wait_free_slots(8) == 8


def test_taskmanager_that_dies_while_the_resourcemanager_is_down_is_failed_over(cluster, rest, jar):
    job = noop(rest, jar, duration=-1, restart={"type": "fixed-delay", "attempts": 2, "delay": "100 ms"})
    tm = rest.wait_attempt_running(job, 0)[0]["taskmanager-id"]
    name = {"tm-1": "taskmanager-1", "tm-2": "taskmanager-2"}[tm]
    _kill_and_wait(cluster, "resourcemanager")
    _kill_and_wait(cluster, name)  # nobody watches: no ResourceManager runs
    cluster.respawn("resourcemanager")
    # The new ResourceManager knows the dead TaskManager only from the catalog; it never
    # registers again, so after the heartbeat timeout it is declared lost and the task moves.
    attempts = rest.wait_attempt_running(job, 1, timeout_s=40)
    assert attempts[0]["status"] == "FAILED" and "did not register again" in attempts[0]["failure-cause"]
    assert attempts[1]["taskmanager-id"] != tm
    assert rest.get(f"/taskmanagers/{tm}")["state"] == "LOST"
    rest.cancel(job)
    assert rest.wait_state(job, "CANCELED", timeout_s=15)["state"] == "CANCELED"
    cluster.respawn(name)
    assert rest.wait_free_slots(8, timeout_s=30) == 8


def test_jobmanager_restart_keeps_tasks_running_and_recovers_jobs(cluster, rest, jar):
    job = noop(rest, jar, duration=-1)
    rest.wait_attempt_running(job, 0)
    _kill_and_wait(cluster, "jobmanager")
    queued = noop(rest, jar, duration=0.2)  # submitted while no JobManager runs: must not be lost
    cluster.respawn("jobmanager")
    assert rest.wait_state(queued, "FINISHED", timeout_s=30)["state"] == "FINISHED"
    assert [(a["attempt"], a["status"]) for a in rest.attempts(job)] == [(0, "RUNNING")]
    rest.cancel(job)  # the new JobManager drives the old job to its end
    assert rest.wait_state(job, "CANCELED", timeout_s=15)["state"] == "CANCELED"


def job_execution_id(rest, job):
    return rest.attempts(job)[-1]["execution-id"]
