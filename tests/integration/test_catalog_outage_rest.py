"""The REST API while PostgreSQL is unreachable: 503 with Retry-After and the JSON errors body,
never a 500, and writes that leave nothing half-done; everything answers again once it is back.

The dispatcher talks to a real PostgreSQL through a TCP proxy the test owns: stopping the proxy
is the server going away (open connections cut, new ones refused), starting it again is the
server coming back. (Stopping the shared server itself would take the other tests' catalogs
with it.)
"""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from services.dispatcher.app import create_app
from shared.catalog import Catalog
from shared.messages import CancelJob, RequestSavepoint, SubmitJob
from shared.settings import Settings
from shared.streams import JM_STREAM
from shared.transport import InMemoryTransport
from tests.netproxy import TcpProxy
from tests.waiting import wait_for

PIPELINE = b"def build(ctx):\n    return None\n"


@pytest.fixture
def proxied_pg(pg_url):
    """(URL of a fresh PostgreSQL database through the proxy, the proxy)."""
    url = make_url(pg_url)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    proxy.start()
    yield url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False), proxy
    proxy.stop()


@pytest.fixture
def dispatcher(proxied_pg, tmp_path):
    url, proxy = proxied_pg
    settings = Settings(home=tmp_path / "home", catalog_url=url)
    catalog = Catalog(settings.catalog)
    catalog.migrate()
    transport = InMemoryTransport(sender="dispatcher")
    with TestClient(create_app(settings, catalog, transport)) as client:
        yield client, proxy, transport, settings
    catalog.dispose()


def _seed(client) -> tuple[str, str]:
    r = client.post("/jars/upload", files={"jarfile": ("job.py", PIPELINE)})
    assert r.status_code == 200, r.text
    jar = r.json()["id"]
    r = client.post(f"/jars/{jar}/run", json={"kind": "noop", "config": {"noop.duration": -1}})
    assert r.status_code == 200, r.text
    return jar, r.json()["jobid"]


def _assert_unavailable(r, path: str) -> None:
    assert r.status_code == 503, f"{path}: {r.status_code} {r.text}"
    assert int(r.headers["Retry-After"]) > 0, path
    body = r.json()
    assert body["errors"] and "catalog" in body["errors"][0] and "try again" in body["errors"][0], body
    if path.startswith("/v1/"):
        assert set(body) == {"errors"}, body  # Flink's exact shape, which its CLI reads


def _wait_back(client, path: str, timeout_s: float = 10.0) -> None:
    wait_for(
        f"{path} to answer 200 again after the catalog came back",
        lambda: client.get(path).status_code,
        timeout_s,
        until=lambda status: status == 200,
    )


def test_reads_answer_503_with_retry_after_while_the_catalog_is_down(dispatcher):
    client, proxy, _transport, settings = dispatcher
    jar, job = _seed(client)
    reads = [
        "/jobs/overview",
        "/jobs",
        f"/jobs/{job}",
        f"/jobs/{job}/config",
        f"/jobs/{job}/exceptions",
        f"/jobs/{job}/checkpoints",
        f"/jobs/{job}/checkpoints/config",
        "/overview",
        "/jars",
        "/taskmanagers",
        "/v1/jobs/overview",
        f"/v1/jobs/{job}",
    ]
    for path in reads:
        assert client.get(path).status_code == 200, path

    proxy.stop()
    # /jobs/overview answers from its cache until its time-to-live ends (views/overview_cache.py), then
    # asks the catalog again.
    time.sleep(settings.overview_cache_ms / 1000)
    for path in reads:
        _assert_unavailable(client.get(path), path)
    assert client.get("/healthz").status_code == 200  # liveness needs no catalog

    proxy.start()
    _wait_back(client, "/jobs/overview")
    for path in reads:
        assert client.get(path).status_code == 200, path
    assert client.get(f"/jobs/{job}").json()["state"] == "INITIALIZING"


def test_writes_answer_503_and_leave_nothing_half_done(dispatcher):
    client, proxy, transport, settings = dispatcher
    jar, job = _seed(client)
    published = list(transport.bodies(JM_STREAM))
    assert published == [SubmitJob(job_id=job)]
    stored = sorted(p.name for p in settings.artifacts.iterdir())

    proxy.stop()
    writes = [
        ("POST", "/jars/upload", {"files": {"jarfile": ("other.py", PIPELINE)}}),
        ("POST", f"/jars/{jar}/run", {"json": {"kind": "noop"}}),
        ("POST", f"/v1/jars/{jar}/run", {"json": {"kind": "noop"}}),
        ("PATCH", f"/jobs/{job}", {"params": {"mode": "cancel"}}),
        ("POST", f"/jobs/{job}/savepoints", {"json": {"target-directory": str(settings.savepoints / "sp")}}),
        ("DELETE", f"/jars/{jar}", {}),
    ]
    for method, path, kw in writes:
        _assert_unavailable(client.request(method, path, **kw), path)
    # Nothing reached the JobManager, and no file was kept without its catalog row.
    assert transport.bodies(JM_STREAM) == published
    assert not any(isinstance(b, (CancelJob, RequestSavepoint)) for b in transport.bodies(JM_STREAM))
    assert sorted(p.name for p in settings.artifacts.iterdir()) == stored

    proxy.start()
    _wait_back(client, "/jobs")
    assert client.get("/jobs").json() == {"jobs": [{"id": job, "status": "INITIALIZING"}]}
    assert [f["id"] for f in client.get("/jars").json()["files"]] == [jar]
    # The same requests work once the catalog is back.
    r = client.post(f"/jars/{jar}/run", json={"kind": "noop"})
    assert r.status_code == 200, r.text
    assert client.patch(f"/jobs/{job}", params={"mode": "cancel"}).status_code == 202
