"""Deployments: how long an upgrade and a rollback take, side by side with doing the same by hand
over REST, on one warm cluster (2 TaskManagers, 1 warm driver each, PostgreSQL catalog and sink)
with an outside producer writing 200 events/s all along. One pipeline runs at a time: in each run
the deployment's cases, then the deployment is suspended and a job run by hand from its savepoint
(into its own table) takes its turn, then the deployment resumes; runs repeat, so both ways meet
the same machine. Before each case the bench waits (at most 60 s) for a warm driver and says
whether one was ready.

  upgrade       PUT of a changed spec (another checkpoint interval: no planning needed) -> the new
                job's task RUNNING -> its first micro-batch committed (the new generation's first
                result). By hand: POST /jobs/{id}/stop, poll the savepoint, POST /jars/{id}/run
                from it with the new configuration, the same two marks.
  code change   the same with a changed pipeline file: the PUT first plans it in a cold Spark
                (the compatibility check), so its answer alone is reported too.
  rollback      PUT of a generation that fails in its first micro-batch (its sink database does
                not exist), readyWithin 20 s -> the previous generation's task RUNNING again. By
                hand, as a script would at best: poll until the new job restarts, cancel it,
                run the old jar from the stop savepoint -> RUNNING.

usage: python bench/deployment_upgrade.py [--runs 2]
Figures go to docs/benchmarks.md ("Deployments").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.checkpoint_overhead import drop_pg, fresh_pg
from bench.submit_latency import wait_warm
from shared import streams
from tests.clusters import Rest, start_cluster
from tests.e2e.counting import Producer

ROOT = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get("HEADRACE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
READY_WITHIN_S = 60  # the upgrades'; the failing generation is given ROLLBACK_READY_WITHIN_S
ROLLBACK_READY_WITHIN_S = 20
STREAM = "bench-deploy"


def settle(cluster, timeout_s: float = 60) -> bool:
    """Before a run: a warm driver ready on some TaskManager (the running jobs hold the others, and
    a TaskManager with a task running does not warm up more), or the run goes ahead cold after
    `timeout_s`. Returns whether one was ready."""
    client = redis.Redis.from_url(cluster.redis_url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for tm in ("tm-1", "tm-2"):
            raw = client.get(streams.tm_warm_key(tm))
            if raw and json.loads(raw)["ready"] >= 1:
                return True
        time.sleep(0.2)
    return False


def first_batch(catalog_url: str, job_id: str) -> bool:
    with psycopg.connect(catalog_url) as c:
        row = c.execute("SELECT max(last_batch_id) FROM executions WHERE job_id = %s", (job_id,)).fetchone()
    return row is not None and row[0] is not None


def wait(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout_s} s waiting for {what}")


class Bench:
    def __init__(self, rest: Rest, catalog_url: str, sink_url: str, jars: dict[str, str]):
        self.rest, self.catalog_url, self.sink_url, self.jars = rest, catalog_url, sink_url, jars
        self.args = [
            "--stream",
            STREAM,
            "--sink",
            "sql",
            "--table",
            "bench_deploy",
            "--sink-url",
            sink_url,
            "--trigger",
            "500 milliseconds",
        ]
        self.interval = 1

    def spec(self, jar: str, args: list[str] | None = None, ready_within_s: float = READY_WITHIN_S, **config) -> dict:
        return {
            "jarId": jar,
            "programArgsList": args or self.args,
            "flinkConfiguration": {"execution.checkpointing.interval": f"{self.interval} s", **config},
            "restartStrategy": {"type": "fixed-delay", "attempts": 10, "delay": "1 s"},
            "rollback": {"readyWithin": f"{ready_within_s} s"},
        }

    def status(self, name: str) -> dict:
        return self.rest.get(f"/deployments/{name}")["status"]

    def running(self, job_id: str) -> bool:
        attempts = self.rest.attempts(job_id)
        return bool(attempts) and attempts[-1]["status"] == "RUNNING"

    def marks(self, t0: float, job_of) -> dict[str, float]:
        job = wait(job_of, 300, "the new job")
        wait(lambda: self.running(job), 300, "the new job RUNNING")
        out = {"running": time.monotonic() - t0}
        wait(lambda: first_batch(self.catalog_url, job), 300, "the new job's first batch")
        out["first_result"] = time.monotonic() - t0
        return out

    # --- the deployment's way ------------------------------------------------------------

    def deploy_upgrade(self, name: str, jar: str) -> dict[str, float]:
        old = self.status(name)["jobId"]
        self.interval = 3 - self.interval  # 1 s <-> 2 s: a change of configuration only
        t0 = time.monotonic()
        r = self.rest.http.put(f"/deployments/{name}", json=self.spec(jar), timeout=300)
        assert r.status_code == 200, r.text
        answered = time.monotonic() - t0
        gen = r.json()["generation"]

        def new_job():
            st = self.status(name)
            return st["jobId"] if st["jobGeneration"] == gen and st["jobId"] != old else None

        out = {"put_answered": answered, **self.marks(t0, new_job)}
        wait(lambda: self.status(name)["lifecycleState"] == "STABLE", 120, "STABLE")
        out["stable"] = time.monotonic() - t0
        return out

    def deploy_rollback(self, name: str, jar: str) -> dict[str, float]:
        broken = [self.sink_url.rsplit("/", 1)[0] + "/no_such_database" if a == self.sink_url else a for a in self.args]
        stable_job = self.status(name)["jobId"]
        bad = self.spec(jar, broken, ROLLBACK_READY_WITHIN_S, **{"sink.max-retry-time": "0 s"})
        r = self.rest.http.put(f"/deployments/{name}", json=bad, timeout=300)
        assert r.status_code == 200, r.text
        t0 = time.monotonic()  # from the answer: the check is the upgrade's figure

        def back():
            st = self.status(name)
            return (
                st["jobId"]
                if st["lifecycleState"] in ("ROLLING_BACK", "ROLLED_BACK")
                and st["jobId"] not in (stable_job,)
                and st["jobGeneration"] != r.json()["generation"]
                else None
            )

        out = self.marks(t0, back)
        wait(lambda: self.status(name)["lifecycleState"] == "ROLLED_BACK", 120, "ROLLED_BACK")
        out["rolled_back"] = time.monotonic() - t0
        # Back to a clean STABLE for the next run: the same spec as the stable one again.
        r = self.rest.http.put(f"/deployments/{name}", json=self.spec(jar), timeout=300)
        wait(lambda: self.status(name)["lifecycleState"] == "STABLE", 300, "STABLE again")
        return out

    def put_state(self, name: str, spec: dict, state: str) -> None:
        r = self.rest.http.put(f"/deployments/{name}", json={**spec, "state": state}, timeout=300)
        assert r.status_code == 200, r.text
        want = "SUSPENDED" if state == "suspended" else "STABLE"
        wait(lambda: self.status(name)["lifecycleState"] == want, 300, f"deployment {name} {want}")

    # --- by hand ---------------------------------------------------------------------------

    def stop_with_savepoint(self, job: str) -> str:
        r = self.rest.http.post(f"/jobs/{job}/stop", json={})
        assert r.status_code == 202, r.text
        rid = r.json()["request-id"]

        def done():
            st = self.rest.get(f"/jobs/{job}/savepoints/{rid}")
            return st["operation"].get("location") if st["status"]["id"] == "COMPLETED" else None

        location = wait(done, 120, "the stop savepoint")
        wait(lambda: self.rest.job(job)["state"] == "FINISHED", 60, "the job FINISHED")
        return location

    def run_from(self, jar: str, savepoint: str, args: list[str] | None = None, **config) -> str:
        spec = self.spec(jar, args, **config)
        return self.rest.run(
            jar,
            programArgsList=spec["programArgsList"],
            flinkConfiguration=spec["flinkConfiguration"],
            restartStrategy=spec["restartStrategy"],
            savepointPath=savepoint,
        )

    def hand_upgrade(self, job: str, jar: str) -> tuple[dict[str, float], str]:
        self.interval = 3 - self.interval
        t0 = time.monotonic()
        savepoint = self.stop_with_savepoint(job)
        new = self.run_from(jar, savepoint)
        return self.marks(t0, lambda: new), new

    def hand_rollback(self, job: str, jar: str) -> tuple[dict[str, float], str]:
        savepoint = self.stop_with_savepoint(job)
        broken = [self.sink_url.rsplit("/", 1)[0] + "/no_such_database" if a == self.sink_url else a for a in self.args]
        bad = self.run_from(jar, savepoint, broken, **{"sink.max-retry-time": "0 s"})
        t0 = time.monotonic()
        wait(
            lambda: len(self.rest.attempts(bad)) >= 3 or self.rest.job(bad)["state"] == "FAILED",
            120,
            "the broken job's second restart",
        )
        self.rest.cancel(bad)
        wait(lambda: self.rest.job(bad)["state"] in ("CANCELED", "FAILED"), 60, "the broken job to end")
        good = self.run_from(jar, savepoint)
        return self.marks(t0, lambda: good), good


def summary(name: str, runs: list[dict[str, float]]) -> None:
    keys = runs[0].keys()
    cells = ", ".join(
        f"{k} {statistics.median(r[k] for r in runs):.2f} s [{' '.join(f'{r[k]:.2f}' for r in runs)}]" for k in keys
    )
    print(f"{name:28} median (runs): {cells}", flush=True)


def main() -> None:
    # SIGTERM (a timeout, a kill) ends the run through `finally`: the cluster is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="hr-bench-deploy-"))
    catalog_url, sink_url = fresh_pg(ADMIN_URL), fresh_pg(ADMIN_URL)
    cluster = start_cluster(home, catalog_url=catalog_url, taskmanagers=2, slots=2, warm_drivers=1)
    producer = None
    try:
        rest = Rest(cluster.dispatcher_url)
        producer = Producer(cluster.redis_url, STREAM, rate=200).start()
        source = (ROOT / "examples" / "keyed_counts.py").read_text()
        changed = home / "keyed_counts_changed.py"
        changed.write_text(source + "\n# changed\n")
        jars = {"v1": rest.upload(ROOT / "examples" / "keyed_counts.py"), "changed": rest.upload(changed)}
        b = Bench(rest, catalog_url, sink_url, jars)
        wait_warm(cluster, 1)
        r = rest.http.put("/deployments/bench", json=b.spec(jars["v1"]), timeout=300)
        assert r.status_code == 200, r.text
        wait(lambda: b.status("bench")["lifecycleState"] == "STABLE", 300, "the first STABLE")
        b_hand = Bench(rest, catalog_url, sink_url, jars)
        b_hand.args = [*b.args[:5], "bench_hand", *b.args[6:]]  # its own sink table
        results: dict[str, list[dict[str, float]]] = {
            k: []
            for k in (
                "deployment upgrade",
                "by hand upgrade",
                "deployment code change",
                "deployment rollback",
                "by hand rollback",
            )
        }
        # One pipeline runs at a time (beside the producer): the deployment's cases, then it is
        # suspended and a job run by hand takes its turn, then the deployment is resumed.
        for run in range(a.runs):
            warm: list[bool] = []
            warm.append(settle(cluster))
            # The jar the deployment runs now: the "upgrade" case changes only the configuration.
            current = b.rest.get("/deployments/bench")["spec"]["jarId"]
            results["deployment upgrade"].append(b.deploy_upgrade("bench", current))
            warm.append(settle(cluster))
            jar = jars["changed"] if current == jars["v1"] else jars["v1"]  # the other file
            results["deployment code change"].append(b.deploy_upgrade("bench", jar))
            warm.append(settle(cluster))
            results["deployment rollback"].append(b.deploy_rollback("bench", jar))
            running_spec = b.rest.get("/deployments/bench")["spec"]
            b.put_state("bench", running_spec, "suspended")
            savepoint = b.status("bench")["lastSavepoint"]
            hand_job = b_hand.run_from(jars["v1"], savepoint)
            wait(lambda: b.running(hand_job), 300, "the by-hand job RUNNING")  # noqa: B023
            warm.append(settle(cluster))
            marks, hand_job = b_hand.hand_upgrade(hand_job, jars["v1"])
            results["by hand upgrade"].append(marks)
            warm.append(settle(cluster))
            marks, hand_job = b_hand.hand_rollback(hand_job, jars["v1"])
            results["by hand rollback"].append(marks)
            b_hand.stop_with_savepoint(hand_job)
            b.put_state("bench", running_spec, "running")
            print(f"run {run + 1} (a warm driver ready before each case: {warm})", flush=True)
            print(
                f"run {run + 1}: "
                + "; ".join(f"{k}: " + " ".join(f"{m} {v:.2f}" for m, v in r[-1].items()) for k, r in results.items()),
                flush=True,
            )
        print(f"\nruns: {a.runs}, loadavg {os.getloadavg()[0]:.1f}")
        for name, runs in results.items():
            summary(name, runs)
    finally:
        if producer is not None:
            producer.stop()
        cluster.stop()
        drop_pg(ADMIN_URL, catalog_url)
        drop_pg(ADMIN_URL, sink_url)


if __name__ == "__main__":
    main()
