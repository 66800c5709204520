"""The dispatcher's REST API against a real catalog (SQLite and PostgreSQL: every test runs on
both) and, where a message must really reach the JobManager stream, a real redis-server.

Jobs are driven through their states with `shared.catalog.repository`, exactly as the
JobManager and ResourceManager would, and the API is checked to report them in Flink's shapes.
"""

from __future__ import annotations

import io
import zipfile
from datetime import datetime, timedelta, timezone

import pytest
from fastapi.testclient import TestClient

from services.dispatcher.app import create_app
from shared import checkpoint_storage, restart
from shared.catalog import repository
from shared.clock import SystemClock
from shared.ids import new_job_id
from shared.messages import CancelJob, SubmitJob, decode
from shared.states import JOB_STATE_NAMES
from shared.states import JobStatus as J
from shared.streams import JM_STREAM
from shared.transport import InMemoryTransport, RedisStreamsTransport
from tests.integration.dispatcher_support import (  # noqa: F401 - fixtures and their dependencies
    GOOD_PY,
    catalog,
    catalog_url,
    client,
    deploy,
    fail_attempt,
    finish,
    register_tm,
    schedule,
    settings,
    submit,
    transport,
    upload,
)

BAD_PY = b"""\
def build(ctx):
    x = (1,
    return x
"""


# --- fixtures --------------------------------------------------------------------------------


