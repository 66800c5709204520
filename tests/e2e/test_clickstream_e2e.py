"""End to end on the multi-process cluster: redis-server, RM, JM, two TaskManagers with warm
Spark drivers, the dispatcher; PostgreSQL as catalog and as the pipeline's sink.

1. Upload and run the clickstream example over REST on a fixed generated input; the count of
   every (window, url) in PostgreSQL equals what the generator's pure function predicts.
2. A second, endless job is cancelled: it ends CANCELED, its slots are free again, and the
   Spark driver process that ran it (with its JVM) is gone.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from tests.clusters import Rest, start_cluster
from tests.e2e.drills import ARGS, TOTAL, expected_counts, settled_drivers, sink_counts
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    pg = pg_url_module
    # The pipelines' own database (ctx.catalog_url): here the same server as the catalog.
    c = start_cluster(
        tmp_path_factory.mktemp("e2e-home"),
        catalog_url=pg,
        pipeline_catalog_url=pg,
        taskmanagers=2,
        slots=2,
        warm_drivers=1,
        restart_strategy={"type": "none"},
    )
    yield c, pg
    c.stop()


def test_clickstream_counts_then_cancel(cluster):
    c, pg = cluster
    rest = Rest(c.dispatcher_url)
    jar = rest.upload(ROOT / "examples" / "clickstream.py")
    job = rest.run(jar, parallelism=1, jobName="clickstream-e2e", programArgsList=ARGS)
    final = rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=300)
    assert final["state"] == "FINISHED", rest.get(f"/jobs/{job}/exceptions")
    got = sink_counts(pg, "e2e_clicks")
    assert got == expected_counts()
    assert sum(got.values()) == TOTAL

    # --- a second, endless job, cancelled ----------------------------------------------
    free_before = rest.wait_free_slots(4)
    assert free_before == 4
    drivers_before = settled_drivers(c, ("taskmanager-1", "taskmanager-2"))
    endless = rest.upload(ROOT / "bench" / "pipelines" / "endless_stream.py")
    job2 = rest.run(endless, parallelism=1, jobName="endless")
    rest.wait_attempt_running(job2, 0, timeout_s=300)
    tm = rest.attempts(job2)[0]["taskmanager-id"]
    name = {"tm-1": "taskmanager-1", "tm-2": "taskmanager-2"}[tm]
    assert rest.wait_free_slots(3) == 3
    # slots=2 and one warm driver per TaskManager: the task runs on the warm driver that
    # TaskManager had before the submission. It and its JVM must be gone after the cancel.
    [task_driver] = [psutil.Process(pid) for pid in drivers_before[name]]
    task_processes = [task_driver] + task_driver.children(recursive=True)
    assert any("java" in p.name() for p in task_processes), "expected the driver's JVM"
    t0 = time.monotonic()
    rest.cancel(job2)
    assert rest.wait_state(job2, ("CANCELED",), timeout_s=30)["state"] == "CANCELED"
    assert time.monotonic() - t0 < 15
    assert rest.wait_free_slots(4) == 4
    wait_for(
        "the cancelled task's processes gone",
        lambda: [p.pid for p in task_processes if p.is_running()],
        15,
        poll_s=0.2,
        until=lambda left: left == [],
    )


BROKEN_AT_BUILD = """
def build(ctx):
    raise ValueError("bad pipeline: the table 'clicks_raw' does not exist")
"""

BROKEN_AT_RUN = """
from pyspark.sql import functions as F


@F.udf("string")
def explode_on_bad_row(url):
    if url == "/checkout":
        raise RuntimeError("cannot price an empty cart")
    return url


def build(ctx):
    clicks = ctx.sources.datagen(seed=3, total=500, rows_per_second=500)
    return ctx.sinks.console(clicks.select(explode_on_bad_row("url").alias("u")))
"""


@pytest.mark.parametrize(
    "source, message",
    [
        (BROKEN_AT_BUILD, "ValueError: bad pipeline: the table 'clicks_raw' does not exist"),
        (BROKEN_AT_RUN, "RuntimeError: cannot price an empty cart"),
    ],
)
def test_failing_pipeline_ends_failed_with_its_traceback(cluster, tmp_path, source, message):
    c, _ = cluster
    rest = Rest(c.dispatcher_url)
    path = tmp_path / "broken_pipeline.py"
    path.write_text(source)
    job = rest.run(rest.upload(path), parallelism=1, restartStrategy={"type": "none"})
    final = rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=300)
    assert final["state"] == "FAILED"
    exceptions = rest.get(f"/jobs/{job}/exceptions")
    assert message in exceptions["root-exception"]
    assert "Traceback" in exceptions["root-exception"]
    assert exceptions["exceptionHistory"]["entries"][0]["taskManagerId"] in ("tm-1", "tm-2")
    assert rest.wait_free_slots(4) == 4


def test_no_service_was_refused_by_redis(cluster):
    """After real jobs ran, failed and were cancelled, Redis's ACL log holds no refusal: each
    service's and TaskManager's user (services/cluster/redis_auth.py) allows all it does."""
    import redis

    c, _ = cluster
    refused = [
        {k: e.get(k) for k in ("username", "reason", "object", "context")}
        for e in redis.Redis.from_url(c.redis_url).acl_log(count=50)
    ]
    assert refused == [], refused


def test_the_suites_warm_drivers_were_started_without_their_warm_up_query(cluster):
    """HEADRACE_WARM_UP_QUERY=false (tests/conftest.py) reaches the TaskManagers' drivers in
    reserve through the cluster's configuration (Settings -> DriverLaunch -> runner flag)."""
    c, _ = cluster
    logs = [p.read_text(errors="replace") for p in Path(c.settings.home).glob("work/taskmanagers/*/logs/driver-*.log")]
    reserve = [log for log in logs if "without the warm-up query" in log]
    assert reserve, f"no driver started in reserve without its warm-up query among {len(logs)}"
    assert not any("warm-up took" in log for log in logs)
