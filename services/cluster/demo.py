"""`headrace demo`: a local cluster, the clickstream example on a generated deterministic input,
its per-window counts read back from the sink table, and the dashboard URL.

It ends with where its time went (cluster start, waiting for a Spark driver, the run, reading
the result): bench/demo_start.py reads that line. The job is submitted as soon as the cluster
is up.

With --once the cluster keeps no warm drivers: it runs one task and stops, so a warm driver
would only be a JVM competing with that task's own (on 2 cores the task then took ~1.8 times
as long to start whenever it landed on the TaskManager whose warm-up was still waiting its
turn). Without --once the cluster stays up to be used, with the configured warm drivers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import create_engine, inspect, text

from services.cluster.local_cluster import ClusterError, LocalCluster
from shared.catalog.db import normalise_url
from shared.failure_summary import summarize
from shared.settings import Settings

# Package data: in a checkout examples links to the repository's examples/, in an installed
# wheel it is a copy (pyproject.toml, package-data).
EXAMPLE = (Path(__file__).parent / "examples" / "clickstream.py").resolve()
DEMO_TABLE = "demo_clicks_per_minute"
# --rate only paces the generator (event times, hence the counts, come from the seed and
# --events-per-minute): the 3000 events arrive within a second instead of three.
DEMO_ARGS = ["--total", "3000", "--rate", "3000", "--seed", "42", "--table", DEMO_TABLE]


def run_demo(settings: Settings, *, once: bool, echo, fail, stop: threading.Event, spark_workers: int = 0) -> None:
    if not EXAMPLE.is_file():
        fail(f"the example pipeline {EXAMPLE} is missing: this copy of Headrace was installed without its package data")
    if once and "warm_drivers" not in settings.model_fields_set:
        settings = settings.model_copy(update={"warm_drivers": 0})
    if once and "warm_planner" not in settings.model_fields_set:  # one run, no upgrade to check
        settings = settings.model_copy(update={"warm_planner": False})
    # The pipeline writes into a database of its own, never into the control catalog: the
    # configured one, else its lineage's own SQLite file (services/cluster/pipeline_database.py).
    sink_args = ["--sink-url", settings.pipeline_catalog_url] if settings.pipeline_catalog_url else []
    cluster = LocalCluster(settings, spark_workers=spark_workers)
    marks = {"start": time.monotonic()}
    try:
        echo(
            "starting a local cluster (redis-server, JobManager, ResourceManager, 2 TaskManagers, dispatcher"
            + (f", a Spark master and {spark_workers} worker(s)" if spark_workers else "")
            + ") ..."
        )
        cluster.start(wait_s=120)
        marks["cluster"] = time.monotonic()
        echo(f"dashboard: {cluster.dispatcher_url}/   logs: {cluster.run_dir}/logs")
        with httpx.Client(base_url=cluster.dispatcher_url, timeout=30) as http:
            with open(EXAMPLE, "rb") as f:
                jar = http.post("/jars/upload", files={"jarfile": (EXAMPLE.name, f)}).json()
            run = http.post(
                f"/jars/{jar['id']}/run",
                json={"parallelism": 1, "jobName": "clickstream-demo", "programArgsList": [*DEMO_ARGS, *sink_args]},
            )
            if run.status_code != 200:
                fail(f"submission refused: {run.text}")
            job_id = run.json()["jobid"]
            echo(f"submitted the clickstream example as job {job_id}; waiting for it to finish ...")
            state = _wait(http, job_id, stop, echo, marks)
            if state != "FINISHED":
                exc = http.get(f"/jobs/{job_id}/exceptions").json().get("root-exception")
                fail(f"job {job_id} ended {state}: {summarize(exc) or 'no exception'}")
            database = http.get(f"/jobs/{job_id}").json().get("pipeline-database")
        marks["finished"] = time.monotonic()
        if database:
            echo(f"the job's SQL output is in {database}")
        _print_windows(f"sqlite:///{database}" if database else settings.pipeline_catalog_url or "", echo)
        marks["result"] = time.monotonic()
        echo(timings(marks))
        echo(f"dashboard: {cluster.dispatcher_url}/")
        if not once:
            echo("the cluster keeps running; press Ctrl-C to stop it.")
            stop.wait()
    except ClusterError as exc:
        fail(str(exc))
    finally:
        try:
            echo("stopping the cluster ...")
        except OSError:
            pass  # its terminal or pipe is gone (a closed ssh session): the cluster must stop anyway
        cluster.stop()


def timings(marks: dict[str, float]) -> str:
    """One line: the seconds each phase took, from the start of the cluster to the result."""

    def span(a: str, b: str) -> str:
        return f"{marks[b] - marks[a]:.1f}" if a in marks and b in marks else "?"

    running = "task_running" if "task_running" in marks else "finished"
    return (
        f"timings (s): total {span('start', 'result')} = cluster start {span('start', 'cluster')}"
        f" + until the task ran {span('cluster', running)} (submit, a Spark driver)"
        f" + run {span(running, 'finished')} + result {span('finished', 'result')}"
    )


def _wait(
    http: httpx.Client, job_id: str, stop: threading.Event, echo, marks: dict[str, float], timeout_s: float = 600
) -> str:
    deadline = time.monotonic() + timeout_s
    last = last_task = None
    while time.monotonic() < deadline and not stop.is_set():
        job = http.get(f"/jobs/{job_id}").json()
        if job["state"] != last:
            echo(f"  job is {job['state']}")
            last = job["state"]
        # The job is RUNNING as soon as it is scheduled; its task only once its query runs.
        task = next((v.get("status") for v in job.get("vertices", [])), None)
        if task != last_task and task is not None:
            echo(f"  task is {task}")
            last_task = task
            if task == "RUNNING":
                marks.setdefault("task_running", time.monotonic())
        if job["state"] in ("FINISHED", "FAILED", "CANCELED"):
            return job["state"]
        time.sleep(0.2)
    return last or "UNKNOWN"


def _print_windows(catalog_url: str, echo) -> None:
    engine = create_engine(normalise_url(catalog_url))
    try:
        if not inspect(engine).has_table(DEMO_TABLE):
            echo(f"(the sink table {DEMO_TABLE} was not created)")
            return
        with engine.connect() as c:
            rows = c.execute(
                text(f"SELECT window_start, window_end, url, count FROM {DEMO_TABLE} ORDER BY window_start, url")
            ).all()
    finally:
        engine.dispose()
    echo("")
    echo(f"{'window start':<20} {'window end':<20} {'url':<24} {'count':>6}")
    for start, end, url, count in rows:
        echo(f"{str(start)[:19]:<20} {str(end)[:19]:<20} {url:<24} {count:>6}")
    echo(f"{len(rows)} rows, {sum(r[3] for r in rows)} events")
