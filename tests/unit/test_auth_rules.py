"""The pure rules behind the dispatcher's authentication and browser guards."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from services.dispatcher.guards import auth, security
from shared.catalog import tokens
from shared.settings import Settings


@pytest.mark.parametrize(
    "method, path, role",
    [
        ("GET", "/jobs/overview", "viewer"),
        ("GET", "/v1/jobs/abc/exceptions", "viewer"),
        ("HEAD", "/config", "viewer"),
        ("GET", "/", None),
        ("GET", "/healthz", None),
        ("GET", "/metrics", None),
        ("GET", "/web/app.js", None),
        ("GET", "/openapi.json", None),
        ("GET", "/v1/healthz", None),
        ("OPTIONS", "/jars/upload", None),
        ("POST", "/jars/abc.py/run", "operator"),
        ("POST", "/v1/jars/abc.py/run", "operator"),
        ("PATCH", "/jobs/abc", "operator"),
        ("POST", "/jobs/abc/stop", "operator"),
        ("POST", "/jobs/abc/savepoints", "operator"),
        ("POST", "/jobs/abc/checkpoints", "operator"),
        ("PATCH", "/jobs/abc/rescaling", "operator"),
        ("POST", "/jobs/schedules", "operator"),
        ("POST", "/jars/upload", "admin"),
        ("DELETE", "/jars/abc.py", "admin"),
        ("POST", "/savepoint-disposal", "admin"),
        ("PUT", "/cluster/settings", "admin"),
        ("POST", "/some/future/endpoint", "admin"),
        ("POST", "/", "admin"),
        ("DELETE", "/jobs/abc", "admin"),
        ("POST", "/jobs/abc/stop/extra", "admin"),
    ],
)
def test_required_role(method, path, role):
    assert auth.required_role(method, path) == role


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("dispatcher", False),
        ("example.com", False),
    ],
)
def test_loopback(host, loopback):
    assert auth.is_loopback(host) is loopback


def test_auth_default_follows_the_listen_address():
    assert auth.auth_required(Settings(dispatcher_host="127.0.0.1")) is False
    assert auth.auth_required(Settings(dispatcher_host="0.0.0.0")) is True
    assert auth.auth_required(Settings(dispatcher_host="0.0.0.0", auth="off")) is False
    assert auth.auth_required(Settings(dispatcher_host="127.0.0.1", auth="required")) is True
    assert "OFF" in auth.describe_mode(Settings()) and "loopback" in auth.describe_mode(Settings())
    assert "not a loopback" in auth.describe_mode(Settings(dispatcher_host="0.0.0.0"))


def test_allowed_hosts_setting_accepts_a_list_or_commas(monkeypatch):
    assert security.configured_hosts(Settings(allowed_hosts=["A.example", "b"]).allowed_hosts) == {"a.example", "b"}
    monkeypatch.setenv("HEADRACE_ALLOWED_HOSTS", "a.example, [::1]")
    assert security.configured_hosts(Settings().allowed_hosts) == {"a.example", "::1"}


@pytest.mark.parametrize(
    "header, value",
    [("Bearer hr_abc", "hr_abc"), ("bearer   hr_abc ", "hr_abc"), ("Basic dXNlcjpwYXNz", None), ("Bearer", None)],
)
def test_bearer_token(header, value):
    assert auth.bearer_token({"headers": [(b"authorization", header.encode())]}) == value


@pytest.mark.parametrize(
    "host, allowed",
    [
        ("headrace.example", True),
        ("headrace.example:8081", True),
        ("HEADRACE.example", True),
        ("10.1.2.3:8081", True),
        ("[::1]:8081", True),
        ("localhost:8081", True),
        ("app.localhost", True),
        ("evil.example", False),
        ("headrace.example.evil.example", False),
        ("", False),
        (None, False),
    ],
)
def test_host_allowed(host, allowed):
    assert security.host_allowed(host, {"headrace.example", "localhost"}) is allowed
    assert security.host_allowed(host, {"*"}) is True


@pytest.mark.parametrize(
    "method, headers, refused",
    [
        ("GET", {"origin": "http://evil.example", "host": "h:8081"}, False),
        ("POST", {"host": "h:8081"}, False),  # curl, the CLI, Flink's clients: no browser headers
        ("POST", {"origin": "http://h:8081", "host": "h:8081", "sec-fetch-site": "same-origin"}, False),
        ("POST", {"origin": "http://h", "host": "h:80"}, False),
        ("POST", {"origin": "https://proxy.example", "host": "dispatcher:8081"}, False),  # a listed proxy name
        ("POST", {"origin": "http://evil.example", "host": "h:8081"}, True),
        ("POST", {"origin": "http://h:9999", "host": "h:8081"}, True),  # another service on the same machine
        ("POST", {"origin": "null", "host": "h:8081"}, True),
        ("PATCH", {"sec-fetch-site": "cross-site", "host": "h:8081"}, True),
        ("DELETE", {"sec-fetch-site": "same-site", "host": "h:8081"}, True),
    ],
)
def test_cross_site_reason(method, headers, refused):
    reason = security.cross_site_reason(method, Headers(headers), {"proxy.example"})
    assert (reason is not None) is refused


def test_tokens_are_hashed_and_roles_ordered():
    assert tokens.hash_token("hr_x") != "hr_x" and len(tokens.hash_token("hr_x")) == 64
    assert tokens.role_at_least("admin", "operator") and tokens.role_at_least("viewer", "viewer")
    assert not tokens.role_at_least("operator", "admin")


def test_the_cli_knows_the_catalogs_roles():
    from services.cli import tokens as token_cli

    assert token_cli.ROLES == tokens.ROLES
