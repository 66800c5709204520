"""Schemathesis over the dispatcher's own OpenAPI document, against a real PostgreSQL catalog and
real HTTP: whatever a generated request holds (valid or not), the answer is never a 5xx.

Bounded: HEADRACE_FUZZ_EXAMPLES examples per operation (default 15; CI runs the default). A failure
prints the request that caused it; `pytest tests/integration/test_openapi_fuzz.py -k 'POST /jars'`
replays one operation."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from services.dispatcher.app import create_app
from shared.catalog import Catalog
from shared.settings import Settings
from shared.transport import InMemoryTransport
from tests.clusters import ServedApp

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("HEADRACE_FUZZ_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def dispatcher(tmp_path_factory, pg_url_module):
    home = tmp_path_factory.mktemp("fuzz")
    cfg = Settings(home=home, catalog_url=pg_url_module, auth="off")
    catalog = Catalog(cfg.catalog)
    catalog.migrate()
    served = ServedApp(create_app(cfg, catalog, InMemoryTransport(sender="dispatcher")))
    # Something to find: a pipeline and a job, so generated ids sometimes meet real rows' neighbours
    # and the listings have content to serialise.
    import httpx

    up = httpx.post(f"{served.url}/jars/upload", files={"jarfile": ("fuzz.py", b"def build(ctx):\n    return None\n")})
    assert up.status_code == 200, up.text
    jar_id = up.json()["filename"].rsplit("/", 1)[-1]
    run = httpx.post(f"{served.url}/jars/{jar_id}/run", json={"jobName": "fuzz"})
    assert run.status_code == 200, run.text
    yield served
    served.stop()
    catalog.dispose()


@pytest.fixture(scope="module")
def api_schema(dispatcher):
    return schemathesis.openapi.from_url(f"{dispatcher.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_request_makes_the_dispatcher_fail(case, dispatcher):
    case.call_and_validate(base_url=dispatcher.url, checks=[not_a_server_error], timeout=10)
