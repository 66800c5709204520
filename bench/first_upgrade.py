"""The first code upgrade of a cluster that has just started, side by side: this checkout's code
against another's (`--before DIR`, e.g. a checkout of main), alternating, each run on a fresh
cluster (2 TaskManagers, 1 warm driver each, PostgreSQL catalog and sink, an outside producer at
200 events/s): start the cluster, apply the counting pipeline as a deployment and wait until it is
STABLE, then apply a changed pipeline file (a code change: the dispatcher plans it to check it
against the job's state) and measure it, then a second code change (what later upgrades take).

Figures per upgrade: the PUT answered (the compatibility check), the new job's task RUNNING and
its first micro-batch, from the PUT. The cluster's processes run the code of the checkout given
through PYTHONPATH; this script and its cluster start-up are this checkout's.

usage: python bench/first_upgrade.py [--runs 2] [--before /path/to/other/checkout]
Figures go to docs/benchmarks.md ("The first code upgrade of a new cluster").
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.checkpoint_overhead import drop_pg, fresh_pg
from bench.deployment_upgrade import ADMIN_URL, STREAM, Bench, first_batch, settle, wait
from bench.submit_latency import wait_warm
from tests.clusters import Rest, start_cluster
from tests.e2e.counting import Producer

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "hr-bench-first-upgrade-"


def one_run(code: Path) -> dict[str, float]:
    """A fresh cluster running `code`: its first and second code upgrades."""
    # The cluster's children inherit both: `python -m` puts the working directory first on sys.path.
    os.environ["PYTHONPATH"] = str(code)
    os.chdir(code)
    home = Path(tempfile.mkdtemp(prefix=PREFIX))
    catalog_url, sink_url = fresh_pg(ADMIN_URL), fresh_pg(ADMIN_URL)
    t_start = time.monotonic()
    cluster = start_cluster(home, catalog_url=catalog_url, taskmanagers=2, slots=2, warm_drivers=1, warm_planner=True)
    producer = None
    try:
        out = {"cluster_up": time.monotonic() - t_start}
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
        out["stable_after_start"] = time.monotonic() - t_start
        # A snapshot with state to check against: one taken after the first batch committed (a
        # snapshot of a query that never committed one holds nothing, and is not planned against).
        job = b.status("bench")["jobId"]
        wait(lambda: first_batch(catalog_url, job), 300, "the first batch")
        taken = rest.get(f"/jobs/{job}/checkpoints")["counts"]["completed"]
        wait(
            lambda: rest.get(f"/jobs/{job}/checkpoints")["counts"]["completed"] > taken,
            300,
            "a checkpoint after the first batch",
        )
        for case, jar in (("first", jars["changed"]), ("second", jars["v1"])):
            settle(cluster)
            b.interval = 3 - b.interval  # keep the checkpoint interval: only the file changes
            marks = b.deploy_upgrade("bench", jar)
            out |= {f"{case}_{k}": v for k, v in marks.items() if k in ("put_answered", "running", "first_result")}
        return out
    finally:
        if producer is not None:
            producer.stop()
        cluster.stop()
        drop_pg(ADMIN_URL, catalog_url)
        drop_pg(ADMIN_URL, sink_url)


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout or kill stops the cluster too
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--before", type=Path, default=None, help="another checkout, measured alternately")
    a = ap.parse_args()
    codes = {"this checkout": ROOT}
    if a.before is not None:
        codes = {f"before ({a.before})": a.before.resolve(), **codes}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    for run in range(a.runs):
        for name, code in codes.items():
            figures = one_run(code)
            results[name].append(figures)
            print(
                f"run {run + 1}, {name}: "
                + " ".join(f"{k} {v:.2f}" for k, v in figures.items())
                + f" (loadavg {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    print()
    for name, runs in results.items():
        cells = ", ".join(
            f"{k} {statistics.median(r[k] for r in runs):.2f} s [{' '.join(f'{r[k]:.2f}' for r in runs)}]"
            for k in runs[0]
        )
        print(f"{name}: median [runs]: {cells}", flush=True)
    print(f"the checks: grep 'restore check' /tmp/{PREFIX}*/runs/*/logs/dispatcher.log")


if __name__ == "__main__":
    main()
