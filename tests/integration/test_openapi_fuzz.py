"""Schemathesis over the dispatcher's own OpenAPI document, against a running cluster with a
PostgreSQL catalog: whatever a generated request holds (valid or not), the answer is never a 5xx.

Bounded: HEADRACE_FUZZ_EXAMPLES examples per operation (default 15; CI runs the default). A failure
prints the request that caused it; `pytest tests/integration/test_openapi_fuzz.py -k 'POST /jars'`
replays one operation."""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tests.clusters import start_cluster
from tests.waiting import wait_for

EXAMPLES = int(os.environ.get("HEADRACE_FUZZ_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def dispatcher(tmp_path_factory, pg_url_module):
    """A real cluster (Redis, a JobManager that leads, a ResourceManager, one TaskManager without
    warm drivers): the endpoints that read the leader's or a TaskManager's logs have someone to ask."""
    cluster = start_cluster(tmp_path_factory.mktemp("fuzz"), catalog_url=pg_url_module, taskmanagers=1, slots=2)
    # Something to find: a pipeline and a (no-op) job, so the listings have content to serialise.
    up = httpx.post(
        f"{cluster.dispatcher_url}/jars/upload", files={"jarfile": ("fuzz.py", b"def build(ctx):\n    return None\n")}
    )
    assert up.status_code == 200, up.text
    jar_id = up.json()["filename"].rsplit("/", 1)[-1]
    run = httpx.post(f"{cluster.dispatcher_url}/jars/{jar_id}/run", json={"jobName": "fuzz", "kind": "noop"})
    assert run.status_code == 200, run.text
    wait_for("a leading JobManager", lambda: httpx.get(f"{cluster.dispatcher_url}/jobmanager/leader").json()["leader"])
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def api_schema(dispatcher):
    return schemathesis.openapi.from_url(f"{dispatcher.dispatcher_url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_request_makes_the_dispatcher_fail(case, dispatcher):
    case.call_and_validate(base_url=dispatcher.dispatcher_url, checks=[not_a_server_error], timeout=10)
