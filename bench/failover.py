"""TaskManager failover: kill -9 (or SIGSTOP) the TaskManager running a streaming job and time
until the job's next attempt is RUNNING on the other TaskManager. Median of N runs, warm
cluster, default heartbeat settings (2 s / 10 s) unless overridden.

usage: python bench/failover.py [--kind pyspark|noop] [--signal KILL|STOP] [--runs 5]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sink_db import sink_db_url  # noqa: E402
from bench.submit_latency import wait_warm  # noqa: E402
from tests.clusters import Rest, start_cluster  # noqa: E402

STREAM = Path(__file__).resolve().parent / "pipelines" / "endless_stream.py"
NOOP = "def build(ctx):\n    raise RuntimeError('no-op')\n"


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["pyspark", "noop"], default="pyspark")
    ap.add_argument("--signal", choices=["KILL", "STOP"], default="KILL")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--catalog", default=None, help="catalog URL (default SQLite in a temp home)")
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="headrace-failover-"))
    catalog = a.catalog or f"sqlite:///{home / 'catalog.db'}"
    cluster = start_cluster(home, catalog_url=catalog, taskmanagers=2, slots=2,
                            warm_drivers=1 if a.kind == "pyspark" else 0, pipeline_catalog_url=sink_db_url(home))
    rest = Rest(cluster.dispatcher_url)
    times, detail = [], []
    try:
        if a.kind == "pyspark":
            jar = rest.upload(STREAM)
            body = {"parallelism": 1}
        else:
            p = home / "noop.py"
            p.write_text(NOOP)
            jar = rest.upload(p)
            body = {"kind": "noop", "config": {"noop.duration": -1}}
        restart = {"type": "fixed-delay", "attempts": 100, "delay": "1 s"}  # the cluster default delay
        job = rest.run(jar, restartStrategy=restart, **body)
        rest.wait_attempt_running(job, 0, timeout_s=180)
        for run in range(a.runs):
            if a.kind == "pyspark":
                wait_warm(cluster, 1)  # the survivor must have a ready warm driver, as on a warm cluster
            else:
                time.sleep(2)
            attempts = rest.attempts(job)
            victim = attempts[-1]["taskmanager-id"]
            child = cluster.child({"tm-1": "taskmanager-1", "tm-2": "taskmanager-2"}[victim])
            t0 = time.monotonic()
            if a.signal == "KILL":
                os.killpg(child.proc.pid, signal.SIGKILL)
            else:
                os.killpg(child.proc.pid, signal.SIGSTOP)
            attempts = rest.wait_attempt_running(job, attempts[-1]["attempt"] + 1, timeout_s=120)
            took = time.monotonic() - t0
            times.append(took)
            detail.append({"run": run, "seconds": round(took, 2), "from": victim,
                           "to": attempts[-1]["taskmanager-id"]})
            print(f"run {run}: {took:.2f} s ({victim} -> {attempts[-1]['taskmanager-id']})", file=sys.stderr)
            # Bring the victim back as a fresh TaskManager with the same id for the next run.
            if a.signal == "STOP":
                os.killpg(child.proc.pid, signal.SIGKILL)
            child.proc.wait(10)
            cluster.respawn(child.name)
            deadline = time.monotonic() + 60
            while rest.get("/overview")["taskmanagers"] < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
        rest.cancel(job)
    finally:
        cluster.stop()
    print(json.dumps({"kind": a.kind, "signal": a.signal, "runs": detail,
                      "median_s": round(statistics.median(times), 2), "min_s": round(min(times), 2),
                      "max_s": round(max(times), 2)}, indent=2))


if __name__ == "__main__":
    main()
