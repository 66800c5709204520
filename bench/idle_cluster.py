"""CPU of an idle cluster: what each service of a local cluster (one JobManager, the
ResourceManager, two TaskManagers, the dispatcher, its Redis) uses per second with no job, after
--settle seconds of start-up, measured over --seconds from each process's own CPU counters.
Every test module of the suite keeps such a cluster up while it runs.

usage: python bench/idle_cluster.py [--seconds 30] [--settle 10] [--rounds 1]
(run it from another checkout, e.g. a git worktree of an older commit, to compare side by side)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.checkpoint_overhead import machine  # noqa: E402
from tests.clusters import start_cluster  # noqa: E402

SERVICES = ("jobmanager", "resourcemanager", "taskmanager", "dispatcher", "redis-server")


def service_of(proc: psutil.Process) -> str | None:
    line = " ".join(proc.cmdline())
    return next((s for s in SERVICES if s in line), None)


def cpu_s(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            continue
    return out


def one_round(seconds: float, settle_s: float) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="idle-cluster-"))
    cluster = start_cluster(home, catalog_url=f"sqlite:///{home}/catalog.db", taskmanagers=2, slots=2, warm_drivers=0)
    try:
        time.sleep(settle_s)
        procs = [p for p in psutil.Process().children(recursive=True) if service_of(p)]
        before, t0 = cpu_s(procs), time.monotonic()
        time.sleep(seconds)
        after, elapsed = cpu_s(procs), time.monotonic() - t0
        cores: dict[str, float] = defaultdict(float)
        for p in procs:
            if p.pid in before and p.pid in after:
                cores[service_of(p) or "?"] += (after[p.pid] - before[p.pid]) / elapsed
        cores["all"] = sum(cores.values())
        return {k: round(v, 4) for k, v in cores.items()}
    finally:
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=1)
    opts = ap.parse_args()
    print({**machine(), "code": str(ROOT)}, flush=True)
    for _ in range(opts.rounds):
        print("cores busy per service:", one_round(opts.seconds, opts.settle), flush=True)


if __name__ == "__main__":
    main()
