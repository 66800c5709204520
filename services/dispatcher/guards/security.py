"""Browser-side protections of the dispatcher (docs/runbooks/auth.md).

- Cross-site changes are refused (403), with or without auth: a page on another site can make a
  browser send a form post (a multipart upload, an empty `POST /jars/{id}/run`) to a dispatcher
  on the user's machine or network without any preflight. Browsers mark such requests with
  `Sec-Fetch-Site` and `Origin`; clients that are not browsers send neither and are not affected.
- The Host header is checked against the allowed names (400 otherwise) when auth is on or
  `allowed_hosts` is set: a DNS-rebinding page reaches the dispatcher under its own name.
  IP literals are always accepted (rebinding needs a name), and so are /healthz and /metrics.
- Every answer carries nosniff, X-Frame-Options DENY and a Content-Security-Policy that allows
  only the dashboard's own files (the Swagger pages at /docs and /redoc load theirs from a CDN,
  so they get only frame-ancestors).
- OPTIONS answers 204 with the methods the path really has (Starlette answers 405, and its
  Allow header on a 405 names only the first route that matched the path, so PATCH /jobs/{id}
  was missing); 405 answers get the same full Allow header. No CORS headers are sent: the API is
  not meant to be called from other origins' pages.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from typing import Any, Iterable
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.dispatcher.errors import Problem, error_response
from services.dispatcher.guards.limits import discard_body
from services.dispatcher.guards.slow_clients import SlowBody

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
CSP_DOCS = "frame-ancestors 'none'"
DOCS_PATHS = ("/docs", "/redoc")
COMMON_HEADERS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}
METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
WILDCARD = "*"
# Probes and scrapers call these by whatever name their network gives the dispatcher (a compose
# service name, a pod IP); a rebinding page gains nothing there, as both are open and read-only.
HOST_CHECK_EXEMPT = frozenset({"/healthz", "/metrics"})


def configured_hosts(raw: str | None) -> set[str]:
    return {h.strip().lower().strip("[]") for h in (raw or "").split(",") if h.strip()}


def default_hosts(dispatcher_host: str) -> set[str]:
    names = {"localhost", dispatcher_host.lower()}
    for lookup in (socket.gethostname, socket.getfqdn):
        try:
            names.add(lookup().lower())
        except OSError:  # pragma: no cover - a machine without a resolvable name
            pass
    return names - {"0.0.0.0", "::", ""}


def host_name(host_header: str) -> str:
    """The name part of a Host header value ("[::1]:8081" -> "::1", "a.example:80" -> "a.example")."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host_header: str | None, allowed: set[str]) -> bool:
    if WILDCARD in allowed:
        return True
    if not host_header:
        return False
    name = host_name(host_header)
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return name in allowed or name.endswith(".localhost") and "localhost" in allowed


def cross_site_reason(method: str, headers: Any, allowed_origin_hosts: set[str]) -> str | None:
    """Why a browser request is a cross-site change (None when it is not one).

    `headers` maps lower-case header names to values (a Starlette Headers)."""
    if method.upper() in SAFE_METHODS:
        return None
    fetch_site = (headers.get("sec-fetch-site") or "").lower()
    if fetch_site in ("cross-site", "same-site"):
        return f"the browser marked it Sec-Fetch-Site: {fetch_site}"
    origin = headers.get("origin")
    if origin is None:
        return None
    if origin == "null":
        return "it comes from an opaque origin (Origin: null)"
    parts = urlsplit(origin)
    host = (headers.get("host") or "").lower()
    default_port = {"http": "80", "https": "443"}.get(parts.scheme, "")
    origin_netloc = (parts.netloc or "").lower()
    same = origin_netloc in (host, f"{host}:{default_port}") or f"{origin_netloc}:{default_port}" == host
    if same or (parts.hostname or "").lower() in allowed_origin_hosts:
        return None
    return f"it comes from the page at {origin}, not from this dispatcher's own pages"


def allowed_methods(routes: Iterable[Any], scope: Scope) -> list[str]:
    """Every method some route serves at the request's path (empty when no route has the path).

    Asks each route whether it would take the request under each method, rather than reading
    the routes' paths: FastAPI nests included routers in its own private structures."""
    methods: set[str] = set()
    for method in METHOD_ORDER[:-1]:
        probe = {**scope, "method": method}
        # A Mount (the dashboard's static files) takes every method; StaticFiles serves two.
        if any(
            route.matches(probe)[0] == Match.FULL and (method in ("GET", "HEAD") or not isinstance(route, Mount))
            for route in routes
        ):
            methods.add(method)
    if not methods:
        return []
    methods.add("OPTIONS")
    return [m for m in METHOD_ORDER if m in methods]


