"""Submission latency on a warm cluster, and resident memory of every service at idle.

For each of N runs: POST /jars/{id}/run of the clickstream example, then poll until (a) the
task's attempt is RUNNING (the Spark query has started), (b) the first result is in the sink
(its table in the catalog has rows) and (c) the first micro-batch is reported committed (the
execution's last batch id is set: (b) plus the progress report's way through the TaskManager,
Redis and the JobManager). Runs are sequential, each after the previous job finished and the
TaskManagers' warm drivers are ready again. Each run also prints the phases its driver logged
(time since the task arrived) and the first batch's Spark durations.

usage: python bench/submit_latency.py [--runs 5] [--warm 1]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.taskmanager.drivers.user import DEFAULT_NAME, give_to_drivers
from shared import streams
from tests.clusters import Rest, start_cluster

ROOT = Path(__file__).resolve().parent.parent


def rss_mb(pid: int, with_children: bool = True) -> float:
    p = psutil.Process(pid)
    procs = [p] + (p.children(recursive=True) if with_children else [])
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return round(total / 2**20, 1)


def wait_warm(cluster, want_per_tm: int, timeout_s: float = 300) -> None:
    """Every TaskManager reports `want_per_tm` warm drivers ready (hr:tm:<id>:warm)."""
    client = redis.Redis.from_url(cluster.redis_url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = []
        for tm in ("tm-1", "tm-2"):
            raw = client.get(streams.tm_warm_key(tm))
            ready.append(json.loads(raw)["ready"] if raw else 0)
        if all(r >= want_per_tm for r in ready):
            return
        time.sleep(0.2)
    raise SystemExit(f"warm drivers not ready after {timeout_s} s")


def sink_has_rows(catalog: sqlite3.Connection, table: str) -> bool:
    try:
        return catalog.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] > 0
    except sqlite3.OperationalError:
        return False  # the sink creates its table with its first batch


def driver_phases(home: Path) -> list[str]:
    """The phases the driver of the newest task logged (see runtime/driver_io.py, PhaseLog)."""
    logs = sorted(home.glob("work/taskmanagers/*/logs/driver-*.log"), key=lambda p: p.stat().st_mtime)
    for log in reversed(logs):
        lines = [
            ln.split("headrace task phase: ", 1)[1].strip()
            for ln in log.read_text(errors="replace").splitlines()
            if "headrace task phase: " in ln
        ]
        if lines:
            return lines
    return []


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warm", type=int, default=1)
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="headrace-submit-"))
    # The pipelines write into a database of their own (never the control catalog).
    sink_db = home / "sink" / "sink.db"
    sink_db.parent.mkdir()
    give_to_drivers(sink_db.parent, os.environ.get("HEADRACE_DRIVER_USER", DEFAULT_NAME), files=(sink_db.name,))
    cluster = start_cluster(
        home,
        catalog_url=f"sqlite:///{home / 'catalog.db'}",
        taskmanagers=2,
        slots=2,
        warm_drivers=a.warm,
        pipeline_catalog_url=f"sqlite:///{sink_db}",
    )
    rest = Rest(cluster.dispatcher_url)
    result: dict = {}
    try:
        wait_warm(cluster, a.warm)
        result["idle_rss_mb"] = {c.name: rss_mb(c.proc.pid, with_children=False) for c in cluster.children}
        result["idle_rss_mb_taskmanager_with_warm_drivers"] = {
            c.name: rss_mb(c.proc.pid) for c in cluster.children if c.name.startswith("taskmanager")
        }
        jar = rest.upload(ROOT / "examples" / "clickstream.py")
        to_running, to_batch, to_result = [], [], []
        catalog = sqlite3.connect(sink_db, timeout=30)
        for run in range(a.runs):
            t0 = time.monotonic()
            r = httpx.post(
                f"{cluster.dispatcher_url}/jars/{jar}/run",
                json={
                    "parallelism": 1,
                    "programArgsList": ["--total", "2000", "--rate", "2000", "--table", f"bench_{run}"],
                },
                timeout=30,
            )
            job = r.json()["jobid"]
            running = batch = in_sink = None
            while time.monotonic() - t0 < 300 and (batch is None or in_sink is None):
                if in_sink is None and sink_has_rows(catalog, f"bench_{run}"):
                    in_sink = time.monotonic() - t0
                j = rest.job(job)
                if running is None and j["vertices"] and j["vertices"][0]["status"] in ("RUNNING", "FINISHED"):
                    running = time.monotonic() - t0
                attempts = rest.attempts(job)
                if batch is None and attempts and attempts[-1].get("last-batch-id") is not None:
                    batch = time.monotonic() - t0
                if j["state"] in ("FAILED", "CANCELED"):
                    raise SystemExit(f"job {job} ended {j['state']}")
                time.sleep(0.02)
            to_running.append(running)
            to_batch.append(batch)
            to_result.append(in_sink)
            print(
                f"run {run}: RUNNING after {running:.2f} s, first result in the sink after {in_sink:.2f} s, "
                f"first batch reported after {batch:.2f} s",
                file=sys.stderr,
            )
            for line in driver_phases(home):
                print(f"    {line}", file=sys.stderr)
            rest.wait_state(job, ("FINISHED",), timeout_s=300)
            wait_warm(cluster, a.warm)
        result["post_to_running_s"] = {
            "median": round(statistics.median(to_running), 2),
            "all": [round(x, 2) for x in to_running],
        }
        result["post_to_first_batch_s"] = {
            "median": round(statistics.median(to_batch), 2),
            "all": [round(x, 2) for x in to_batch],
        }
        result["post_to_first_result_in_sink_s"] = {
            "median": round(statistics.median(to_result), 2),
            "all": [round(x, 2) for x in to_result],
        }
    finally:
        cluster.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
