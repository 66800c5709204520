"""The dispatcher's app on a throwaway catalog (SQLite and PostgreSQL) with an in-memory bus, and
the catalog rows a JobManager would write, for the REST tests. Test modules import the fixtures
they use (and those fixtures' own: catalog_url, settings)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from services.dispatcher.app import create_app
from shared.catalog import Catalog, repository
from shared.ids import new_execution_id, new_vertex_id
from shared.settings import Settings
from shared.states import ExecutionState as E
from shared.states import JobStatus as J
from shared.transport import InMemoryTransport

GOOD_PY = b"""\
from pyspark.sql import functions as F

RATE = 10

def build(ctx):
    return ctx.spark.range(RATE)

def other(ctx):
    return None
"""


@pytest.fixture(params=["sqlite", "postgres"])
def catalog_url(request) -> str:
    return request.getfixturevalue("migrated_sqlite_url" if request.param == "sqlite" else "migrated_pg_url")


@pytest.fixture
def settings(tmp_path, catalog_url) -> Settings:
    return Settings(
        home=tmp_path / "home",
        catalog_url=catalog_url,
        restart_strategy={"type": "fixed-delay", "attempts": 3, "delay": 1.0},
    )


@pytest.fixture
def catalog(settings):
    c = Catalog(settings.catalog)
    c.migrate()
    yield c
    c.dispose()


@pytest.fixture
def transport() -> InMemoryTransport:
    return InMemoryTransport(sender="dispatcher")


@pytest.fixture
def client(settings, catalog, transport):
    with TestClient(create_app(settings, catalog, transport)) as c:
        yield c


def upload(client, name="job.py", data=GOOD_PY) -> dict:
    r = client.post("/jars/upload", files={"jarfile": (name, data, "application/octet-stream")})
    assert r.status_code == 200, r.text
    return r.json()


def submit(client, jar_id: str, body: dict | None = None, **params) -> str:
    r = client.post(f"/jars/{jar_id}/run", json=body, params=params)
    assert r.status_code == 200, r.text
    return r.json()["jobid"]


def register_tm(catalog, tm_id="tm-a", *, host="host-a", slots=4, free=4, allocations=()):
    with catalog.session() as s:
        repository.register_taskmanager(
            s,
            id=tm_id,
            host=host,
            queue=f"tm.{tm_id}",
            slots_total=slots,
            slots_free=free,
            cores=4.0,
            memory_bytes=8 * 2**30,
            allocations=list(allocations),
        )


def schedule(catalog, job_id, *, attempt=0, vertex_id=None, waiting=None) -> tuple[str, str]:
    """INITIALIZING -> CREATED, one vertex, one attempt in SCHEDULED (waiting for slots)."""
    with catalog.session() as s:
        job = repository.get_job(s, job_id)
        if J(job.status) == J.INITIALIZING:
            repository.transition_job(s, job_id, J.CREATED, epoch=1)
        if vertex_id is None:
            vertex_id = new_vertex_id()
            repository.create_vertex(
                s, id=vertex_id, job_id=job_id, name="Source: rate -> Sink: redis", parallelism=job.parallelism
            )
        ex_id = new_execution_id()
        repository.create_execution(s, id=ex_id, job_id=job_id, vertex_id=vertex_id, attempt=attempt)
        repository.transition_execution(s, ex_id, E.SCHEDULED)
        if waiting:
            repository.set_execution_waiting_reason(s, ex_id, waiting)
    return vertex_id, ex_id


def deploy(catalog, job_id, ex_id, *, tm_id="tm-a", slots=(0,)) -> None:
    with catalog.session() as s:
        repository.transition_execution(
            s, ex_id, E.DEPLOYING, taskmanager_id=tm_id, allocation_id="a" * 32, slots=list(slots)
        )
        repository.transition_execution(s, ex_id, E.RUNNING)
        job = repository.get_job(s, job_id)
        if J(job.status) != J.RUNNING:
            repository.transition_job(s, job_id, J.RUNNING, epoch=1)


def fail_attempt(catalog, job_id, ex_id, *, cause="boom", tm_id="tm-a") -> None:
    with catalog.session() as s:
        repository.transition_execution(s, ex_id, E.FAILED, failure_cause=cause)
        repository.record_exception(
            s,
            job_id=job_id,
            exception_name="RuntimeError",
            stacktrace=cause,
            execution_id=ex_id,
            vertex_name="Source: rate -> Sink: redis",
            attempt=0,
            taskmanager_id=tm_id,
        )
        repository.transition_job(s, job_id, J.RESTARTING, epoch=1)


def finish(catalog, job_id, ex_id) -> None:
    with catalog.session() as s:
        repository.transition_execution(s, ex_id, E.FINISHED)
        repository.transition_job(s, job_id, J.FINISHED, epoch=1)