class BrowserGuard:
    """ASGI middleware; the outermost layer, so a refused request is never read or routed."""

    def __init__(self, app: ASGIApp, *, check_hosts: bool, hosts: set[str], origin_hosts: set[str]) -> None:
        self.app = app
        self.check_hosts = check_hosts
        self.hosts = hosts
        self.origin_hosts = origin_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        method = scope["method"].upper()
        path = scope["path"]
        if (
            self.check_hosts
            and path not in HOST_CHECK_EXEMPT
            and not host_allowed(request.headers.get("host"), self.hosts)
        ):
            problem = Problem(
                f"the Host header {request.headers.get('host')!r} is not one of this dispatcher's names",
                expected="an allowed host name",
                prefix=False,
                hint="call it by one of its names, or add the name to allowed_hosts (HEADRACE_ALLOWED_HOSTS, "
                "comma-separated) and restart it; see docs/runbooks/auth.md",
            )
            return await self._respond(error_response(400, [problem], request=request), scope, receive, send)
        reason = cross_site_reason(method, request.headers, self.origin_hosts)
        if reason is not None:
            log.warning("refused a cross-site %s %s: %s", method, path, reason)
            problem = Problem(
                f"cross-site request refused: {reason}",
                expected="a request from the dashboard or a non-browser client",
                prefix=False,
                hint="use the dashboard served by this dispatcher, curl or the headrace CLI; see docs/runbooks/auth.md",
            )
            return await self._respond(error_response(403, [problem], request=request), scope, receive, send)
        routes = scope["app"].router.routes
        if method == "OPTIONS":
            methods = allowed_methods(routes, scope)
            if methods:
                allow = ", ".join(methods)
                return await self._respond(Response(status_code=204, headers={"Allow": allow}), scope, receive, send)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                self._add_headers(headers, path)
                if message["status"] == 405:
                    methods = allowed_methods(routes, scope)
                    if methods:
                        headers["Allow"] = ", ".join(methods)
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _respond(self, response: Response, scope: Scope, receive: Receive, send: Send) -> None:
        self._add_headers(response.headers, scope["path"])
        await refuse(response, scope, receive, send)

    @staticmethod
    def _add_headers(headers: MutableHeaders, path: str) -> None:
        for name, value in COMMON_HEADERS.items():
            headers.setdefault(name, value)
        docs = any(path == p or path.startswith(p + "/") for p in DOCS_PATHS)
        headers.setdefault("Content-Security-Policy", CSP_DOCS if docs else CSP)


# A refused request is answered before any of its body is read. Then up to this much of the
# body, for up to REFUSED_DRAIN_S, is read and dropped before the connection closes, so that a
# client that sends all of a small body before reading the answer (httpx, requests) sees the
# refusal, not a reset; nobody unauthenticated gets to make the dispatcher read more.
REFUSED_DRAIN_BYTES = 1024**2
REFUSED_DRAIN_S = 2.0


async def refuse(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    """Send a refusal for a request whose body will not be used."""
    if scope["method"].upper() in SAFE_METHODS:
        return await response(scope, receive, send)
    response.headers["Connection"] = "close"

    async def hold_last(message: Message) -> None:
        # The answer goes out whole, but its end is held back until the drain below is over:
        # once a response is complete, the server hands the app no more of the body.
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            message = {**message, "more_body": True}
        await send(message)

    await response(scope, receive, hold_last)
    headers = {k.lower(): v for k, v in scope.get("headers", ())}
    if b"100-continue" not in headers.get(b"expect", b"").lower():  # such a client sends nothing now
        try:
            await asyncio.wait_for(discard_body(receive, limit=REFUSED_DRAIN_BYTES), REFUSED_DRAIN_S)
        except (asyncio.TimeoutError, SlowBody):
            pass
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def install(app: Any, *, auth_on: bool) -> None:
    """Adds the guard as the outermost middleware (call it after every other add_middleware)."""
    settings = app.state.settings
    explicit = configured_hosts(getattr(settings, "allowed_hosts", None))
    hosts = explicit or default_hosts(getattr(settings, "dispatcher_host", "127.0.0.1"))
    check_hosts = auth_on or bool(explicit)
    if check_hosts:
        log.info(
            "accepting Host names %s (and IP addresses)%s",
            ", ".join(sorted(hosts)),
            "" if explicit else "; set allowed_hosts (HEADRACE_ALLOWED_HOSTS) to change them",
        )
    app.add_middleware(BrowserGuard, check_hosts=check_hosts, hosts=hosts, origin_hosts=explicit - {WILDCARD})
