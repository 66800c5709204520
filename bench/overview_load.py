"""`GET /jobs/overview` under load: a dispatcher over a PostgreSQL catalog holding N jobs, asked
at a fixed rate (open loop: a request is sent on schedule whether or not earlier ones answered,
so a slow server shows up as latency, not as a lower rate).

Each request's latency is measured from its scheduled send time to its answer; reported: p50, p99,
max, the rate achieved and any non-200 answers. Goal (issue 10): 1,000 jobs, 200 requests/s,
p99 < 50 ms. Requests go to 127.0.0.1 only, for --duration-s seconds.

usage: python bench/overview_load.py [--jobs 1000] [--rate 200] [--duration-s 20] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs, free_port
from bench.checkpoint_overhead import DEFAULT_PG, drop_pg, fresh_pg, machine, percentile
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.ids import new_job_id

WORKERS = 16  # concurrent requests at most; more than 200/s × 50 ms needs


def fill(catalog: Catalog, jobs: int) -> None:
    with catalog.session() as s:
        for i in range(jobs):
            repo.create_job(
                s,
                id=new_job_id(),
                name=f"job-{i}",
                artifact_id=None,
                entry="build",
                parallelism=1,
                program_args=[],
                config={},
                restart_strategy={"type": "none"},
                kind="noop",
            )


def load(url: str, rate: float, duration_s: float) -> dict:
    total = int(rate * duration_s)
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    start = time.monotonic() + 0.5
    next_i = iter(range(total))

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=10) as http:
            while True:
                with lock:
                    i = next(next_i, None)
                if i is None:
                    return
                due = start + i / rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                try:
                    r = http.get("/jobs/overview")
                    ok = r.status_code == 200
                    why = f"HTTP {r.status_code}"
                except httpx.HTTPError as exc:
                    ok, why = False, type(exc).__name__
                with lock:
                    latencies.append(time.monotonic() - due)
                    if not ok:
                        failures.append(why)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration_s + 60)
    elapsed = time.monotonic() - start
    return {
        "requests": len(latencies),
        "rate": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1),
        "failures": len(failures),
        "failure_kinds": sorted(set(failures)),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--rate", type=float, default=200)
    p.add_argument("--duration-s", type=float, default=20)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.jobs, args.duration_s = 50, 2
    home = Path(tempfile.mkdtemp(prefix="hr-overview-"))
    catalog_url = fresh_pg(DEFAULT_PG)
    port = free_port()
    procs = Procs(
        home,
        {
            "HEADRACE_HOME": str(home),
            "HEADRACE_CATALOG_URL": catalog_url,
            "HEADRACE_DISPATCHER_PORT": str(port),
            "HEADRACE_LOG_LEVEL": "WARNING",
        },
    )
    try:
        procs.redis()
        catalog = Catalog(catalog_url)
        catalog.migrate()
        fill(catalog, args.jobs)
        procs.service("dispatcher", "dispatcher")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/jobs/overview", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the dispatcher did not answer within 60 s; see {home}/logs/dispatcher.log")
            time.sleep(0.2)
        jobs = len(httpx.get(f"{url}/jobs/overview", timeout=10).json()["jobs"])
        print(
            f"machine: {machine()}; {jobs} jobs in the catalog, {args.rate:g} requests/s for "
            f"{args.duration_s:g} s; load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        r = load(url, args.rate, args.duration_s)
        print(
            f"{r['requests']} requests at {r['rate']}/s: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
            f"max {r['max_ms']} ms, {r['failures']} failed {r['failure_kinds'] or ''}",
            flush=True,
        )
    finally:
        procs.stop()
        drop_pg(DEFAULT_PG, catalog_url)


if __name__ == "__main__":
    main()
