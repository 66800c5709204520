"""Issue 43.12, 14, 15 played by hostile or careless REST clients on a real dispatcher (auth
required, tokens in a real catalog):

- a viewer reads a job's configuration, a deployment's spec and a schedule's arguments with every
  password masked (URLs, Kafka's JAAS line, keys naming secrets, `--password x`); an operator
  reads them as stored (it runs and edits them);
- an operator's spec with 1,000 arguments of 10,000 characters, periodic savepoints every second
  kept by the thousand, or a billion restarts without a pause, gets a 400 naming the limit;
- an upload named `ok.PY` is a Python module everywhere (the driver's loader included).
"""

from __future__ import annotations

import sys

import pytest
from fastapi.testclient import TestClient

from services.dispatcher.app import create_app
from services.dispatcher.guards.redaction import MASK
from services.dispatcher.schemas.jars import MAX_PROGRAM_ARG_CHARS, MAX_PROGRAM_ARGS
from services.taskmanager.runtime.pipeline_loader import load_pipeline
from shared.catalog import Catalog, tokens
from shared.settings import Settings
from shared.transport import InMemoryTransport

GOOD_PY = b"def build(ctx):\n    return ctx.spark.range(1)\n"
DB_URL = "postgresql://app:s3cret-db@db.example:5432/orders"
JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="s3cret-kafka";'
CONFIG = {
    "sink.url": DB_URL,
    "kafka.sasl.jaas.config": JAAS,
    "api_token": "s3cret-token",
    "ssl.keystore.key": "s3cret-pem",
    "key.serializer": "StringSerializer",
    "sink.table": "orders",
}
ARGS = ["--table", "orders", "--password", "s3cret-arg", "--db=" + DB_URL, "token=s3cret-kv"]
SECRETS = ("s3cret-db", "s3cret-kafka", "s3cret-token", "s3cret-pem", "s3cret-arg", "s3cret-kv")


@pytest.fixture
def catalog(migrated_pg_url):
    c = Catalog(migrated_pg_url)
    c.migrate()
    yield c
    c.dispose()


@pytest.fixture
def client(tmp_path, catalog):
    settings = Settings(home=tmp_path / "home", catalog_url=catalog.url, auth="required", allowed_hosts="testserver")
    with TestClient(create_app(settings, catalog, InMemoryTransport(sender="dispatcher"))) as c:
        yield c


@pytest.fixture
def as_role(catalog) -> dict[str, dict[str, str]]:
    out = {}
    with catalog.session() as s:
        for role in ("viewer", "operator", "admin"):
            out[role] = {"Authorization": f"Bearer {tokens.create(s, role, f'test-{role}')[1]}"}
    return out


