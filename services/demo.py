"""`headrace demo`: a local cluster, the clickstream example on a generated deterministic input,
its per-window counts read back from the sink table, and the dashboard URL."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import create_engine, inspect, text

from services.local_cluster import ClusterError, LocalCluster
from shared.catalog.db import normalise_url
from shared.settings import Settings

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "clickstream.py"
DEMO_TABLE = "demo_clicks_per_minute"
DEMO_ARGS = ["--total", "3000", "--rate", "1000", "--seed", "42", "--table", DEMO_TABLE]


def run_demo(settings: Settings, *, once: bool, echo, fail, stop: threading.Event) -> None:
    if not EXAMPLE.is_file():
        fail(f"the example pipeline {EXAMPLE} is missing; run the demo from a checkout of the repository")
    cluster = LocalCluster(settings)
    try:
        echo("starting a local cluster (redis-server, JobManager, ResourceManager, 2 TaskManagers, dispatcher) ...")
        cluster.start(wait_s=120)
        echo(f"dashboard: {cluster.dispatcher_url}/   logs: {cluster.run_dir}/logs")
        with httpx.Client(base_url=cluster.dispatcher_url, timeout=30) as http:
            with open(EXAMPLE, "rb") as f:
                jar = http.post("/jars/upload", files={"jarfile": (EXAMPLE.name, f)}).json()
            run = http.post(f"/jars/{jar['id']}/run", json={"parallelism": 1, "jobName": "clickstream-demo",
                                                            "programArgsList": DEMO_ARGS})
            if run.status_code != 200:
                fail(f"submission refused: {run.text}")
            job_id = run.json()["jobid"]
            echo(f"submitted the clickstream example as job {job_id}; waiting for it to finish ...")
            state = _wait(http, job_id, stop, echo)
            if state != "FINISHED":
                exc = http.get(f"/jobs/{job_id}/exceptions").json().get("root-exception") or ""
                fail(f"job {job_id} ended {state}: {exc.strip().splitlines()[-1] if exc.strip() else 'no exception'}")
        _print_windows(settings.catalog, echo)
        echo(f"dashboard: {cluster.dispatcher_url}/")
        if not once:
            echo("the cluster keeps running; press Ctrl-C to stop it.")
            stop.wait()
    except ClusterError as exc:
        fail(str(exc))
    finally:
        echo("stopping the cluster ...")
        cluster.stop()


def _wait(http: httpx.Client, job_id: str, stop: threading.Event, echo, timeout_s: float = 600) -> str:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline and not stop.is_set():
        job = http.get(f"/jobs/{job_id}").json()
        if job["state"] != last:
            echo(f"  job is {job['state']}")
            last = job["state"]
        if job["state"] in ("FINISHED", "FAILED", "CANCELED"):
            return job["state"]
        time.sleep(0.5)
    return last or "UNKNOWN"


def _print_windows(catalog_url: str, echo) -> None:
    engine = create_engine(normalise_url(catalog_url))
    try:
        if not inspect(engine).has_table(DEMO_TABLE):
            echo(f"(the sink table {DEMO_TABLE} was not created)")
            return
        with engine.connect() as c:
            rows = c.execute(text(f"SELECT window_start, window_end, url, count FROM {DEMO_TABLE} "
                                  "ORDER BY window_start, url")).all()
    finally:
        engine.dispose()
    echo("")
    echo(f"{'window start':<20} {'window end':<20} {'url':<24} {'count':>6}")
    for start, end, url, count in rows:
        echo(f"{str(start)[:19]:<20} {str(end)[:19]:<20} {url:<24} {count:>6}")
    echo(f"{len(rows)} rows, {sum(r[3] for r in rows)} events")
