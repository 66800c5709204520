"""Bearer tokens and roles for the REST API (Flink has none; docs/runbooks/auth.md).

Every request needs `Authorization: Bearer <token>` of a role at least the one its method and
path require (`required_role`), checked here, before routing, so an endpoint added later is
covered without doing anything: a read needs `viewer`, a change listed in OPERATOR_CHANGES
needs `operator`, and any other change needs `admin` (an unknown change fails closed).

Open without a token: the dashboard's shell and static files (code, no data; the page asks for
a token on the first 401), /healthz (liveness probes), /metrics (Prometheus scrapers usually
carry no token; the numbers hold no job names), and the API description (/docs, /openapi.json).

The setting `auth` (HEADRACE_AUTH) is `off` or `required`; unset, it is `required` unless the
dispatcher listens on a loopback address only.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from services.dispatcher import errors
from services.dispatcher.errors import Problem, error_response
from services.dispatcher.guards import security
from services.dispatcher.guards.auth_mode import auth_required, describe_mode, is_loopback  # noqa: F401
from shared.catalog import tokens

log = logging.getLogger(__name__)

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FLINK_PREFIX = "/v1"

OPEN_PATHS = re.compile(r"^/(|healthz|metrics|docs|docs/oauth2-redirect|redoc|openapi\.json|web/.*|favicon\.ico)$")
# The changes an operator may make: run, cancel, stop, savepoints and checkpoints, rescale, and
# schedules (which run jobs). Uploads, deletions, savepoint disposal and cluster settings are
# an admin's, as is every change not listed here.
OPERATOR_CHANGES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (method, re.compile(pattern))
    for method, pattern in (
        ("POST", r"^/jars/[^/]+/run/?$"),
        ("PATCH", r"^/jobs/[^/]+/?$"),  # cancel (Flink's PATCH /jobs/:jobid?mode=cancel)
        ("POST", r"^/jobs/[^/]+/stop/?$"),
        ("POST", r"^/jobs/[^/]+/savepoints/?$"),
        ("POST", r"^/jobs/[^/]+/checkpoints/?$"),
        ("PATCH", r"^/jobs/[^/]+/rescaling/?$"),
        ("POST", r"^/jobs/schedules/?$"),
        ("PATCH", r"^/jobs/schedules/[^/]+/?$"),
        ("DELETE", r"^/jobs/schedules/[^/]+/?$"),
        ("PUT", r"^/deployments/[^/]+/?$"),
        ("POST", r"^/deployments/[^/]+/rollback/?$"),
        ("DELETE", r"^/deployments/[^/]+/?$"),
    )
)

# Reads an operator must make: log files may hold what a viewer must not see (connection URLs
# with passwords, a pipeline's printed records, tracebacks with arguments). docs/runbooks/logs.md
OPERATOR_READS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern) for pattern in (r"^/jobmanager/logs?(/.*)?$", r"^/taskmanagers/[^/]+/logs?(/.*)?$")
)


def required_role(method: str, path: str) -> str | None:
    """The least role allowed to make this request; None when it needs no token."""
    method = method.upper()
    if path == FLINK_PREFIX or path.startswith(FLINK_PREFIX + "/"):
        path = path[len(FLINK_PREFIX) :] or "/"
    if method in READ_METHODS:
        if method != "OPTIONS" and any(p.match(path) for p in OPERATOR_READS):
            return "operator"
        return None if method == "OPTIONS" or OPEN_PATHS.match(path) else "viewer"
    if any(m == method and p.match(path) for m, p in OPERATOR_CHANGES):
        return "operator"
    return "admin"


def bearer_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def _unauthorized(role: str) -> Problem:
    return Problem(
        f"authentication required: this request needs a token with role {role} or higher, sent as "
        f"'Authorization: Bearer <token>'",
        expected="a bearer token",
        prefix=False,
        hint="an admin creates one with `headrace token create --role " + role + "` on a machine with "
        "HEADRACE_CONFIG of the cluster; see docs/runbooks/auth.md",
    )


def _invalid() -> Problem:
    return Problem(
        "the bearer token is unknown or revoked",
        expected="a live token",
        prefix=False,
        hint="`headrace token list` shows the live tokens; create a new one with `headrace token create`",
    )


def _forbidden(have: str, role: str, method: str) -> Problem:
    return Problem(
        f"forbidden: {method} here needs role {role} or higher; this token has role {have}",
        expected=f"a token with role {role}",
        prefix=False,
        hint=f"ask an admin for a token with `headrace token create --role {role}`",
    )


class RequireToken:
    """ASGI middleware: answers 401/403 before the request reaches a route (or reads its body)."""

    def __init__(self, app: ASGIApp, *, enabled: bool) -> None:
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.enabled or scope["type"] != "http":
            return await self.app(scope, receive, send)
        role = required_role(scope["method"], scope["path"])
        if role is None:
            return await self.app(scope, receive, send)
        request = Request(scope)
        token = bearer_token(scope)
        if token is None:
            status, problem, headers = 401, _unauthorized(role), {"WWW-Authenticate": "Bearer"}
        else:
            try:
                found = await run_in_threadpool(_verify, scope["app"].state.catalog, token)
            except errors.CATALOG_UNAVAILABLE as exc:
                # The exception handlers sit inside this middleware; answer their 503 here.
                return await security.refuse(await errors._catalog_unavailable(request, exc), scope, receive, send)
            if found is not None and tokens.role_at_least(found.role, role):
                scope.setdefault("state", {})["token"] = found
                return await self.app(scope, receive, send)
            if found is None:
                status, problem, headers = 401, _invalid(), {"WWW-Authenticate": 'Bearer error="invalid_token"'}
            else:
                status, problem, headers = 403, _forbidden(found.role, role, scope["method"]), None
        response = error_response(status, [problem], headers=headers, request=request)
        await security.refuse(response, scope, receive, send)


def _verify(catalog: Any, token: str) -> tokens.TokenInfo | None:
    with catalog.session() as s:
        return tokens.verify(s, token)
