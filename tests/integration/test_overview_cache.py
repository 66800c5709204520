"""GET /jobs/overview from its cache (services/dispatcher/views/overview_cache.py), against a real
catalog (SQLite and PostgreSQL): the same answer as building it per request the way the route
did before the cache (every row as an ORM object, validated by the response model), a submission
visible in the very next answer, and the JobManager's changes visible once the time-to-live ends.
"""

from __future__ import annotations

import time
from collections import defaultdict

from fastapi.testclient import TestClient
from sqlalchemy import select

from services.dispatcher.app import create_app
from services.dispatcher.schemas import MultipleJobsDetails
from services.dispatcher.views import shapes
from shared.catalog import repository
from shared.catalog.models import Execution, Vertex
from shared.ids import new_job_id, new_vertex_id
from shared.settings import Settings
from shared.states import JobStatus as J
from shared.transport import InMemoryTransport
from tests.integration.dispatcher_support import (  # noqa: F401 - fixtures and their dependencies
    catalog,
    catalog_url,
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

NOW_MS = 1_900_000_000_000  # a fixed "now": durations of running jobs are the same in both answers


def app_with(settings: Settings, catalog, transport, *, cache_ms: int, clock_ms=None) -> TestClient:
    return TestClient(
        create_app(settings.model_copy(update={"overview_cache_ms": cache_ms}), catalog, transport, clock_ms=clock_ms)
    )


def reference_overview(catalog, now_ms: int) -> dict:
    """The answer as the route built it before the cache: every job, vertex and attempt loaded as
    ORM objects, then validated and serialised by the response model (as FastAPI does)."""
    with catalog.session() as s:
        jobs = repository.list_jobs(s)
        vertices = defaultdict(list)
        for v in s.execute(select(Vertex).order_by(Vertex.job_id, Vertex.idx)).scalars():
            vertices[v.job_id].append(v)
        latest = defaultdict(dict)
        for ex in s.execute(select(Execution).order_by(Execution.attempt)).scalars():
            latest[ex.job_id][ex.vertex_id] = ex
        answer = {"jobs": [shapes.job_overview(j, vertices[j.id], latest[j.id], now_ms) for j in reversed(jobs)]}
    return MultipleJobsDetails.model_validate(answer).model_dump(mode="json", by_alias=True)


def populate(client, catalog) -> dict[str, str]:
    """Jobs in different states, some with several vertices and several attempts per vertex."""
    register_tm(catalog)
    jar = upload(client)["id"]
    ids = {}
    ids["fresh"] = submit(client, jar, {"jobName": "fresh ✓ jöb"})
    ids["waiting"] = submit(client, jar, {"jobName": "waiting", "parallelism": 2})
    schedule(catalog, ids["waiting"], waiting="no TaskManager has 2 free slots (largest: 1)")
    ids["running"] = submit(client, jar, {"jobName": "running", "config": {"execution.runtime-mode": "streaming"}})
    _, ex = schedule(catalog, ids["running"])
    deploy(catalog, ids["running"], ex)
    # Two vertices; the first failed once and runs again as attempt 1, the second still waits.
    ids["restarted"] = submit(client, jar, {"jobName": "restarted"})
    v1, ex = schedule(catalog, ids["restarted"])
    deploy(catalog, ids["restarted"], ex)
    v2 = new_vertex_id()
    with catalog.session() as s:
        repository.create_vertex(s, id=v2, job_id=ids["restarted"], name="Sink: second", parallelism=1, idx=1)
    fail_attempt(catalog, ids["restarted"], ex)
    _, ex = schedule(catalog, ids["restarted"], attempt=1, vertex_id=v1)
    deploy(catalog, ids["restarted"], ex)
    schedule(catalog, ids["restarted"], vertex_id=v2, waiting="waiting for the second vertex's slot")
    ids["finished"] = submit(client, jar, {"jobName": "finished", "config": {"execution.runtime-mode": "batch"}})
    _, ex = schedule(catalog, ids["finished"])
    deploy(catalog, ids["finished"], ex)
    finish(catalog, ids["finished"], ex)
    # Written straight to the catalog: a runtime mode of null, and a reason on the job row itself.
    ids["odd"] = new_job_id()
    with catalog.session() as s:
        repository.create_job(
            s,
            id=ids["odd"],
            name="odd",
            artifact_id=None,
            entry="build",
            parallelism=3,
            program_args=[],
            config={"execution.runtime-mode": None, "x": {"nested": [1, 2]}},
            restart_strategy={"type": "none"},
            kind="noop",
        )
        repository.set_job_waiting_reason(s, ids["odd"], "held by the test")
    return ids


def test_cached_answer_is_the_answer_built_per_request_before_the_cache(settings, catalog, transport):
    with (
        app_with(settings, catalog, transport, cache_ms=60_000, clock_ms=lambda: NOW_MS) as cached,
        app_with(settings, catalog, transport, cache_ms=0, clock_ms=lambda: NOW_MS) as uncached,
    ):
        ids = populate(cached, catalog)
        expected = reference_overview(catalog, NOW_MS)
        assert [j["name"] for j in expected["jobs"]] == [
            "odd",
            "finished",
            "restarted",
            "running",
            "waiting",
            "fresh ✓ jöb",
        ]
        by_name = {j["name"]: j for j in expected["jobs"]}  # the catalog holds what the test meant
        assert by_name["restarted"]["tasks"]["running"] == 1 and by_name["restarted"]["tasks"]["scheduled"] == 1
        assert by_name["restarted"]["waiting-reason"] == "waiting for the second vertex's slot"
        assert by_name["finished"]["jobType"] == "BATCH" and by_name["finished"]["end-time"] > 0
        assert by_name["running"]["duration"] == NOW_MS - by_name["running"]["start-time"]

        first = cached.get("/jobs/overview")
        again = cached.get("/jobs/overview")  # served from the cache
        for r in (first, again, cached.get("/v1/jobs/overview"), uncached.get("/jobs/overview")):
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
            assert r.json() == expected
        assert again.content == first.content and "age" in again.headers
        assert set(ids.values()) == {j["jid"] for j in first.json()["jobs"]}


def test_a_submitted_job_is_in_the_very_next_overview(settings, catalog, transport):
    with app_with(settings, catalog, transport, cache_ms=60_000) as client:
        jar = upload(client)["id"]
        assert client.get("/jobs/overview").json() == {"jobs": []}  # cached for a minute ...
        job = submit(client, jar, {"jobName": "mine"})
        # ... but this dispatcher's own submission makes the next request rebuild it.
        assert [(j["jid"], j["state"]) for j in client.get("/jobs/overview").json()["jobs"]] == [(job, "INITIALIZING")]


def test_a_submission_that_could_not_be_published_shows_failed_at_once(settings, catalog):
    class Down(InMemoryTransport):
        def publish(self, stream, body, *, epoch=None):
            raise ConnectionError("redis is down")

    with app_with(settings, catalog, Down(sender="dispatcher"), cache_ms=60_000) as client:
        jar = upload(client)["id"]
        assert client.get("/jobs/overview").json() == {"jobs": []}
        assert client.post(f"/jars/{jar}/run", json={}).status_code == 503
        assert [j["state"] for j in client.get("/jobs/overview").json()["jobs"]] == ["FAILED"]


def test_a_change_written_by_the_jobmanager_shows_once_the_ttl_has_passed(settings, catalog, transport):
    ttl_s = 1.0
    with app_with(settings, catalog, transport, cache_ms=int(ttl_s * 1000)) as client:
        job = submit(client, upload(client)["id"])
        asked = time.monotonic()
        assert [j["state"] for j in client.get("/jobs/overview").json()["jobs"]] == ["INITIALIZING"]
        built = time.monotonic()  # the answer was built between `asked` and now
        with catalog.session() as s:  # as the JobManager would: not through this dispatcher
            repository.transition_job(s, job, J.CREATED, epoch=1)
        state = client.get("/jobs/overview").json()["jobs"][0]["state"]
        if time.monotonic() < asked + ttl_s:  # (a machine that stalled for the whole TTL proves nothing here)
            assert state == "INITIALIZING"  # the cached answer, within its time-to-live
        time.sleep(max(0.0, built + ttl_s + 0.01 - time.monotonic()))
        r = client.get("/jobs/overview")
        assert [j["state"] for j in r.json()["jobs"]] == ["CREATED"]
        assert int(r.headers["age"]) == 0