def make_zip(members: dict[str, bytes]) -> bytes:
    """The same bytes every time (a fixed member date): used in parametrize, whose values xdist's
    workers must collect alike."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


# --- driving jobs as the JobManager / ResourceManager would ----------------------------------


def job_row(catalog, job_id):
    with catalog.session() as s:
        return repository.get_job(s, job_id)


# --- cluster, docs, UI -----------------------------------------------------------------------


def test_health_config_docs_and_ui(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    cfg = client.get("/config").json()
    assert cfg["refresh-interval"] == 1000 and cfg["features"]["web-submit"] is True
    assert {"timezone-name", "timezone-offset", "flink-version"} <= cfg.keys()
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {"/jars/upload", "/jars/{jarid}/run", "/jobs/{jobid}", "/jobs/overview", "/taskmanagers"} <= paths.keys()
    # Validation failures are documented as what they are: 400 in the shared error shape.
    assert all("422" not in op["responses"] for ops in paths.values() for op in ops.values())
    assert paths["/jars/{jarid}/run"]["post"]["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }
    assert "ErrorBody" in spec["components"]["schemas"]
    index = client.get("/")
    assert index.status_code == 200 and "text/html" in index.headers["content-type"]
    assert "Headrace" in index.text
    assert client.get("/web/app.js").status_code == 200
    assert client.get("/web/style.css").status_code == 200


def test_unknown_routes_and_methods_answer_json(client):
    r = client.get("/no/such/thing")
    assert r.status_code == 404 and r.json()["errors"][0].startswith("Not found: /no/such/thing")
    r = client.get("/web/missing.js")
    assert r.status_code == 404 and "errors" in r.json()
    r = client.put("/jobs")
    assert r.status_code == 405 and r.json() == {"errors": ["method PUT is not allowed on /jobs"]}


def test_overview_counts_taskmanagers_slots_and_jobs(client, catalog):
    register_tm(catalog, "tm-a", slots=4, free=1)
    register_tm(catalog, "tm-b", slots=2, free=2)
    register_tm(catalog, "tm-gone", slots=8, free=8)
    with catalog.session() as s:
        repository.mark_taskmanager_gone(s, "tm-gone", state="LOST", reason="heartbeat timeout")
    jar = upload(client)["id"]
    running, finished, failed, cancelled, pending = (submit(client, jar) for _ in range(5))
    _, ex = schedule(catalog, running)
    deploy(catalog, running, ex)
    _, ex = schedule(catalog, finished)
    deploy(catalog, finished, ex)
    finish(catalog, finished, ex)
    with catalog.session() as s:
        repository.transition_job(s, failed, J.FAILED, epoch=1, reason="rejected")
        repository.transition_job(s, cancelled, J.CANCELED, epoch=1)
    body = client.get("/overview").json()
    assert body == {
        "taskmanagers": 2,
        "slots-total": 6,
        "slots-available": 3,
        "jobs-running": 2,
        "jobs-finished": 1,
        "jobs-cancelled": 1,
        "jobs-failed": 1,
        "flink-version": "headrace-0.1.0",
        "flink-commit": "unknown",
        "jobmanager": None,  # no JobManager announces itself in this test
    }


# --- jars --------------------------------------------------------------------------------------


def test_upload_list_and_delete_a_py_module(client, settings):
    up = upload(client, "word count.py")
    assert up["status"] == "success"
    assert up["id"].endswith("_word_count.py")
    assert up["filename"] == str(settings.artifacts / up["id"])
    assert (settings.artifacts / up["id"]).read_bytes() == GOOD_PY

    listing = client.get("/jars").json()
    assert listing["address"] == "http://testserver"
    [f] = listing["files"]
    assert f["id"] == up["id"] and f["name"] == "word count.py" and f["uploaded"] > 0
    assert [e["name"] for e in f["entry"]] == ["build", "other"]
    assert f["entry"][0]["description"] is None

    assert client.delete(f"/jars/{up['id']}").json() == {}
    assert not (settings.artifacts / up["id"]).exists()
    assert client.get("/jars").json()["files"] == []
    r = client.delete(f"/jars/{up['id']}")
    assert r.status_code == 404
    assert r.json()["errors"] == [f"jar {up['id']} not found"] and r.json()["field"] == "jarid"


def test_upload_rejects_a_module_that_does_not_compile_with_its_line(client, settings):
    r = client.post("/jars/upload", files={"jarfile": ("job.py", BAD_PY)})
    assert r.status_code == 400
    body = r.json()
    assert body["field"] == "jarfile" and body["line"] in (2, 3)
    assert "does not compile" in body["errors"][0] and f"line {body['line']}" in body["errors"][0]
    assert not list(settings.artifacts.glob("*")) if settings.artifacts.exists() else True
    assert client.get("/jars").json()["files"] == []


@pytest.mark.parametrize(
    "name,data,fragment",
    [
        ("job.jar", b"PK\x03\x04", "not a Python job"),
        ("job.py", b"", "is empty"),
        ("job.py", b"\xff\xfe\x00bad", "not UTF-8"),
        ("job.zip", b"not a zip at all", "not a valid zip"),
        ("job.zip", make_zip({"README.txt": b"hello"}), "contains no .py files"),
        ("job.zip", make_zip({"../evil.py": b"x = 1"}), "outside the archive"),
    ],
)
def test_upload_rejects_what_cannot_be_a_job(client, name, data, fragment):
    r = client.post("/jars/upload", files={"jarfile": (name, data)})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["errors"][0] and r.json()["field"] == "jarfile"


def test_upload_zip_checks_every_member(client):
    ok = upload(client, "pipeline.zip", make_zip({"pipeline/__init__.py": b"", "pipeline/main.py": GOOD_PY}))
    assert ok["status"] == "success"
    assert client.get("/jars").json()["files"][0]["entry"] == [{"name": "build", "description": None}]
    r = client.post("/jars/upload", files={"jarfile": ("bad.zip", make_zip({"pkg/a.py": GOOD_PY, "pkg/b.py": BAD_PY}))})
    assert r.status_code == 400
    assert r.json()["member"] == "pkg/b.py" and r.json()["line"] in (2, 3)


def test_upload_without_the_jarfile_field_names_it(client):
    r = client.post("/jars/upload", files={"file": ("job.py", GOOD_PY)})
    assert r.status_code == 400
    body = r.json()
    assert body["field"] == "jarfile" and body["errors"] == ["jarfile: field required"]
    assert "-F jarfile=@" in body["hint"]


def test_delete_refuses_a_jar_a_live_job_uses(client, catalog):
    jar = upload(client)["id"]
    job = submit(client, jar)
    r = client.delete(f"/jars/{jar}")
    assert r.status_code == 409 and job in r.json()["errors"][0]
    with catalog.session() as s:
        repository.transition_job(s, job, J.CANCELED, epoch=1)
    assert client.delete(f"/jars/{jar}").status_code == 200
    assert job_row(catalog, job).artifact_id is None


# --- run ---------------------------------------------------------------------------------------


def test_run_with_defaults_writes_the_job_and_publishes_submit(client, catalog, transport):
    jar = upload(client, "wordcount.py")["id"]
    job_id = submit(client, jar)
    assert len(job_id) == 32
    job = job_row(catalog, job_id)
    assert job.status == "INITIALIZING" and job.name == "wordcount" and job.artifact_id == jar
    assert (job.entry, job.parallelism, job.kind, job.program_args, job.config) == ("build", 1, "pyspark", [], {})
    assert job.restart_strategy == {"type": "fixed-delay", "attempts": 3, "delay": 1.0}
    assert transport.bodies(JM_STREAM) == [SubmitJob(job_id=job_id)]
    assert client.get("/jobs").json() == {"jobs": [{"id": job_id, "status": "INITIALIZING"}]}


def test_run_with_every_field(client, catalog, transport, tmp_path):
    savepoint = tmp_path / "home" / "savepoints" / "savepoint-012345-0123456789ab"  # inside the storage roots
    checkpoint_storage.take_empty_snapshot(savepoint, metadata={"job_id": "0" * 32, "kind": "savepoint"})
    jar = upload(client)["id"]
    wanted = "0123456789abcdef0123456789ABCDEF"
    job_id = submit(
        client,
        jar,
        {
            "entryClass": "other",
            "parallelism": 3,
            "programArgs": "--topic 'a b' -v",
            "jobId": wanted,
            "jobName": "orders",
            "kind": "noop",
            "config": {"checkpoint.interval": "5 s", "x": 1},
            "flinkConfiguration": {"x": "overridden", "y": "2"},
            "restartStrategy": {"type": "exponential-delay", "initial-backoff": "500 ms", "max-backoff": "2 min"},
            "savepointPath": f"file://{savepoint}",
            "allowNonRestoredState": True,
        },
    )
    assert job_id == wanted.lower()
    job = job_row(catalog, job_id)
    assert (job.name, job.entry, job.parallelism, job.kind) == ("orders", "other", 3, "noop")
    assert job.program_args == ["--topic", "a b", "-v"]
    assert job.config == {
        "x": 1,
        "y": "2",
        "checkpoint.interval": "5 s",
        "execution.savepoint.path": str(savepoint),
        "execution.savepoint.ignore-unclaimed-state": True,
    }
    assert job.restart_strategy == {
        "type": "exponential-delay",
        "initial-backoff": 0.5,
        "max-backoff": 120.0,
        "backoff-multiplier": 1.5,
        "reset-backoff-threshold": 3600.0,
        "jitter-factor": 0.1,
    }
    assert transport.bodies(JM_STREAM) == [SubmitJob(job_id=job_id)]


@pytest.mark.parametrize(
    "strategy,stored",
    [
        ({"type": "none"}, {"type": "none"}),
        (
            {"type": "fixed-delay", "attempts": 5, "delay": "10 s"},
            {"type": "fixed-delay", "attempts": 5, "delay": 10.0},
        ),
        (
            {"type": "FailureRate", "max_failures_per_interval": 2},
            {"type": "failure-rate", "max-failures-per-interval": 2, "failure-rate-interval": 60.0, "delay": 1.0},
        ),
        (
            {"type": "exponential-delay", "attempts-before-reset-backoff": 4, "backoff-multiplier": 2},
            {
                "type": "exponential-delay",
                "initial-backoff": 1.0,
                "max-backoff": 60.0,
                "backoff-multiplier": 2.0,
                "reset-backoff-threshold": 3600.0,
                "jitter-factor": 0.1,
                "attempts-before-reset-backoff": 4,
            },
        ),
    ],
)
def test_run_normalises_restart_strategies(client, catalog, strategy, stored):
    job_id = submit(client, upload(client)["id"], {"restartStrategy": strategy})
    assert job_row(catalog, job_id).restart_strategy == stored
    # What is stored is what the JobManager's restart strategies accept.
    assert restart.normalise(stored) == stored
    restart.build(stored, clock=SystemClock())


def test_run_takes_flink_query_parameters_and_the_body_wins(client, catalog):
    jar = upload(client)["id"]
    job_id = submit(client, jar, None, **{"entry-class": "other", "parallelism": "4", "program-args": "a 'b c'"})
    job = job_row(catalog, job_id)
    assert (job.entry, job.parallelism, job.program_args) == ("other", 4, ["a", "b c"])
    job_id = submit(client, jar, {"parallelism": 2, "programArgsList": ["x"]}, parallelism="4", programArg="p,q")
    job = job_row(catalog, job_id)
    assert (job.parallelism, job.program_args) == (2, ["x"])
    job_id = submit(client, jar, None, programArg="p,q")
    assert job_row(catalog, job_id).program_args == ["p", "q"]


@pytest.mark.parametrize(
    "body,params,field,fragment",
    [
        ({"parallelism": 0}, {}, "parallelism", "must be an integer >= 1, got 0"),
        ({"parallelism": "many"}, {}, "parallelism", "must be an integer >= 1"),
        ({"parallelism": 2.5}, {}, "parallelism", "must be an integer >= 1"),
        (None, {"parallelism": "0"}, "parallelism", "must be an integer >= 1"),
        ({"paralellism": 2}, {}, "paralellism", "unknown field"),
        ({"restartStrategy": {"type": "sometimes"}}, {}, "restartStrategy.type", "must be one of"),
        ({"restartStrategy": {"attempts": 2}}, {}, "restartStrategy.type", "field required"),
        ({"restartStrategy": {"type": "fixed-delay", "attempts": -1}}, {}, "restartStrategy.attempts", ">= 0"),
        ({"restartStrategy": {"type": "fixed-delay", "delay": "soon"}}, {}, "restartStrategy.delay", "duration"),
        (
            {"restartStrategy": {"type": "failure-rate", "max-failures-per-interval": 0}},
            {},
            "restartStrategy.max-failures-per-interval",
            ">= 1",
        ),
        (
            {"restartStrategy": {"type": "exponential-delay", "jitter-factor": 2}},
            {},
            "restartStrategy.jitter-factor",
            "between 0.0 and 1.0",
        ),
        ({"restartStrategy": {"type": "fixed-delay", "attemps": 2}}, {}, "restartStrategy.attemps", "unknown field"),
        ({"restartStrategy": "fixed-delay"}, {}, "restartStrategy", "JSON object"),
        ({"kind": "java"}, {}, "kind", "'pyspark' or 'noop'"),
        ({"jobId": "not-hex"}, {}, "jobId", "32 hexadecimal"),
        ({"entryClass": "com.acme.Main$1"}, {}, "entryClass", "Python function name"),
        ({"programArgs": "a", "programArgsList": ["b"]}, {}, "programArgs", "Confusing request"),
        ({"programArgs": "unbalanced 'quote"}, {}, "programArgs", "cannot be split"),
        ({"config": ["a"]}, {}, "config", "JSON object"),
        ({"jobName": ""}, {}, "jobName", "non-empty"),
        (None, {"program-args": "'open"}, "program-args", "cannot be split"),
    ],
)
def test_run_rejects_invalid_requests_naming_the_field(client, catalog, transport, body, params, field, fragment):
    jar = upload(client)["id"]
    r = client.post(f"/jars/{jar}/run", json=body, params=params)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["field"] == field, err
    assert fragment in err["errors"][0], err
    assert err["errors"][0].startswith(f"{field}: ")
    assert err["expected"]
    assert transport.bodies(JM_STREAM) == []
    assert client.get("/jobs").json() == {"jobs": []}


def test_run_rejects_malformed_json(client):
    jar = upload(client)["id"]
    r = client.post(f"/jars/{jar}/run", content=b'{"parallelism": ', headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["errors"][0].startswith("request body is not valid JSON")


def test_run_unknown_jar_is_404_json(client, transport):
    r = client.post("/jars/nope_job.py/run", json={})
    assert r.status_code == 404
    assert r.json()["errors"] == ["jar nope_job.py not found"] and r.json()["field"] == "jarid"
    assert "GET /jars" in r.json()["hint"]
    assert transport.bodies(JM_STREAM) == []


def test_run_refuses_an_entry_the_module_does_not_define(client, transport):
    jar = upload(client)["id"]
    r = client.post(f"/jars/{jar}/run", json={"entryClass": "main"})
    assert r.status_code == 400
    err = r.json()
    assert err["field"] == "entryClass" and "build, other" in err["hint"]
    no_build = upload(client, "helpers.py", b"def run(ctx):\n    pass\n")["id"]
    r = client.post(f"/jars/{no_build}/run", json={})
    assert r.status_code == 400 and "'build' is not defined" in r.json()["errors"][0]
    # noop jobs never call the entry; a name bound by assignment or import counts as defined.
    assert client.post(f"/jars/{no_build}/run", json={"kind": "noop"}).status_code == 200
    assigned = upload(client, "factory.py", b"from jobs import make\nbuild = make()\n")["id"]
    assert client.post(f"/jars/{assigned}/run", json={}).status_code == 200
    assert len(transport.bodies(JM_STREAM)) == 2


def test_run_refuses_a_duplicate_job_id(client):
    jar = upload(client)["id"]
    job_id = new_job_id()
    submit(client, jar, {"jobId": job_id})
    r = client.post(f"/jars/{jar}/run", json={"jobId": job_id})
    assert r.status_code == 409 and r.json()["field"] == "jobId"


def test_run_fails_the_job_when_the_stream_is_unreachable(settings, catalog):
    class Down(InMemoryTransport):
        def publish(self, stream, body, *, epoch=None):
            raise ConnectionError("redis is down")

    with TestClient(create_app(settings, catalog, Down())) as client:
        jar = upload(client)["id"]
        r = client.post(f"/jars/{jar}/run", json={})
        assert r.status_code == 503 and "unreachable" in r.json()["errors"][0]
        [job] = client.get("/jobs").json()["jobs"]
        assert job["status"] == "FAILED"
        exc = client.get(f"/jobs/{job['id']}/exceptions").json()
        assert "could not publish SubmitJob" in exc["root-exception"]


# --- jobs ---------------------------------------------------------------------------------------


def test_jobs_overview_reports_states_times_and_tasks(client, catalog):
    register_tm(catalog)
    jar = upload(client)["id"]
    waiting = submit(client, jar, {"jobName": "waiting", "parallelism": 2})
    running = submit(client, jar, {"jobName": "running"})
    _, ex = schedule(catalog, waiting, waiting="no TaskManager has 2 free slots (largest: 1)")
    _, ex = schedule(catalog, running)
    deploy(catalog, running, ex)
    submit(client, jar, {"jobName": "fresh"})

    jobs = client.get("/jobs/overview").json()["jobs"]
    assert [j["name"] for j in jobs] == ["fresh", "running", "waiting"]  # newest first
    by_name = {j["name"]: j for j in jobs}
    r = by_name["running"]
    assert r["jid"] == running and r["state"] == "RUNNING" and r["end-time"] == -1
    assert r["start-time"] > 0 and r["duration"] >= 0 and r["last-modification"] >= r["start-time"]
    assert r["tasks"]["total"] == 1 and r["tasks"]["running"] == 1
    assert set(r["tasks"]) == {
        "total",
        "created",
        "scheduled",
        "deploying",
        "running",
        "finished",
        "canceling",
        "canceled",
        "failed",
        "reconciling",
        "initializing",
    }
    w = by_name["waiting"]
    assert w["state"] == "CREATED" and w["tasks"]["scheduled"] == 1
    assert w["waiting-reason"] == "no TaskManager has 2 free slots (largest: 1)"
    assert by_name["fresh"]["tasks"]["total"] == 0 and by_name["fresh"]["state"] == "INITIALIZING"


def test_job_details_in_flink_shape(client, catalog):
    register_tm(catalog, host="worker-1")
    jar = upload(client)["id"]
    job_id = submit(client, jar, {"parallelism": 2, "config": {"spark.sql.shuffle.partitions": 6}})
    vertex_id, ex = schedule(catalog, job_id)
    deploy(catalog, job_id, ex, slots=(0, 1))
    with catalog.session() as s:
        repository.record_progress(s, ex, batch_id=3, rows=120)

    d = client.get(f"/jobs/{job_id}").json()
    assert d["jid"] == job_id and d["name"] == "job" and d["state"] == "RUNNING" and d["isStoppable"] is False
    assert d["maxParallelism"] == 6 and d["job-type"] == "STREAMING" and d["now"] >= d["start-time"] > 0
    assert set(d["timestamps"]) == set(JOB_STATE_NAMES)  # Flink's states, those Headrace never enters at 0
    assert d["timestamps"]["INITIALIZING"] == d["start-time"]
    assert d["timestamps"]["CREATED"] > 0 and d["timestamps"]["RUNNING"] >= d["timestamps"]["CREATED"]
    assert d["timestamps"]["FINISHED"] == 0
    [v] = d["vertices"]
    assert v["id"] == vertex_id and v["parallelism"] == 2 and v["maxParallelism"] == 6
    assert v["status"] == "RUNNING" and v["start-time"] > 0 and v["end-time"] == -1 and v["duration"] >= 0
    assert v["tasks"]["RUNNING"] == 1 and sum(v["tasks"].values()) == 1
    assert v["metrics"]["read-records"] == 120
    assert d["status-counts"]["RUNNING"] == 1
    assert d["plan"]["jid"] == job_id and d["plan"]["type"] == "STREAMING"
    assert d["plan"]["nodes"][0]["id"] == vertex_id and d["plan"]["nodes"][0]["parallelism"] == 2
    assert d["restart-strategy"] == {"type": "fixed-delay", "attempts": 3, "delay": 1.0}
    assert d["attempts"] == 1 and d["waiting-reason"] is None

    cfg = client.get(f"/jobs/{job_id}/config").json()
    assert cfg["jid"] == job_id and cfg["execution-config"]["job-parallelism"] == 2
    assert cfg["execution-config"]["user-config"] == {"spark.sql.shuffle.partitions": 6}


def test_job_waiting_reason_comes_from_the_job_or_its_attempt(client, catalog):
    jar = upload(client)["id"]
    job_id = submit(client, jar)
    with catalog.session() as s:
        repository.set_job_waiting_reason(s, job_id, "waiting for a JobManager leader")
    assert client.get(f"/jobs/{job_id}").json()["waiting-reason"] == "waiting for a JobManager leader"
    with catalog.session() as s:
        repository.set_job_waiting_reason(s, job_id, None)
    schedule(catalog, job_id, waiting="slot request pending: 0 of 1 slots free")
    assert client.get(f"/jobs/{job_id}").json()["waiting-reason"] == "slot request pending: 0 of 1 slots free"


def test_unknown_job_is_404_json_for_any_id(client):
    for bad in ["0" * 32, "not-an-id", "x" * 500, "%00", "caf%C3%A9"]:
        for suffix in ["", "/exceptions", "/config", "/vertices/abc"]:
            r = client.get(f"/jobs/{bad}{suffix}")
            assert r.status_code == 404, (bad, suffix, r.text)
            assert r.json()["field"] == "jobid" and "not found" in r.json()["errors"][0]
    r = client.patch(f"/jobs/{'0' * 32}", params={"mode": "cancel"})
    assert r.status_code == 404 and r.json()["field"] == "jobid"


def test_vertex_details_show_the_current_attempt_and_the_history(client, catalog):
    register_tm(catalog, "tm-a", host="worker-1")
    register_tm(catalog, "tm-b", host="worker-2")
    jar = upload(client)["id"]
    job_id = submit(client, jar)
    vertex_id, ex0 = schedule(catalog, job_id)
    deploy(catalog, job_id, ex0, tm_id="tm-a")
    fail_attempt(catalog, job_id, ex0, cause="Traceback ...\nValueError: bad row")
    _, ex1 = schedule(catalog, job_id, attempt=1, vertex_id=vertex_id)
    deploy(catalog, job_id, ex1, tm_id="tm-b", slots=(1,))

    d = client.get(f"/jobs/{job_id}/vertices/{vertex_id}").json()
    assert d["id"] == vertex_id and d["parallelism"] == 1 and d["now"] > 0
    [st] = d["subtasks"]
    assert st["subtask"] == 0 and st["attempt"] == 1 and st["status"] == "RUNNING"
    assert st["endpoint"] == "worker-2" and st["taskmanager-id"] == "tm-b"
    assert {"CREATED", "SCHEDULED", "DEPLOYING", "RUNNING"} <= set(st["status-timestamps"])
    assert set(st["status-duration"]) == {"CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING"}
    assert [a["attempt"] for a in d["attempts"]] == [0, 1]
    first = d["attempts"][0]
    assert first["status"] == "FAILED" and first["failure-cause"].endswith("ValueError: bad row")
    assert first["taskmanager-id"] == "tm-a" and first["slots"] == [0] and first["end-time"] > 0
    assert client.get(f"/jobs/{job_id}").json()["attempts"] == 2

    r = client.get(f"/jobs/{job_id}/vertices/{'f' * 32}")
    assert r.status_code == 404 and r.json()["field"] == "vertexid"


def test_exception_history_newest_first_and_bounded(client, catalog):
    register_tm(catalog, "tm-a", host="worker-1")
    jar = upload(client)["id"]
    job_id = submit(client, jar)
    empty = client.get(f"/jobs/{job_id}/exceptions").json()
    assert empty == {
        "root-exception": None,
        "timestamp": None,
        "all-exceptions": [],
        "truncated": False,
        "exceptionHistory": {"entries": [], "truncated": False},
    }
    with catalog.session() as s:
        for i in range(3):
            repository.record_exception(
                s,
                job_id=job_id,
                exception_name=f"Error{i}",
                stacktrace=f"trace {i}",
                vertex_name="Source: rate",
                attempt=i,
                taskmanager_id="tm-a",
            )
    body = client.get(f"/jobs/{job_id}/exceptions").json()
    entries = body["exceptionHistory"]["entries"]
    assert [e["exceptionName"] for e in entries] == ["Error2", "Error1", "Error0"]
    assert body["root-exception"] == "trace 2" and body["timestamp"] == entries[0]["timestamp"] > 0
    e = entries[0]
    assert (e["taskName"], e["endpoint"], e["taskManagerId"], e["attempt"], e["failureLabels"]) == (
        "Source: rate",
        "worker-1",
        "tm-a",
        2,
        {},
    )
    limited = client.get(f"/jobs/{job_id}/exceptions", params={"maxExceptions": 2}).json()
    assert len(limited["exceptionHistory"]["entries"]) == 2 and limited["exceptionHistory"]["truncated"] is True
    r = client.get(f"/jobs/{job_id}/exceptions", params={"maxExceptions": 0})
    assert r.status_code == 400 and r.json()["field"] == "maxExceptions"


# --- cancel ------------------------------------------------------------------------------------


def test_cancel_publishes_cancel_job_for_live_jobs_only(client, catalog, transport):
    jar = upload(client)["id"]
    job_id = submit(client, jar)
    _, ex = schedule(catalog, job_id)
    deploy(catalog, job_id, ex)
    r = client.patch(f"/jobs/{job_id}", params={"mode": "cancel"})
    assert r.status_code == 202 and r.json() == {}
    assert transport.bodies(JM_STREAM)[-1] == CancelJob(job_id=job_id)
    assert client.patch(f"/jobs/{job_id}").status_code == 202  # mode defaults to cancel, as in Flink

    r = client.patch(f"/jobs/{job_id}", params={"mode": "stop"})
    assert r.status_code == 400 and r.json()["field"] == "mode" and r.json()["expected"] == "'cancel'"

    finish(catalog, job_id, ex)
    published = len(transport.bodies(JM_STREAM))
    r = client.patch(f"/jobs/{job_id}", params={"mode": "cancel"})
    assert r.status_code == 409
    assert r.json()["errors"] == [
        f"job {job_id} cannot be cancelled: it has already reached the terminal state FINISHED"
    ]
    assert len(transport.bodies(JM_STREAM)) == published


# --- taskmanagers ------------------------------------------------------------------------------


def test_taskmanagers_list_and_details(client, catalog):
    job_id = new_job_id()
    register_tm(
        catalog,
        "tm-a",
        host="worker-1",
        slots=4,
        free=2,
        allocations=[
            {"index": 0, "allocation_id": "a" * 32, "job_id": job_id, "execution_id": "e" * 32},
            {"index": 1, "allocation_id": "a" * 32, "job_id": job_id, "execution_id": "e" * 32},
        ],
    )
    register_tm(catalog, "tm-b", host="worker-2", slots=2, free=2)
    register_tm(catalog, "tm-lost", host="worker-3")
    with catalog.session() as s:
        repository.mark_taskmanager_gone(s, "tm-lost", state="LOST", reason="heartbeat timeout")

    tms = client.get("/taskmanagers").json()["taskmanagers"]
    assert [t["id"] for t in tms] == ["tm-a", "tm-b"]
    a = tms[0]
    assert (a["slotsNumber"], a["freeSlots"], a["dataPort"], a["jmxPort"], a["path"]) == (4, 2, -1, -1, "tm.tm-a")
    assert a["timeSinceLastHeartbeat"] > 1_600_000_000_000  # epoch ms, as Flink reports it
    assert a["totalResource"]["cpuCores"] == 4.0 and a["freeResource"]["cpuCores"] == 2.0
    assert a["totalResource"]["taskHeapMemory"] == 8192 and a["freeResource"]["taskHeapMemory"] == 4096
    assert a["hardware"] == {"cpuCores": 4, "physicalMemory": 8 * 2**30, "freeMemory": 4 * 2**30, "managedMemory": 0}
    assert "memoryConfiguration" in a

    d = client.get("/taskmanagers/tm-a").json()
    assert d["state"] == "REGISTERED" and [s["index"] for s in d["allocatedSlots"]] == [0, 1]
    assert d["allocatedSlots"][0] == {
        "index": 0,
        "allocation_id": "a" * 32,
        "job_id": job_id,
        "execution_id": "e" * 32,
        "memory": None,
    }  # no Redis here: no TaskManager's figures
    lost = client.get("/taskmanagers/tm-lost").json()
    assert lost["state"] == "LOST" and lost["freeSlots"] == 0 and lost["lost-reason"] == "heartbeat timeout"
    r = client.get("/taskmanagers/nope")
    assert r.status_code == 404 and r.json()["errors"] == ["taskmanager 'nope' not found"]


# --- the JobManager stream on a real redis-server ----------------------------------------------


def test_submit_and_cancel_land_in_the_jm_stream(redis_url, settings, catalog):
    transport = RedisStreamsTransport.from_url(redis_url, sender="dispatcher", maxlen=settings.stream_maxlen)
    try:
        with TestClient(create_app(settings, catalog, transport)) as client:
            jar = upload(client)["id"]
            job_id = submit(client, jar, {"parallelism": 2})
            assert client.patch(f"/jobs/{job_id}", params={"mode": "cancel"}).status_code == 202
        entries = transport.client.xrange(JM_STREAM)
        envelopes = [decode(fields[b"m"]) for _, fields in entries]
        assert [e.body for e in envelopes] == [SubmitJob(job_id=job_id), CancelJob(job_id=job_id)]
        assert {e.sender for e in envelopes} == {"dispatcher"}
        # ... and a JobManager consumer group reads them (the job row already exists when it does).
        seen: list = []
        transport.poll(JM_STREAM, "jobmanager", "jm-1", lambda env: seen.append(env.body), block_ms=10)
        transport.poll(JM_STREAM, "jobmanager", "jm-1", lambda env: seen.append(env.body), block_ms=10)
        assert seen == [SubmitJob(job_id=job_id), CancelJob(job_id=job_id)]
        assert job_row(catalog, job_id).status == "INITIALIZING"
    finally:
        transport.close()


def test_times_are_epoch_milliseconds(client, catalog):
    jar = upload(client)["id"]
    before = int(datetime.now(timezone.utc).timestamp() * 1000)
    job_id = submit(client, jar)
    after = int((datetime.now(timezone.utc) + timedelta(seconds=1)).timestamp() * 1000)
    d = client.get(f"/jobs/{job_id}").json()
    assert before - 1000 <= d["start-time"] <= after
    assert client.get("/jars").json()["files"][0]["uploaded"] <= after
