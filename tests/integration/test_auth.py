"""Authentication, roles and the browser-side guards of the dispatcher, against a real catalog
(SQLite and PostgreSQL) with tokens made by `shared.catalog.tokens` and by `headrace token`.

The role matrix is generated from the app's OpenAPI document, under / and under /v1/: an
endpoint added later is checked without touching this file, and it is expected to need `admin`
to change anything unless it is listed in OPERATOR below (fail closed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import pytest
import uvicorn
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from services.cli import app as cli
from services.dispatcher.app import create_app
from shared.catalog import Catalog, tokens
from shared.ports import free_port
from shared.settings import Settings
from shared.transport import InMemoryTransport
from tests.servers import missing
from tests.waiting import wait_for

ROLES = ("viewer", "operator", "admin")
READS = {"get", "head"}
OPEN = {"/", "/healthz", "/metrics", "/openapi.json", "/docs"}
# The changes an operator may make (method, OpenAPI path); every other change needs admin.
OPERATOR = {
    ("post", "/jars/{jarid}/run"),
    ("patch", "/jobs/{jobid}"),
    ("post", "/jobs/{jobid}/stop"),
    ("post", "/jobs/{jobid}/savepoints"),
    ("post", "/jobs/{jobid}/checkpoints"),
    ("patch", "/jobs/{jobid}/rescaling"),
    ("post", "/jobs/schedules"),
    ("patch", "/jobs/schedules/{scheduleid}"),
    ("delete", "/jobs/schedules/{scheduleid}"),
    ("put", "/deployments/{name}"),
    ("post", "/deployments/{name}/rollback"),
    ("delete", "/deployments/{name}"),
}
ADMIN_EXPECTED = {("post", "/jars/upload"), ("delete", "/jars/{jarid}"), ("post", "/savepoint-disposal")}
PLACEHOLDER = "0123456789abcdef0123456789abcdef"
GOOD_PY = b"def build(ctx):\n    return ctx.spark.range(1)\n"


@pytest.fixture(params=["sqlite", "postgres"])
def catalog_url(request) -> str:
    return request.getfixturevalue("migrated_sqlite_url" if request.param == "sqlite" else "migrated_pg_url")


@pytest.fixture
def catalog(catalog_url):
    c = Catalog(catalog_url)
    c.migrate()
    yield c
    c.dispose()


def make_client(tmp_path, catalog, **settings) -> TestClient:
    s = Settings(home=tmp_path / "home", catalog_url=catalog.url, **settings)
    return TestClient(create_app(s, catalog, InMemoryTransport(sender="dispatcher")))


@pytest.fixture
def secured(tmp_path, catalog):
    with make_client(tmp_path, catalog, auth="required", allowed_hosts="testserver,headrace.example") as c:
        yield c


@pytest.fixture
def role_tokens(catalog) -> dict[str, str]:
    out = {}
    with catalog.session() as s:
        for role in ROLES:
            out[role] = tokens.create(s, role, f"test-{role}")[1]
    return out


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


# Logs may hold secrets (connection strings in a traceback): reading them is an operator's.
OPERATOR_READS = {
    "/taskmanagers/{tmid}/logs",
    "/taskmanagers/{tmid}/logs/{name}",
    "/taskmanagers/{tmid}/log",
    "/jobmanager/logs",
    "/jobmanager/logs/{name}",
    "/jobmanager/log",
}


def expected_role(method: str, path: str) -> str | None:
    if method in READS:
        if method != "options" and path in OPERATOR_READS:
            return "operator"
        return None if path in OPEN else "viewer"
    return "operator" if (method, path) in OPERATOR else "admin"


def test_every_endpoint_needs_its_role(secured, role_tokens):
    spec = secured.get("/openapi.json").json()
    methods = READS | {"post", "put", "patch", "delete"}
    endpoints = [(m, p) for p, ops in spec["paths"].items() for m in ops if m in methods]
    # The document must list what the matrix is about, or the matrix proves nothing.
    assert ADMIN_EXPECTED | {("post", "/jars/{jarid}/run"), ("patch", "/jobs/{jobid}")} <= set(endpoints)
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {
        **spec["components"]["securitySchemes"]["bearerAuth"],
        "type": "http",
        "scheme": "bearer",
    }
    failures = []
    for method, template in endpoints:
        need = expected_role(method, template)
        declared = spec["paths"][template][method]
        if declared.get("security") != ([] if need is None else [{"bearerAuth": []}]) or (
            need is not None and f"role `{need}`" not in declared.get("description", "")
        ):
            failures.append(
                f"{method.upper()} {template}: the document declares {declared.get('security')} (needs {need})"
            )
        path = re.sub(r"\{[^}]+\}", PLACEHOLDER, template)
        for prefix in ("", "/v1"):
            for who in (None, *ROLES):
                kwargs = {"json": {}} if method not in READS else {}
                r = secured.request(method.upper(), prefix + path, headers=bearer(role_tokens.get(who)), **kwargs)
                if need is None or (who is not None and ROLES.index(who) >= ROLES.index(need)):
                    ok = r.status_code not in (401, 403)
                else:
                    ok = r.status_code == (401 if who is None else 403) and r.json().get("errors")
                if not ok:
                    failures.append(
                        f"{method.upper()} {prefix}{template} as {who or 'anonymous'} (needs {need}): "
                        f"{r.status_code} {r.text[:120]}"
                    )
    assert not failures, "\n".join(failures)


def test_open_paths_and_what_the_errors_say(secured, role_tokens):
    for path in ("/", "/healthz", "/metrics", "/openapi.json", "/web/app.js"):
        assert secured.get(path).status_code == 200, path
    r = secured.get("/jobs")
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    assert "Authorization: Bearer" in r.json()["errors"][0] and "headrace token create" in r.json()["hint"]
    r = secured.get("/v1/jobs")
    assert r.status_code == 401 and list(r.json()) == ["errors"]  # Flink's exact shape under /v1
    r = secured.get("/jobs", headers=bearer("hr_not-a-real-token"))
    assert r.status_code == 401 and "unknown or revoked" in r.json()["errors"][0]
    r = secured.delete(f"/jars/{PLACEHOLDER}", headers=bearer(role_tokens["operator"]))
    assert r.status_code == 403 and "needs role admin" in r.json()["errors"][0]


def test_a_revoked_token_is_refused_at_once(secured, catalog, role_tokens):
    assert secured.get("/jobs", headers=bearer(role_tokens["viewer"])).status_code == 200
    with catalog.session() as s:
        viewer = next(t for t in tokens.list_all(s) if t.role == "viewer")
        tokens.revoke(s, viewer.id)
    assert secured.get("/jobs", headers=bearer(role_tokens["viewer"])).status_code == 401


def test_cross_site_upload_and_run_are_refused(secured, role_tokens):
    admin = bearer(role_tokens["admin"])
    files = {"jarfile": ("job.py", GOOD_PY, "application/octet-stream")}
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {"Origin": "null"}):
        r = secured.post("/jars/upload", files=files, headers={**admin, **headers})
        assert r.status_code == 403 and "cross-site request refused" in r.json()["errors"][0], r.text
    assert secured.get("/jars", headers=admin).json()["files"] == []
    # The dashboard's own page posts with its own origin.
    r = secured.post(
        "/jars/upload", files=files, headers={**admin, "Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    )
    assert r.status_code == 200, r.text
    jar = r.json()["id"]
    r = secured.post(f"/jars/{jar}/run", headers={**admin, "Origin": "http://evil.example"})
    assert r.status_code == 403


def test_without_auth_cross_site_changes_are_still_refused(tmp_path, catalog):
    # Loopback, auth off by default: a page on any site could otherwise upload and run.
    with make_client(tmp_path, catalog) as c:
        assert c.app.state.auth_required is False
        r = c.post("/jars/upload", files={"jarfile": ("job.py", GOOD_PY)}, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        r = c.post(f"/jars/{PLACEHOLDER}/run", headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        assert c.get("/jars").json()["files"] == []
        assert c.post("/jars/upload", files={"jarfile": ("job.py", GOOD_PY)}).status_code == 200


def test_host_header_is_checked(secured, role_tokens):
    viewer = bearer(role_tokens["viewer"])
    r = secured.get("/jobs", headers={**viewer, "Host": "rebound.attacker.example"})
    assert r.status_code == 400 and "HEADRACE_ALLOWED_HOSTS" in r.json()["hint"]
    assert secured.get("/jobs", headers={**viewer, "Host": "headrace.example:8081"}).status_code == 200
    assert secured.get("/jobs", headers={**viewer, "Host": "10.1.2.3:8081"}).status_code == 200
    # Prometheus and health probes call it by their network's name for it.
    assert secured.get("/healthz", headers={"Host": "dispatcher:8081"}).status_code == 200


def test_options_security_headers_and_allow(secured):
    r = secured.options(f"/jobs/{PLACEHOLDER}")
    assert r.status_code == 204 and {"GET", "PATCH", "OPTIONS"} <= set(r.headers["Allow"].split(", "))
    assert secured.options(f"/v1/jobs/{PLACEHOLDER}/rescaling").headers["Allow"] == "PATCH, OPTIONS"
    assert secured.options("/no/such/path").status_code in (401, 404)
    page = secured.get("/")
    assert page.headers["X-Frame-Options"] == "DENY" and page.headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]


def test_method_not_allowed_names_every_method(tmp_path, catalog):
    with make_client(tmp_path, catalog) as c:
        r = c.put(f"/jobs/{PLACEHOLDER}")
        assert r.status_code == 405 and r.headers["Allow"] == "GET, PATCH, OPTIONS"
        assert c.options(f"/jobs/{PLACEHOLDER}").status_code == 204


def test_token_cli_create_list_revoke(tmp_path, sqlite_url):
    # One catalog is enough here (the storage is exercised on both above); one real process shows
    # the installed entry point reads HEADRACE_CONFIG, the rest run in-process to stay fast.
    catalog = Catalog(sqlite_url)
    config = tmp_path / "headrace.yaml"
    config.write_text(yaml.safe_dump({"catalog_url": sqlite_url, "home": str(tmp_path / "home")}))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}, "HEADRACE_CONFIG": str(config)}
    created = subprocess.run(
        [sys.executable, "-m", "services.cli", "token", "create", "--role", "operator", "--name", "ci-deploy"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert created.returncode == 0, created.stderr
    token = created.stdout.split()[-1]
    token_id = created.stdout.split()[2]

    runner = CliRunner()
    cleared = {k: None for k in os.environ if k.startswith("HEADRACE_")}

    def headrace(*args: str):
        return runner.invoke(cli.app, ["token", *args], env={**cleared, "HEADRACE_CONFIG": str(config)})

    listed = headrace("list")
    assert listed.exit_code == 0 and "ci-deploy" in listed.stdout and "operator" in listed.stdout
    assert token not in listed.stdout and "active" in listed.stdout

    with make_client(tmp_path, catalog, auth="required", allowed_hosts="testserver") as c:
        assert c.get("/jobs", headers=bearer(token)).status_code == 200
        assert c.post("/jars/upload", files={"jarfile": ("job.py", GOOD_PY)}, headers=bearer(token)).status_code == 403
        revoked = headrace("revoke", token_id)
        assert revoked.exit_code == 0 and "revoked" in revoked.stdout, revoked.output
        assert c.get("/jobs", headers=bearer(token)).status_code == 401
    catalog.dispose()
    assert "revoked" in headrace("list").stdout

    bad = headrace("create", "--role", "root")
    assert bad.exit_code == 2 and "viewer, operator, admin" in bad.output
    unknown = headrace("revoke", "nope")
    assert unknown.exit_code == 2 and "headrace token list" in unknown.output


def test_flink_cli_sends_a_token_from_its_environment(tmp_path, sqlite_url):
    """The real `flink` 2.3 CLI has no token option, but its REST client adds the headers of
    FLINK_REST_CLIENT_HEADERS to every request: that is the documented way (docs/runbooks/auth.md)."""
    from tests.flink_cli import CLI_JVM_OPTS, CLI_TIMEOUT_S, FLINK_HOME, LAUNCHER

    if not os.access(LAUNCHER, os.X_OK):
        missing(f"the Flink CLI ({LAUNCHER}; install it with scripts/install-flink-cli)")
    catalog = Catalog(sqlite_url)
    catalog.migrate()
    with catalog.session() as s:
        token = tokens.create(s, "operator", "flink-cli")[1]
    port = free_port()
    settings = Settings(home=tmp_path / "home", catalog_url=sqlite_url, auth="required")
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, catalog, InMemoryTransport(sender="dispatcher")),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for("the dispatcher started", lambda: server.started, 30, poll_s=0.05)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLINK_")}
        env.update(
            FLINK_CONF_DIR=str(FLINK_HOME / "dist" / "pyflink" / "conf"),
            FLINK_LOG_DIR=str(tmp_path),
            FLINK_ENV_JAVA_OPTS_CLI=CLI_JVM_OPTS,
            FLINK_REST_CLIENT_HEADERS=f"Authorization:Bearer {token}",
        )
        if env.get("JAVA_HOME") and not os.path.exists(os.path.join(env["JAVA_HOME"], "bin", "java")):
            del env["JAVA_HOME"]
        run = subprocess.run(
            [str(LAUNCHER), "list", "-m", f"127.0.0.1:{port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )
        assert run.returncode == 0 and "No running jobs" in run.stdout, run.stdout + run.stderr
    finally:
        server.should_exit = True
        thread.join(10)
        catalog.dispose()


def test_whoami_tells_a_token_its_role(secured, role_tokens):
    assert secured.get("/auth/whoami").status_code == 401
    for role in ROLES:
        r = secured.get("/auth/whoami", headers=bearer(role_tokens[role]))
        assert r.status_code == 200 and r.json() == {"auth": "required", "role": role, "name": f"test-{role}"}
