"""Tasks on a Spark standalone cluster: `headrace up --spark-workers 2` starts a master and two
workers from pyspark's own jars; a TaskManager with that master runs each task's driver itself and
its executors on the workers (dynamic allocation: at most `parallelism` cores, none while idle).

1. The clickstream example with parallelism 2: exact counts in PostgreSQL, and the master saw the
   application use executors on both workers.
2. A job asking for executors larger than any worker: its task fails with a clear NoExecutors
   reason after the slot timeout instead of waiting forever.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psutil
import pytest

from services.cluster import spark_standalone
from services.cluster.readiness import wait_for_warm_drivers
from tests.clusters import Rest, start_cluster
from tests.e2e.drills import ARGS, TOTAL, expected_counts, sink_counts

ROOT = Path(__file__).resolve().parents[2]
# Also how long the first job may wait for its executors' JVMs to register: 10 s was too little on
# a loaded 2-core machine (the job failed NoExecutors while its executors were still starting).
NO_EXECUTOR_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(
        tmp_path_factory.mktemp("standalone"),
        catalog_url=pg_url_module,
        taskmanagers=1,
        slots=2,
        pipeline_catalog_url=pg_url_module,  # the pipeline's own database
        spark_workers=2,
        restart_strategy={"type": "none"},
        warm_drivers=1,
        warm_up_query=True,  # as users run it: the warm-up query is what took executors
        slot_request_timeout_s=NO_EXECUTOR_TIMEOUT_S,
    )
    yield c, pg_url_module
    spark = [psutil.Process(c.child(n).proc.pid) for n in ("spark-master", "spark-worker-1", "spark-worker-2")]
    c.stop()
    # Nothing the cluster started outlives it (the master and workers once did).
    assert [p.pid for p in spark if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []


def test_a_warm_driver_holds_no_executor(cluster):
    """Issue 42: a warm driver's warm-up took executors (shuffle data kept them) while a task on
    the same cluster waited 300 s for any. In reserve a driver holds none."""
    c, _ = cluster
    assert wait_for_warm_drivers(c.redis_url, ["tm-1"], 240, stopped=lambda: False) == []
    time.sleep(3)  # an executor a warm-up asked for would have registered by now
    status = spark_standalone.master_status(c.spark_master.webui)
    used = {w["id"]: w.get("coresused", 0) for w in spark_standalone.alive_workers(status)}
    assert used and not any(used.values()), f"cores held on the workers while no task runs: {used}"


def test_the_dashboard_links_the_master_and_the_workers_run_the_executors(cluster):
    c, pg = cluster
    rest = Rest(c.dispatcher_url)
    cfg = rest.get("/config")
    assert cfg["spark-master"] == c.spark_master.url and cfg["spark-master-ui"] == c.spark_master.webui
    status = spark_standalone.master_status(c.spark_master.webui)
    assert len(spark_standalone.alive_workers(status)) == 2
    # What runs is what the compose check compares against (tests/integration/test_compose_topology.py).
    assert sorted(c.live_children()) == sorted(c.planned_children())

    jar = rest.upload(ROOT / "examples" / "clickstream.py")
    job = rest.run(
        jar,
        parallelism=2,
        jobName="clickstream-standalone",
        programArgsList=[a if a != "e2e_clicks" else "standalone_clicks" for a in ARGS],
    )
    final = rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=300)
    assert final["state"] == "FINISHED", rest.get(f"/jobs/{job}/exceptions")
    got = sink_counts(pg, "standalone_clicks")
    assert got == expected_counts() and sum(got.values()) == TOTAL

    # The application ran on the cluster: both workers hosted executors of it.
    status = spark_standalone.master_status(c.spark_master.webui)
    apps = status.get("activeapps", []) + status.get("completedapps", [])
    assert any(a.get("name") == "headrace-driver" for a in apps), apps
    worked = [d for d in (c.run_dir / "spark").glob("worker-*") if any(d.glob("app-*/*/stderr"))]
    assert len(worked) == 2, f"executors ran under {worked} only"


def test_a_task_the_cluster_cannot_serve_fails_with_the_reason(cluster):
    c, _ = cluster
    rest = Rest(c.dispatcher_url)
    jar = rest.upload(ROOT / "examples" / "clickstream.py")
    job = rest.run(
        jar,
        parallelism=1,
        jobName="too-big",
        programArgsList=[a if a != "e2e_clicks" else "too_big_clicks" for a in ARGS],
        flinkConfiguration={"spark.executor.memory": "64g"},
    )
    final = rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=NO_EXECUTOR_TIMEOUT_S + 120)
    assert final["state"] == "FAILED"
    root = rest.get(f"/jobs/{job}/exceptions")["root-exception"]
    assert (
        "NoExecutors" in root
        and f"gave this task no executor within {NO_EXECUTOR_TIMEOUT_S} s" in root
        and "64g" in root
    )
    r = httpx.post(f"{c.dispatcher_url}/jars/{jar}/run", json={"flinkConfiguration": {"spark.executor.memory": "lots"}})
    assert r.status_code == 400 and r.json()["field"] == "spark.executor.memory" and "1g" in r.json()["errors"][0]
