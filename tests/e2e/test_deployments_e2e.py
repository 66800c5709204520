"""A deployment of the counting pipeline through its whole lifecycle, on `headrace up --ha`'s
processes (ZooKeeper, two JobManagers, the ResourceManager, two TaskManagers with warm drivers,
the dispatcher), a PostgreSQL catalog and sink, and an outside producer writing all along:

  apply v1 -> STABLE
  apply v2 (a compatible change of code) -> UPGRADING -> STABLE: a new job from the stop savepoint
  apply v3 (fails in its first micro-batch) -> ROLLED_BACK to v2, from the savepoint v2 stopped with
  apply v4 (another grouping key: incompatible state) -> 400 before anything stops; v2's job runs on
  suspend and resume as the CLI does (v3's spec sent back) -> the job FINISHED with a savepoint, then
  v2 again from it, ROLLED_BACK still: the rolled-back v3 is not run
  apply v5, kill -9 of the leading JobManager while it upgrades -> the new leader completes it
and at the end every key's count and sum in the sink is exact: nothing lost, nothing twice.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.clusters import Rest, leader, leader_child, start_cluster
from tests.e2e.counting import CHECKPOINT_INTERVAL, TRIGGER, Producer, expected_totals, sql_totals
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
NAME = "counts"
TABLE = "e2e_deployment_counts"
READY_WITHIN_S = 60
PUT_TIMEOUT_S = 300  # a changed pipeline is planned first (a cold Spark: 15-30 s, more when loaded)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    from services.cluster.infrastructure import ZOOKEEPER_HOME

    if not (ZOOKEEPER_HOME / "bin" / "zkServer.sh").exists():
        pytest.skip("ZooKeeper (Debian package zookeeper) is not installed")
    # Warm drivers with their warm-up query, as users run them (the suite's default skips it): the
    # autoscaler drill judges capacity from batch times, and a task's first batches on cold code
    # paths made 20 events/s look like a saturated core on a loaded machine.
    c = start_cluster(
        tmp_path_factory.mktemp("deploy-e2e"),
        catalog_url=pg_url_module,
        taskmanagers=2,
        slots=2,
        warm_drivers=1,
        ha=True,
        jobmanagers=2,
        zookeeper_session_timeout_s=3.0,
        warm_up_query=True,
        warm_planner=True,
    )
    yield c, pg_url_module
    c.stop()


def pipelines(rest: Rest, tmp: Path) -> dict[str, str]:
    source = (ROOT / "examples" / "keyed_counts.py").read_text()
    v2 = tmp / "keyed_counts_v2.py"
    v2.write_text(
        source.replace(
            'p = argparse.ArgumentParser(prog="keyed_counts")',
            'p = argparse.ArgumentParser(prog="keyed_counts", description="v2")',
        )
    )
    by_parity = tmp / "keyed_counts_by_parity.py"
    by_parity.write_text(
        source.replace('events.groupBy("key")', 'events.groupBy("key", (F.col("value") % 2).alias("parity"))')
    )
    return {
        "v1": rest.upload(ROOT / "examples" / "keyed_counts.py"),
        "v2": rest.upload(v2),
        "parity": rest.upload(by_parity),
    }


def spec(jar: str, args: list[str], **config) -> dict:
    return {
        "jarId": jar,
        "programArgsList": args,
        "parallelism": 1,
        "flinkConfiguration": {"execution.checkpointing.interval": CHECKPOINT_INTERVAL, **config},
        "restartStrategy": {"type": "fixed-delay", "attempts": 10, "delay": "1 s"},
        "upgradeMode": "savepoint",
        "rollback": {"enabled": True, "readyWithin": f"{READY_WITHIN_S} s"},
    }


def put(rest: Rest, body: dict) -> dict:
    r = rest.http.put(f"/deployments/{NAME}", json=body, timeout=PUT_TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def status(rest: Rest) -> dict:
    return rest.get(f"/deployments/{NAME}")["status"]


def wait_lifecycle(rest: Rest, state: str, generation: int | None = None, timeout_s: float = 300) -> dict:
    def reached():
        st = status(rest)
        ok = st["lifecycleState"] == state and (generation is None or st["jobGeneration"] == generation)
        return st if ok else None

    return wait_for(f"deployment {NAME} {state} at generation {generation}", reached, timeout_s, poll_s=0.25)


def test_a_deployment_upgrades_rolls_back_refuses_suspends_and_survives_a_leader_kill(cluster, tmp_path):
    c, pg = cluster
    rest = Rest(c.dispatcher_url)
    producer = Producer(c.redis_url, "e2e-deployment").start()
    jars = pipelines(rest, tmp_path)
    args = ["--stream", "e2e-deployment", "--sink", "sql", "--table", TABLE, "--sink-url", pg, "--trigger", TRIGGER]
    try:
        put(rest, spec(jars["v1"], args))
        v1 = wait_lifecycle(rest, "STABLE", 1)

        put(rest, spec(jars["v2"], args))
        v2 = wait_lifecycle(rest, "STABLE", 2)
        assert v2["jobId"] != v1["jobId"] and rest.job(v1["jobId"])["state"] == "FINISHED"
        assert "savepoint" in (rest.attempts(v2["jobId"])[0]["restored-from"] or "")

        # v3: the sink's database does not exist and the sink may not wait: its first batch fails.
        broken = [pg.rsplit("/", 1)[0] + "/no_such_database" if a == pg else a for a in args]
        t0 = time.monotonic()
        put(rest, spec(jars["v2"], broken, **{"sink.max-retry-time": "0 s"}))
        back = wait_lifecycle(rest, "ROLLED_BACK", timeout_s=READY_WITHIN_S + 10 + 60)
        rolled_back_s = time.monotonic() - t0
        assert back["jobGeneration"] == 2 and back["error"], back
        print(f"deployment e2e: v3 applied -> v2 RUNNING again after {rolled_back_s:.1f} s", flush=True)

        # v4: another grouping key; refused before anything is stopped.
        running = back["jobId"]
        r = rest.http.put(f"/deployments/{NAME}", json=spec(jars["parity"], args), timeout=PUT_TIMEOUT_S)
        assert r.status_code == 400 and "before anything was stopped" in r.text, r.text
        assert status(rest)["jobId"] == running and rest.job(running)["state"] == "RUNNING"
        assert rest.get(f"/deployments/{NAME}")["generation"] == 3

        # Suspend and resume as `headrace deploy suspend|resume` do: the current spec (v3's, rolled
        # back) sent back with another state. Resuming runs what ran, v2, from the suspension's
        # savepoint; v3 is not started again.
        current = rest.get(f"/deployments/{NAME}")["spec"]
        put(rest, {**current, "state": "suspended"})
        suspended = wait_lifecycle(rest, "SUSPENDED")
        assert rest.job(running)["state"] == "FINISHED" and suspended["lastSavepoint"]
        put(rest, {**current, "state": "running"})
        resumed = wait_lifecycle(rest, "ROLLED_BACK", 2)
        assert rest.attempts(resumed["jobId"])[0]["restored-from"] == suspended["lastSavepoint"]
        history = [e["to"] for e in resumed["history"]]
        assert history[len(history) - history[::-1].index("SUSPENDED") :] == ["DEPLOYING", "ROLLED_BACK"], history

        # v5 (another trigger interval), with the leading JobManager killed in the middle of it.
        v5_gen = put(rest, spec(jars["v2"], [*args[:-1], "400 milliseconds"]))["generation"]
        wait_for("the upgrade to start", lambda: status(rest)["lifecycleState"] == "UPGRADING", 60, poll_s=0.25)
        before = leader(c)["epoch"]
        victim = leader_child(c)
        os.killpg(c.child(victim).proc.pid, signal.SIGKILL)
        c.child(victim).proc.wait(30)
        v5 = wait_lifecycle(rest, "STABLE", v5_gen)
        assert leader(c)["epoch"] > before
        assert v5["jobId"] != resumed["jobId"]
        time.sleep(3)  # a few batches of v5
    finally:
        produced = producer.stop()
    expected = expected_totals(produced)
    wait_for(f"the sink to hold exactly {produced} events", lambda: sql_totals(pg, TABLE) == expected, 180, poll_s=0.25)
    assert rest.http.delete(f"/deployments/{NAME}").status_code == 202
    wait_for(
        "the deployment to be deleted",
        lambda: rest.http.get(f"/deployments/{NAME}").status_code == 404,
        120,
        poll_s=0.25,
    )


# --- the autoscaler on the same cluster -------------------------------------------------------
SCALED = "scaled"
SCALED_TABLE = "e2e_autoscaled_counts"
# Per event: one core does 200 events/s, two 400. The sleep outweighs what Spark, Arrow and the
# Python worker cost per row, which do not double with the cores on two loaded ones.
COST_MS = 5.0
# The way down is judged on the low capacity estimate (the shortest batch ever seen as the fixed
# cost): with the machine's cores shared (the suite's other xdist worker), batches' fixed part
# grows and at 50/s parallelism 2 looked right for 4 minutes. 20/s is well inside one core even so.
LOW_RATE, HIGH_RATE = 20, 300


def last_evaluations(rest: Rest, n: int = 6) -> list[str]:
    """The newest evaluations, also printed whole (an assertion's message is cut short)."""
    out = [
        f"{e['outcome']} {e['parallelism']}->{e['proposed']}: {e['reason']} {e['figures']}"
        for e in rest.get(f"/deployments/{SCALED}/autoscaler?limit={n}")["evaluations"]
    ]
    print("autoscaler e2e: the last evaluations:", *out, sep="\n  ", flush=True)
    return out


def scaled_parallelism(rest: Rest) -> int | None:
    st = rest.get(f"/deployments/{SCALED}")["status"]
    if st["lifecycleState"] != "STABLE" or not st["jobId"]:
        return None
    return rest.job(st["jobId"])["vertices"][0]["parallelism"]


def test_the_autoscaler_follows_the_input_up_and_down_with_exact_counts(cluster, tmp_path):
    c, pg = cluster
    rest = Rest(c.dispatcher_url)
    stream = "e2e-autoscaled"
    producer = Producer(c.redis_url, stream, rate=LOW_RATE).start()
    jar = rest.upload(ROOT / "tests" / "e2e" / "slow_counts.py")
    body = {
        **spec(jar, ["--stream", stream, "--table", SCALED_TABLE, "--sink-url", pg, "--cost-ms", str(COST_MS)]),
        "autoscaler": {
            "enabled": True,
            "minParallelism": 1,
            "maxParallelism": 2,
            "metricsWindow": "20 s",
            "stabilization": "20 s",
            "catchUp": "1 min",
        },
    }
    try:
        r = rest.http.put(f"/deployments/{SCALED}", json=body, timeout=PUT_TIMEOUT_S)
        assert r.status_code == 200, r.text
        wait_for("the scaled deployment STABLE at 1", lambda: scaled_parallelism(rest) == 1, 300, poll_s=0.25)
        job = rest.get(f"/deployments/{SCALED}")["status"]["jobId"]

        # An input one core handles easily: it stays at 1, having looked.
        def kept() -> list[dict]:
            evaluations = rest.get(f"/deployments/{SCALED}/autoscaler")["evaluations"]
            return [e for e in evaluations if e["outcome"] == "keep"][2:]

        try:
            wait_for("three evaluations that keep parallelism 1", kept, 120, poll_s=0.25)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its last evaluations: {last_evaluations(rest, 12)}") from None
        assert scaled_parallelism(rest) == 1, last_evaluations(rest, 12)

        # Above one core: parallelism 2 within 60 s of the rise, the same job, and the lag drains.
        producer.set_rate(HIGH_RATE)
        t_rise = time.monotonic()
        try:
            wait_for(
                "the autoscaler to decide parallelism 2",
                lambda: rest.get(f"/deployments/{SCALED}")["status"]["parallelism"] == 2,
                60,
                poll_s=0.25,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its last evaluations: {last_evaluations(rest)}") from None
        decided_s = time.monotonic() - t_rise
        wait_for("the job RUNNING at parallelism 2", lambda: scaled_parallelism(rest) == 2, 120, poll_s=0.25)
        assert rest.get(f"/deployments/{SCALED}")["status"]["jobId"] == job
        print(
            f"autoscaler e2e: rise -> decision {decided_s:.1f} s, -> RUNNING at 2 {time.monotonic() - t_rise:.1f} s",
            flush=True,
        )
        # The peak outlasts the stabilization: the task at 2 is evaluated keeping up with it, its
        # lag under a second of input. (Those batches are also the throughput it has shown, on
        # which the way down is judged when the machine's load inflates every batch's fixed part.)
        try:
            wait_for(
                "an evaluation at parallelism 2 keeping up with the peak",
                lambda: [
                    e
                    for e in rest.get(f"/deployments/{SCALED}/autoscaler")["evaluations"]
                    if e["parallelism"] == 2
                    and e["outcome"] == "keep"
                    and e["figures"].get("lag", HIGH_RATE) < HIGH_RATE
                ],
                120,
                poll_s=0.25,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its last evaluations: {last_evaluations(rest)}") from None

        # Back to a low input: 1 again after the stabilization.
        producer.set_rate(LOW_RATE)
        try:
            wait_for("the job back at parallelism 1", lambda: scaled_parallelism(rest) == 1, 240, poll_s=0.25)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its last evaluations: {last_evaluations(rest)}") from None
        last_evaluations(rest, 3)  # the way down's figures, in the test's output
    finally:
        produced = producer.stop()
    expected = expected_totals(produced)
    wait_for(
        f"the sink to hold exactly {produced} events",
        lambda: sql_totals(pg, SCALED_TABLE) == expected,
        300,
        poll_s=0.25,
    )
    evaluations = rest.get(f"/deployments/{SCALED}/autoscaler")["evaluations"]
    rescales = [
        (e["outcome"], e["parallelism"], e["proposed"]) for e in evaluations if e["parallelism"] != e["proposed"]
    ]
    assert rescales == [("scale-up", 1, 2), ("scale-down", 2, 1)], rescales
    assert rest.http.delete(f"/deployments/{SCALED}?savepoint=false").status_code == 202
