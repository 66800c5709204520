"""JobManager failover in ZooKeeper mode: stop the leading JobManager (kill -9, or SIGTERM for a
graceful handover) and time until a job submitted right after it is RUNNING, led by the
standby. Also checks that the job already running was not restarted. Median of N runs on a
local cluster of two JobManagers, a ZooKeeper server, two TaskManagers, no-op tasks.

usage: python bench/jobmanager_failover.py [--signal KILL|TERM] [--runs 5] [--session-timeout 10]
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

from kazoo.client import KazooClient

from tests.clusters import Rest, start_cluster

NOOP = "def build(ctx):\n    raise RuntimeError('no-op')\n"


def leader(quorum: str) -> dict:
    zk = KazooClient(hosts=quorum)
    zk.start(timeout=10)
    try:
        return json.loads(zk.get("/headrace/jobmanager/leader")[0])
    finally:
        zk.stop()
        zk.close()


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--signal", choices=["KILL", "TERM"], default="KILL")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--session-timeout", type=float, default=10.0, help="zookeeper_session_timeout_s")
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="headrace-jm-failover-"))
    cluster = start_cluster(
        home,
        catalog_url=f"sqlite:///{home / 'catalog.db'}",
        taskmanagers=2,
        slots=4,
        ha=True,
        jobmanagers=2,
        zookeeper_session_timeout_s=a.session_timeout,
    )
    rest = Rest(cluster.dispatcher_url)
    times = []
    try:
        p = home / "noop.py"
        p.write_text(NOOP)
        jar = rest.upload(p)
        endless = rest.run(jar, kind="noop", config={"noop.duration": -1})
        rest.wait_attempt_running(endless, 0, timeout_s=60)
        for _ in range(a.runs):
            before = leader(cluster.zookeeper_quorum)
            pid = int(before["id"].rsplit(":", 1)[1])
            name = next(c.name for c in cluster.children if c.name.startswith("jobmanager") and c.proc.pid == pid)
            t0 = time.monotonic()
            os.killpg(pid, signal.SIGKILL if a.signal == "KILL" else signal.SIGTERM)
            probe = rest.run(jar, kind="noop", config={"noop.duration": 0.2})
            rest.wait_attempt_running(probe, 0, timeout_s=120)
            times.append(time.monotonic() - t0)
            after = leader(cluster.zookeeper_quorum)
            assert after["epoch"] > before["epoch"], (before, after)
            cluster.child(name).proc.wait(30)
            cluster.respawn(name)
            time.sleep(3)  # the respawned JobManager is standby again
        restarted = len(rest.attempts(endless)) - 1
        print(
            json.dumps(
                {
                    "signal": a.signal,
                    "session_timeout_s": a.session_timeout,
                    "runs": a.runs,
                    "to_running_s": [round(t, 2) for t in times],
                    "median_s": round(statistics.median(times), 2),
                    "tasks_restarted_by_leader_changes": restarted,
                },
                indent=2,
            )
        )
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