def upload(client, headers, name: str = "job.py", data: bytes = GOOD_PY) -> str:
    r = client.post("/jars/upload", files={"jarfile": (name, data)}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_a_viewer_reads_configurations_specs_and_arguments_with_secrets_masked(client, as_role):
    jar = upload(client, as_role["admin"])
    r = client.post(
        f"/jars/{jar}/run",
        json={"kind": "noop", "config": CONFIG, "programArgsList": ARGS},
        headers=as_role["operator"],
    )
    assert r.status_code == 200, r.text
    job = r.json()["jobid"]
    spec = {"jarId": jar, "kind": "noop", "flinkConfiguration": CONFIG, "programArgsList": ARGS, "state": "suspended"}
    assert client.put("/deployments/masked", json=spec, headers=as_role["operator"]).status_code == 200
    r = client.post(
        "/jobs/schedules",
        json={"jarId": jar, "kind": "noop", "everySeconds": 3600, "enabled": False, "programArgsList": ARGS},
        headers=as_role["operator"],
    )
    assert r.status_code == 201, r.text
    schedule = r.json()["id"]
    reads = (f"/jobs/{job}/config", "/deployments/masked", f"/jobs/schedules/{schedule}", "/jobs/schedules")

    for path in reads:
        seen = client.get(path, headers=as_role["viewer"])
        assert seen.status_code == 200, seen.text
        assert not [s for s in SECRETS if s in seen.text], (path, seen.text)
    config = client.get(f"/jobs/{job}/config", headers=as_role["viewer"]).json()["execution-config"]
    assert config["user-config"] == {
        "sink.url": f"postgresql://app:{MASK}@db.example:5432/orders",
        "kafka.sasl.jaas.config": MASK,
        "api_token": MASK,
        "ssl.keystore.key": MASK,
        "key.serializer": "StringSerializer",
        "sink.table": "orders",
    }
    assert config["program-args"] == [
        "--table",
        "orders",
        "--password",
        MASK,
        f"--db=postgresql://app:{MASK}@db.example:5432/orders",
        f"token={MASK}",
    ]
    detail = client.get("/deployments/masked", headers=as_role["viewer"]).json()
    assert detail["spec"]["flinkConfiguration"]["kafka.sasl.jaas.config"] == MASK
    assert detail["generations"][0]["spec"]["programArgsList"][3] == MASK

    # Operators run and edit these: they read them as stored (and can put a spec back unchanged).
    for path in reads:
        assert all(s in client.get(path, headers=as_role["operator"]).text for s in SECRETS[-2:]), path
    stored = client.get("/deployments/masked", headers=as_role["operator"]).json()["spec"]
    assert stored["flinkConfiguration"] == CONFIG and stored["programArgsList"] == ARGS
    admin_view = client.get(f"/jobs/{job}/config", headers=as_role["admin"]).json()
    assert admin_view["execution-config"]["user-config"] == CONFIG


def test_what_an_operator_can_make_the_control_plane_hold_is_bounded(client, as_role):
    jar = upload(client, as_role["admin"])
    op = as_role["operator"]
    huge = ["x" * 10_000] * 1_000
    for path, body in (
        (f"/jars/{jar}/run", {"kind": "noop", "programArgsList": huge}),
        ("/deployments/huge", {"jarId": jar, "kind": "noop", "programArgsList": huge}),
        ("/jobs/schedules", {"jarId": jar, "kind": "noop", "everySeconds": 60, "programArgsList": huge}),
    ):
        r = (
            client.put(path, json=body, headers=op)
            if path.startswith("/deployments")
            else client.post(path, json=body, headers=op)
        )
        assert r.status_code == 400 and f"at most {MAX_PROGRAM_ARGS}" in r.text, (path, r.text[:500])
    r = client.post(
        f"/jars/{jar}/run", json={"kind": "noop", "programArgsList": ["y" * (MAX_PROGRAM_ARG_CHARS + 1)]}, headers=op
    )
    assert r.status_code == 400 and f"at most {MAX_PROGRAM_ARG_CHARS}" in r.text, r.text[:500]
    r = client.post(f"/jars/{jar}/run", params={"program-args": "a " * 300}, headers=op)
    assert r.status_code == 400 and "300 program arguments" in r.text, r.text[:500]

    r = client.put(
        "/deployments/hoarder",
        json={"jarId": jar, "kind": "noop", "savepoints": {"interval": 1, "historyMax": 1000}},
        headers=op,
    )
    assert r.status_code == 400 and "at least 10 s" in r.text and "100" in r.text, r.text
    r = client.put(
        "/deployments/hoarder",
        json={"jarId": jar, "kind": "noop", "savepoints": {"interval": "10 s", "historyMax": 100}},
        headers=op,
    )
    assert r.status_code == 200, r.text

    for strategy, field in (
        ({"type": "fixed-delay", "attempts": 10**9, "delay": 0}, "restartStrategy.delay"),
        ({"type": "failure-rate", "max-failures-per-interval": 10**9, "delay": "0 s"}, "restartStrategy.delay"),
        ({"type": "exponential-delay", "initial-backoff": 0}, "restartStrategy.initial-backoff"),
    ):
        r = client.post(f"/jars/{jar}/run", json={"kind": "noop", "restartStrategy": strategy}, headers=op)
        assert r.status_code == 400 and "at least 1 s" in r.text and field in r.text, r.text
        r = client.put(
            "/deployments/crashloop", json={"jarId": jar, "kind": "noop", "restartStrategy": strategy}, headers=op
        )
        assert r.status_code == 400 and "at least 1 s" in r.text, r.text
    # Flink's default for checkpointed jobs (unlimited attempts, 1 s apart) and a few quick retries stay fine.
    for strategy in (
        {"type": "fixed-delay", "attempts": 2**31 - 1, "delay": "1 s"},
        {"type": "fixed-delay", "attempts": 3, "delay": 0},
    ):
        assert (
            client.post(f"/jars/{jar}/run", json={"kind": "noop", "restartStrategy": strategy}, headers=op).status_code
            == 200
        )


def test_an_upload_named_in_capitals_is_a_python_module_everywhere(client, as_role, tmp_path):
    jar = upload(client, as_role["admin"], name="ok.PY")
    listed = {f["id"]: f for f in client.get("/jars", headers=as_role["viewer"]).json()["files"]}[jar]
    assert [e["name"] for e in listed["entry"]] == ["build"]
    r = client.post(f"/jars/{jar}/run", json={"entryClass": "build", "kind": "noop"}, headers=as_role["operator"])
    assert r.status_code == 200, r.text
    r = client.post(f"/jars/{jar}/run", json={"entryClass": "nope", "kind": "pyspark"}, headers=as_role["operator"])
    assert r.status_code == 400 and "nope" in r.text  # the module was read: its entries are known
    # What the driver does with the stored file (no Spark needed for a .py).
    stored = tmp_path / "home" / "artifacts"
    [path] = [p for p in stored.iterdir() if p.name.startswith(jar)]
    module = load_pipeline(str(path), {}, spark=None)
    try:
        assert callable(module.build)
    finally:
        sys.modules.pop(module.__name__, None)


def test_suspended_deployments_cost_the_leader_nothing_until_one_changes(catalog, tmp_path):
    from services.jobmanager.deployment_reconciler import DeploymentReconciler
    from services.jobmanager.job_master import JobMaster
    from shared.catalog.models import DeploymentRow, utcnow
    from shared.catalog.repository import deployments as deployments_repo
    from shared.clock import SystemClock, WallClock

    spec = {
        "jarId": "0" * 32,
        "entryClass": "build",
        "kind": "noop",
        "programArgsList": [],
        "parallelism": 1,
        "flinkConfiguration": {},
        "restartStrategy": {"type": "none"},
        "upgradeMode": "savepoint",
        "state": "suspended",
        "rollback": {"enabled": True, "readyWithin": 60.0},
        "savepoints": {"interval": None, "historyMax": 5},
    }
    with catalog.session() as s:
        now = utcnow()
        s.add_all(
            [
                DeploymentRow(
                    name=f"d{i:03d}",
                    spec=spec,
                    generation=1,
                    deleting=False,
                    delete_with_savepoint=True,
                    rollback_requested=False,
                    lifecycle="SUSPENDED",
                    created_at=now,
                    updated_at=now,
                )
                for i in range(50)
            ]
        )
    settings = Settings(home=tmp_path / "home", catalog_url=catalog.url)
    master = JobMaster(
        settings, catalog, InMemoryTransport(sender="jobmanager", epoch=1), gateway=None, clock=SystemClock(), epoch=1
    )
    with master.unit_of_work():
        master.recover()
    reconciler = DeploymentReconciler(master, settings, WallClock())
    looked_at: list[str] = []
    reconcile = reconciler.reconcile
    reconciler.reconcile = lambda name: looked_at.append(name) or reconcile(name)  # type: ignore[method-assign]
    reconciler.tick()
    assert len(looked_at) == 50  # a new leader looks at every one once
    looked_at.clear()
    for _ in range(5):
        reconciler.tick()
    assert looked_at == []  # then none of them costs a unit of work per pass
    with catalog.session() as s:  # what PUT /deployments/d007 with state running does
        deployments_repo.put_deployment(s, "d007", {**spec, "state": "running"})
    reconciler.tick()
    assert looked_at == ["d007"]  # the changed one is looked at again (and resumed), the others still not
