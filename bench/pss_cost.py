"""What the memory watchdog's PSS costs on a real task's processes (issue 42).

Starts a local cluster (one TaskManager, 2 slots, no warm driver; drivers as the drivers' user
when run as root, as `headrace up` runs them), runs examples/keyed_counts.py --sink sql at
parallelism 2 on 20 events/s (the operator's job of issue 42), waits --settle-s for its Python
workers, then on the task's processes (its driver's mark, as the TaskManager's /proc scan finds
them) measures, in this process's thread CPU time and wall time:
  rss   one RSS sum (statm), what the watchdog reads every 0.25 s
  pss   one PSS sum (smaps_rollup), per process too (the JVM's is the dearest)
  watch the watchdog's meter (memory/measure.py's ProcessMeter) run at its interval for --watch-s, at
        the default limit (RSS sum below it) and at a limit between the PSS and the RSS sums
        (issue 42's case): CPU per second of watching, and how many PSS reads it made

usage: python bench/pss_cost.py [--settle-s 45] [--rounds 40] [--watch-s 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.taskmanager.drivers.task_processes import rss_bytes, scan
from services.taskmanager.drivers.user import DEFAULT_NAME
from services.taskmanager.memory.limit import WATCH_INTERVAL_S
from services.taskmanager.memory.measure import ProcessMeter, pss_sample
from shared.untrusted_code import switchable_user
from tests.clusters import Rest, start_cluster
from tests.e2e.counting import Producer

ROOT = Path(__file__).resolve().parent.parent
MB = 2**20
GB = 2**30


def timed(fn, rounds: int) -> tuple[float, float, Any]:
    """Median thread-CPU and wall milliseconds of `fn()` over `rounds` calls, and its last result."""
    cpu, wall, result = [], [], None
    for _ in range(rounds):
        c, w = time.thread_time(), time.perf_counter()
        result = fn()
        cpu.append((time.thread_time() - c) * 1000)
        wall.append((time.perf_counter() - w) * 1000)
        time.sleep(0.05)
    return statistics.median(cpu), statistics.median(wall), result


def watch_cost(pids: list[int], limit: int, seconds: float) -> tuple[float, int]:
    """CPU ms per second of the watchdog's meter sampling every WATCH_INTERVAL_S, and its PSS reads."""
    reads = 0

    def counting(p):
        nonlocal reads
        reads += 1
        return pss_sample(p)

    meter = ProcessMeter(lambda: pids, read_pss=counting)
    cpu = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        c = time.thread_time()
        meter.sample(limit)
        cpu += time.thread_time() - c
        time.sleep(WATCH_INTERVAL_S)
    return cpu * 1000 / seconds, reads


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--settle-s", type=float, default=45.0)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--watch-s", type=float, default=20.0)
    args = ap.parse_args()
    user = switchable_user(DEFAULT_NAME) if os.geteuid() == 0 else None
    home = Path(tempfile.mkdtemp(prefix="headrace-pss-", dir="/tmp"))
    os.chmod(home, 0o755)
    cluster = start_cluster(
        home / "home",
        catalog_url=f"sqlite:///{home / 'catalog.db'}",
        taskmanagers=1,
        slots=2,
        warm_drivers=0,
        driver_user=user.name if user and user.name else "",
    )
    producer = None
    try:
        rest = Rest(cluster.dispatcher_url)
        producer = Producer(cluster.redis_url, "events", rate=20.0).start()
        jar = rest.upload(ROOT / "examples" / "keyed_counts.py")
        job = rest.run(jar, parallelism=2, programArgsList=["--stream", "events", "--sink", "sql"])
        rest.wait_running_task(job, timeout_s=180)
        print(f"job {job} RUNNING; settling {args.settle_s:.0f} s", flush=True)
        time.sleep(args.settle_s)
        drivers = home / "home" / "work" / "taskmanagers" / "tm-1" / "drivers"
        pids = sorted(scan(mark=str(drivers), uid=user.uid if user and user.name else os.geteuid()))
        rss_cpu, rss_wall, rss = timed(lambda: rss_bytes(pids), args.rounds)
        pss_cpu, pss_wall, sample = timed(lambda: pss_sample(pids), args.rounds)
        print(
            f"\n{len(pids)} processes: RSS sum {rss / MB:.0f} MB, PSS sum {sample.used / MB:.0f} MB ({sample.label()})"
        )
        print(f"one RSS sum: {rss_cpu:.2f} ms CPU, {rss_wall:.2f} ms wall (medians of {args.rounds})")
        print(f"one PSS sum: {pss_cpu:.2f} ms CPU, {pss_wall:.2f} ms wall")
        for pid in pids:
            cpu, wall, _ = timed(lambda one=[pid]: pss_sample(one), 10)
            print(
                f"  {pid:>7} {comm(pid):<16} RSS {rss_bytes([pid]) / MB:7.0f} MB  PSS "
                f"{pss_sample([pid]).used / MB:7.0f} MB  {cpu:.2f} ms CPU {wall:.2f} ms wall"
            )
        between = (sample.used + rss) // 2
        for label, limit in (
            ("default limit 3 GB", 3 * GB),
            (f"limit {between / GB:.2f} GB (PSS < it < RSS sum)", between),
        ):
            per_s, reads = watch_cost(pids, limit, args.watch_s)
            print(
                f"watchdog at {label}: {per_s:.2f} ms CPU per second of watching "
                f"({per_s / 10:.2f} % of a core), {reads} PSS reads in {args.watch_s:.0f} s"
            )
        print(
            f"the old watchdog (RSS sum every {WATCH_INTERVAL_S} s): {rss_cpu / WATCH_INTERVAL_S:.2f} ms CPU per second"
        )
        print(
            f"PSS at every sample instead: {pss_cpu / WATCH_INTERVAL_S:.1f} ms CPU per second "
            f"({pss_cpu / WATCH_INTERVAL_S / 10:.1f} % of a core)"
        )
    finally:
        if producer is not None:
            producer.stop()
        cluster.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
