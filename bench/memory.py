"""Resident memory of an idle local cluster, service by service, and what one warm driver costs.

Starts a cluster like `headrace up`'s (2 TaskManagers with 2 slots and one warm driver each,
PostgreSQL catalog, its own redis-server), waits until both warm drivers are ready and the machine
settles, then reads the RSS of every process:
  services     JobManager, ResourceManager, dispatcher, each TaskManager process alone
  warm driver  each warm driver's process tree, split into its Python driver process, its JVM and
               Spark's Python daemons and the workers they forked, and its Python fork server
               (python_forkserver.py), as PSS (shared pages counted once) and as a plain sum of RSS
The budget of issue 10: JobManager + ResourceManager + dispatcher <= 300 MB together, a TaskManager
<= 150 MB without its warm drivers.

usage: python bench/memory.py [--settle-s 10] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.checkpoint_overhead import DEFAULT_PG, drop_pg, fresh_pg, machine
from bench.submit_latency import wait_warm
from tests.clusters import start_cluster

MB = 2**20


def rss(p: psutil.Process) -> int:
    try:
        return p.memory_info().rss
    except psutil.Error:
        return 0


def pss(p: psutil.Process) -> int:
    """Proportional set size: Spark's Python workers are forked from a daemon and share most of
    their pages with it, so a sum of their RSS counts those pages several times."""
    try:
        return p.memory_full_info().pss
    except psutil.Error:
        return 0


def driver_parts(driver: psutil.Process) -> dict[str, float]:
    """PSS of a warm driver's tree: the runner (Python), its JVM, and Spark's Python daemons and
    workers under the JVM; and the plain RSS sum for comparison."""
    parts = {
        "python driver": pss(driver) / MB,
        "jvm": 0.0,
        "python workers": 0.0,
        "workers": 0,
        "fork server": 0.0,
        "rss sum": rss(driver) / MB,
    }
    tree = []
    for child in driver.children(recursive=True):
        try:
            tree.append((child, child.name(), " ".join(child.cmdline()), child.ppid()))
        except psutil.Error:
            continue
    # services/taskmanager/runtime/python_forkserver.py; the daemons it forks (and their workers)
    # carry its command line too, and count as daemons and workers.
    forked = {c.pid for c, _, cmdline, _ in tree if "python_forkserver" in cmdline}
    for child, name, _cmdline, parent in tree:
        parts["rss sum"] += rss(child) / MB
        if name == "java":
            parts["jvm"] += pss(child) / MB
        elif child.pid in forked and parent not in forked:
            parts["fork server"] += pss(child) / MB
        else:
            parts["python workers"] += pss(child) / MB
            parts["workers"] += 1
    return {k: round(v, 1) for k, v in parts.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--settle-s", type=float, default=10)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.settle_s = 1
    home = Path(tempfile.mkdtemp(prefix="hr-memory-"))
    catalog_url = fresh_pg(DEFAULT_PG)
    cluster = None
    try:
        cluster = start_cluster(home, catalog_url=catalog_url, taskmanagers=2, slots=2, warm_drivers=1)
        wait_warm(cluster, 1)
        time.sleep(args.settle_s)
        print(f"machine: {machine()}; load {os.getloadavg()[0]:.2f}", flush=True)
        services = {}
        drivers = []
        for c in cluster.children:
            proc = psutil.Process(c.proc.pid)
            services[c.name] = round(rss(proc) / MB, 1)
            if c.name.startswith("taskmanager"):
                drivers += [(c.name, d) for d in proc.children() if "runtime.runner" in " ".join(d.cmdline())]
        for name, mb in services.items():
            print(f"  {name:16s} {mb:7.1f} MB")
        control = sum(
            v for k, v in services.items() if k.split("-")[0] in ("jobmanager", "resourcemanager", "dispatcher")
        )
        print(f"JobManager + ResourceManager + dispatcher: {control:.1f} MB (budget 300 MB)")
        tms = [v for k, v in services.items() if k.startswith("taskmanager")]
        print(f"TaskManager alone: max {max(tms):.1f} MB (budget 150 MB)")
        for name, d in drivers:
            parts = driver_parts(d)
            total = parts["python driver"] + parts["jvm"] + parts["python workers"] + parts["fork server"]
            print(
                f"warm driver of {name}: {total:.1f} MB (PSS) = Python driver {parts['python driver']} + JVM "
                f"{parts['jvm']} + {parts['workers']} Python daemons and workers {parts['python workers']} + "
                f"Python fork server {parts['fork server']}; RSS summed: {parts['rss sum']} MB"
            )
    finally:
        if cluster is not None:
            cluster.stop()
        drop_pg(DEFAULT_PG, catalog_url)


if __name__ == "__main__":
    main()
