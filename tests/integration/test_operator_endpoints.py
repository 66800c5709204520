"""The operator dashboard's REST backend on the real stack (one small cluster for the module):
live task figures of a streaming job reading a Redis stream, TaskManager and JobManager logs
fetched from the processes themselves, the masked configuration, the leader, and a killed
TaskManager's logs answering an error at once."""

from __future__ import annotations

import json
import time
from itertools import pairwise

import httpx
import pytest
import redis

from services.dispatcher.guards.auth import required_role
from shared import streams
from shared.catalog import repository
from tests.clusters import start_cluster
from tests.waiting import wait_for

STREAM = "operator-endpoints-input"
MARKER = "operator-endpoints: build() was called"
CATALOG_PASSWORD = "s3cret-catalog-pw"  # trust auth ignores it; it must never be shown
PIPELINE = f"""\
def build(ctx):
    print({MARKER!r}, flush=True)
    events = ctx.sources.redis_stream({STREAM!r}, schema="key STRING, n BIGINT", max_entries_per_trigger=2)
    return ctx.sinks.console(events, trigger="300 milliseconds", num_rows=1)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    scheme, _, rest = pg_url_module.partition("://")
    user, _, host = rest.partition("@")
    catalog = f"{scheme}://{user}:{CATALOG_PASSWORD}@{host}"
    c = start_cluster(
        tmp_path_factory.mktemp("operator-home"),
        catalog_url=catalog,
        taskmanagers=1,
        slots=2,
        warm_drivers=1,
        spark_ui=True,
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def source(cluster):
    client = redis.Redis.from_url(cluster.redis_url)
    yield client
    client.close()


def produce(client, start: int, count: int) -> None:
    for i in range(start, start + count):
        client.xadd(STREAM, {"json": json.dumps({"key": f"k{i % 3}", "n": i})})


@pytest.fixture(scope="module")
def job(rest, source, tmp_path_factory):
    produce(source, 0, 30)  # fifteen batches' worth: the first batches see a backlog
    path = tmp_path_factory.mktemp("pipeline") / "operator_pipeline.py"
    path.write_text(PIPELINE)
    job_id = rest.run(rest.upload(path))
    rest.wait_running_task(job_id, timeout_s=240)  # a cold driver under a loaded machine
    return job_id


@pytest.fixture(scope="module")
def tm_id(rest) -> str:
    return rest.get("/taskmanagers")["taskmanagers"][0]["id"]


def progress(rest, job_id: str) -> list[dict]:
    return rest.get(f"/jobs/{job_id}/progress")["tasks"]


def test_progress_batch_ids_rise_and_source_lag_drains(rest, source, job, cluster):
    first = wait_for("a progress report", lambda: progress(rest, job), timeout_s=60)[0]
    assert first["vertexId"] and first["executionId"] and first["attempt"] == 0 and first["subtask"] == 0
    assert first["taskmanagerId"] == "tm-1"
    lags = [first["sourceLag"]]
    later = wait_for(
        "a newer batch", lambda: [t for t in progress(rest, job) if t["batchId"] > first["batchId"]], timeout_s=30
    )[0]
    lags.append(later["sourceLag"])
    assert later["timestamp"] >= first["timestamp"]
    produce(source, 30, 6)
    done = wait_for(
        "source lag 0 once the producer stopped",
        lambda: [t for t in progress(rest, job) if t["sourceLag"] == 0 and t["batchId"] > later["batchId"]],
        timeout_s=30,
        poll_s=0.3,
    )[0]
    assert any(lag and lag > 0 for lag in lags), f"no backlog seen while 2 of 30 entries were read per batch: {lags}"
    assert done["numInputRows"] >= 0 and done["inputRowsPerSecond"] >= 0 and done["batchDurationMs"] >= 0
    # The Spark UI link (spark_ui=True) names the TaskManager's host and answers.
    assert done["sparkUi"].startswith("http://127.0.0.1:"), done["sparkUi"]
    assert httpx.get(done["sparkUi"], timeout=5, follow_redirects=True).status_code == 200
    # Same numbers as Prometheus: the TaskManager's own endpoint shows the lag at 0 too.
    tm_metrics = json.loads((cluster.run_dir / "cluster.json").read_text())["metrics"]["taskmanager-1"]
    scraped = httpx.get(tm_metrics, timeout=5).text
    assert f'headrace_task_source_lag{{execution="{done["executionId"]}"' in scraped
    # Flink's vertex metrics, from the same figures.
    vid = done["vertexId"]
    names = {m["id"] for m in rest.get(f"/jobs/{job}/vertices/{vid}/metrics")}
    assert {"numRecordsInPerSecond", "sourceLag", "batchDurationMs"} <= names
    asked = rest.get(f"/jobs/{job}/vertices/{vid}/metrics?get=sourceLag,batchDurationMs,nope")
    got = {m["id"]: m["value"] for m in asked}
    assert set(got) <= {"sourceLag", "batchDurationMs"} and "sourceLag" in got
    assert rest.http.get("/jobs/00000000000000000000000000000000/progress").status_code == 404


def history(rest, job_id: str, **params) -> list[dict]:
    r = rest.http.get(f"/jobs/{job_id}/progress/history", params=params)
    assert r.status_code == 200, r.text
    return r.json()["tasks"]


def test_progress_history_of_a_running_job_is_ordered_recent_and_bounded(rest, source, job):
    produce(source, 100, 20)  # ten more batches, over three seconds at least
    current = wait_for("a progress report", lambda: progress(rest, job), timeout_s=60)[0]
    [task] = wait_for(
        "three seconds of history",
        lambda: [t for t in history(rest, job) if t["executionId"] == current["executionId"] and len(t["points"]) >= 3],
        timeout_s=60,
        poll_s=0.5,
    )
    assert task["attempt"] == current["attempt"] and task["vertexId"] == current["vertexId"]
    points = task["points"]
    times = [p["timestamp"] for p in points]
    assert all(b - a >= 1000 for a, b in pairwise(times)), times  # ordered, at most one a second
    assert [p["batchId"] for p in points] == sorted(p["batchId"] for p in points)
    now_ms = time.time() * 1000
    assert now_ms - 600_000 <= times[0] and times[-1] <= now_ms + 1000
    assert len(points) <= streams.PROGRESS_HISTORY_POINTS
    assert all(p["inputRowsPerSecond"] is not None and p["numInputRows"] is not None for p in points)
    # A shorter window is a suffix of it.
    recent = history(rest, job, seconds=2)
    assert all(p["timestamp"] >= now_ms - 3000 for t in recent for p in t["points"])
    assert rest.http.get(f"/jobs/{job}/progress/history", params={"seconds": 601}).status_code in (400, 422)
    assert rest.http.get("/jobs/00000000000000000000000000000000/progress/history").status_code == 404
    spec = rest.get("/openapi.json")["paths"]["/jobs/{jobid}/progress/history"]["get"]
    assert "200" in spec["responses"] and any(p["name"] == "seconds" for p in spec["parameters"])


def test_a_savepoint_asked_right_after_submission_completes_once_the_task_runs(rest, source, cluster, tmp_path_factory):
    stream = "operator-endpoints-savepoint"
    path = tmp_path_factory.mktemp("savepoint-pipeline") / "savepoint_pipeline.py"
    path.write_text(PIPELINE.replace(STREAM, stream))
    job_id = rest.run(rest.upload(path))
    r = rest.http.post(f"/jobs/{job_id}/savepoints", json={})  # at once: the task is not running yet
    assert r.status_code == 202, r.text
    rid = r.json()["request-id"]
    reasons, n = [], 0
    # Under load a cold driver may miss the 120 s start-up timeout and the request waits through
    # the restart too (its own bound, execution.checkpointing.timeout, is 600 s).
    deadline = time.monotonic() + 420
    while True:
        status = rest.get(f"/jobs/{job_id}/savepoints/{rid}")
        if status["status"]["id"] == "COMPLETED":
            break
        if status.get("waiting"):
            reasons.append(status["waiting"]["reason"])
            assert status["waiting"]["deadline"] > status["waiting"]["since"]
        source.xadd(stream, {"json": json.dumps({"key": f"k{n % 3}", "n": n})})  # batches to commit at
        n += 1
        assert time.monotonic() < deadline, f"savepoint still {status} after 420 s"
        time.sleep(0.2)
    assert "location" in status["operation"], status  # completed, not failed
    assert set(status) == {"status", "operation"}  # Flink's shape once done
    from shared.catalog import Catalog

    catalog = Catalog(cluster.settings.catalog)
    try:
        with catalog.session() as s:
            op = repository.get_operation(s, rid)
            assert op.params["waited_s"] > 0, op.params  # it did wait for the task
    finally:
        catalog.dispose()
    assert all("not RUNNING yet" in reason for reason in reasons), reasons
    rest.cancel(job_id)
    rest.wait_state(job_id, ["CANCELED"], timeout_s=60)


def test_taskmanager_logs_are_listed_and_read(rest, job, tm_id):
    wait_for("a progress report", lambda: progress(rest, job), timeout_s=60)
    names = {f["name"]: f for f in rest.get(f"/taskmanagers/{tm_id}/logs")["logs"]}
    assert "taskmanager-1.log" in names, names
    drivers = [n for n in names if n.startswith("driver-")]
    assert drivers, names
    assert all(f["size"] >= 0 and f["mtime"] > 0 for f in names.values())
    texts = {}
    for name in drivers:
        r = rest.http.get(f"/taskmanagers/{tm_id}/logs/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
        texts[name] = r.text
    assert any(MARKER in t for t in texts.values()), "no driver log holds what the pipeline printed"
    r = rest.http.get(f"/taskmanagers/{tm_id}/logs/{drivers[0]}", params={"tail": 64})
    assert r.status_code == 200 and len(r.content) <= 64
    main = rest.http.get(f"/taskmanagers/{tm_id}/log")
    assert main.status_code == 200 and "TaskManager tm-1 started" in main.text


@pytest.mark.parametrize(
    "name", ["..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "%2E%2E", ".hidden", "jobmanager.log", "no-such.log"]
)
def test_log_names_outside_the_listing_are_refused(rest, tm_id, name):
    r = rest.http.get(f"/taskmanagers/{tm_id}/logs/{name}")
    assert r.status_code in (400, 404), (r.status_code, r.text)
    assert "root:" not in r.text and r.json()["errors"]


def test_bad_tail_and_unknown_taskmanager(rest, tm_id):
    r = rest.http.get(f"/taskmanagers/{tm_id}/logs/taskmanager-1.log", params={"tail": 10 * 1024 * 1024})
    assert r.status_code == 400 and r.json()["field"] == "tail"
    assert rest.http.get("/taskmanagers/tm-nope/logs").status_code == 404


def test_logs_need_the_operator_role():
    for path in (
        "/jobmanager/logs",
        "/jobmanager/logs/jobmanager.log",
        "/taskmanagers/tm-1/logs",
        "/taskmanagers/tm-1/logs/x.log",
        "/taskmanagers/tm-1/log",
        "/v1/jobmanager/logs",
    ):
        assert required_role("GET", path) == "operator", path
    for path in ("/jobmanager/config", "/jobmanager/leader", "/taskmanagers/tm-1", "/jobs/x/progress"):
        assert required_role("GET", path) == "viewer", path


def test_jobmanager_config_masks_secrets(rest):
    r = rest.http.get("/jobmanager/config")
    assert r.status_code == 200
    config = {e["key"]: e["value"] for e in r.json()}
    assert CATALOG_PASSWORD not in r.text
    assert "******" in config["catalog_url"] and config["catalog_url"].startswith("postgresql://postgres:")
    assert "******" in config["catalog"]
    assert config["taskmanager_slots"] == "2" and config["spark_ui"] == "true"


def test_jobmanager_leader_and_its_logs(rest, source):
    leader = rest.get("/jobmanager/leader")
    assert leader["epoch"] == int(source.get("hr:jm:epoch"))
    assert leader["leader"]["epoch"] == leader["epoch"] and leader["leader"]["mode"] == "none"
    assert leader["leader"]["address"].startswith("http://127.0.0.1:")
    assert leader["contenders"] == []
    names = [f["name"] for f in rest.get("/jobmanager/logs")["logs"]]
    assert names == ["jobmanager.log"], names
    r = rest.http.get("/jobmanager/logs/jobmanager.log")
    assert r.status_code == 200 and "started as leader" in r.text
    assert rest.http.get("/jobmanager/logs/resourcemanager.log").status_code == 404


def test_killed_taskmanager_answers_an_error_at_once(rest, cluster, tm_id):
    cluster.kill("taskmanager-1")
    for path in (f"/taskmanagers/{tm_id}/logs", f"/taskmanagers/{tm_id}/log"):
        started = time.monotonic()
        r = rest.http.get(path, timeout=10)
        took = time.monotonic() - started
        assert took < 3, f"{path} took {took:.1f} s"
        assert 400 <= r.status_code < 600 and r.status_code != 500, (r.status_code, r.text)
        assert "tm-1" in r.json()["errors"][0]


def test_contenders_are_read_from_the_election_znodes(zookeeper):
    import threading
    from types import SimpleNamespace

    from services.dispatcher.routes.jobmanager import _contenders, _read_contenders
    from shared.zookeeper import LeaderElection

    settings = SimpleNamespace(
        high_availability="zookeeper", zookeeper_quorum=zookeeper.quorum, zookeeper_root="/headrace-ops"
    )
    stop = threading.Event()
    elections = [
        LeaderElection(zookeeper.quorum, root="/headrace-ops", contender_id=f"jobmanager@test:{i}") for i in (1, 2)
    ]
    standby = threading.Thread(target=elections[1].campaign, kwargs={"stop": stop.is_set}, daemon=True)
    try:
        for e in elections:
            e.start()
        assert elections[0].campaign(stop=stop.is_set) is not None  # leads
        standby.start()
        got = wait_for(
            "both contenders",
            lambda: (lambda c: c if len(c[0]) == 2 else None)(_read_contenders(settings)),
            timeout_s=15,
            poll_s=0.2,
        )
        assert got == (["jobmanager@test:1", "jobmanager@test:2"], None)
        state = SimpleNamespace()
        assert _contenders(settings, state) == got
    finally:
        stop.set()
        if standby.is_alive():
            standby.join(5)  # out of its campaign before the leader lets go: else it wins on a closing client
        for e in elections:
            e.close()
    settings.zookeeper_quorum = "127.0.0.1:1"  # nothing listens: an error in the answer, not a hang
    # The dashboard asks every second: within a few seconds the answer comes from the cache,
    # not from a new ZooKeeper session.
    assert _contenders(settings, state) == got
    started = time.monotonic()
    contenders, problem = _read_contenders(settings)
    assert contenders == [] and "not reachable" in problem and time.monotonic() - started < 5


def test_masking_of_urls_and_secret_settings():
    from services.dispatcher.routes.jobmanager import masked_value

    assert masked_value("catalog_url", "postgresql://app:pw@db:5432/x") == "postgresql://app:******@db:5432/x"
    assert masked_value("redis_url", "redis://:pw@r:6379/0") == "redis://:******@r:6379/0"
    assert masked_value("x", "postgresql://db/x?user=a&password=pw") == "postgresql://db/x?user=a&password=******"
    assert masked_value("api_token", "abc") == "******" and masked_value("home", "/srv") == "/srv"
    assert masked_value("checkpointing", {"s3.secret-key": "k", "interval": "10 s"}) == {
        "s3.secret-key": "******",
        "interval": "10 s",
    }


def test_log_files_serve_only_their_own(tmp_path):
    from shared.log_files import LogFiles, read_tail

    run_logs, drivers = tmp_path / "logs", tmp_path / "drivers"
    run_logs.mkdir()
    drivers.mkdir()
    (run_logs / "taskmanager-1.log").write_text("tm\n")
    (run_logs / "taskmanager-1.log.1").write_text("older\n")
    (run_logs / "taskmanager-10.log").write_text("another TaskManager\n")
    (run_logs / "dispatcher.log").write_text("not mine\n")
    (drivers / "driver-d1-1.log").write_text("line 1\nline 2\n")
    (drivers / "secret.log").symlink_to("/etc/passwd")
    files = LogFiles(run_logs / "taskmanager-1.log", (drivers,))
    names = [f["name"] for f in files.listing()]
    assert names[0] == "taskmanager-1.log" and set(names) == {
        "taskmanager-1.log",
        "taskmanager-1.log.1",
        "driver-d1-1.log",
    }
    for bad in ("../logs/dispatcher.log", "secret.log", "dispatcher.log", "taskmanager-10.log", "..", ""):
        assert files.path_of(bad) is None, bad
    assert read_tail(files.path_of("driver-d1-1.log"), 9) == b"line 2\n"  # cut at a line start


def test_redis_stream_entries_after_counts_and_estimates(redis_url):
    from services.taskmanager.runtime.connectors.redis_stream_entries import entries_after

    client = redis.Redis.from_url(redis_url)
    ids = [client.xadd("lag-count", {"json": "{}"}, id=f"{1000 + i}-0").decode() for i in range(50)]
    assert entries_after(client, "lag-count", ids[-1], ids[-1]) == 0
    assert entries_after(client, "lag-count", ids[9]) == 40
    assert entries_after(client, "lag-count", "0-0") == 50
    estimate = entries_after(client, "lag-count", ids[9], cap=10)  # past the cap: from the ids' times
    assert 10 <= estimate <= 50 and abs(estimate - 40) <= 2, estimate


def test_a_redis_stream_batch_is_read_in_one_partition_per_16_entries_at_most(redis_url):
    """A trickle's batch in one partition (each costs a task and a Python worker round trip); a
    big batch across the job's parallelism."""
    from pyspark.sql.types import LongType, StructField, StructType

    from services.taskmanager.runtime.connectors import redis_streams as rs

    client = redis.Redis.from_url(redis_url)
    ids = [client.xadd("split-count", {"json": "{}"}, id=f"{1000 + i}-0").decode() for i in range(100)]
    reader = rs._StreamReader(
        rs._Options({"stream": "split-count", "url": redis_url, "partitions": "4"}),
        StructType([StructField("n", LongType())]),
    )

    def parts(after: str, until: str) -> int:
        return len(reader.partitions({"id": after}, {"id": until}))

    assert rs.SPLIT_MIN_ENTRIES == 16
    assert parts(ids[80], ids[-1]) == 1  # 19 entries
    assert parts(ids[60], ids[-1]) == 2  # 39 entries
    assert parts("0-0", ids[-1]) == 4
    # Entries beyond the batch count too: never fewer partitions than the batch needs.
    assert parts("0-0", ids[9]) == 4
    reader.stop()
