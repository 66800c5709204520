"""Slow clients: a request that does not arrive in time is answered 408 and its connection closed.

Thirty connections trickling their bodies a byte at a time stayed open past 40 s: uvicorn waits
for a body as long as bytes keep coming, and for headers (a connection that sends nothing, or
half a request line) forever. Each such connection holds a socket, a parser and, for an upload,
a spooled file. So:

- headers: a request's headers must be complete `request_header_timeout_s` after its first byte
  (or after the connection opened). Enforced in the HTTP protocol (`protocol_class`), since no
  ASGI code runs before the headers are in;
- bodies: no more than `request_body_idle_timeout_s` may pass between two pieces of a body, and
  the whole body must be in within `request_body_timeout_s` of the first read (`BodyTimeout`,
  an ASGI middleware around `receive`). Time the dispatcher itself spends before reading (a token
  check against the catalog) is not counted against the client.

docs/runbooks/dispatcher-limits.md says how to tell these answers apart and what to change.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.dispatcher.errors import Problem, error_response

log = logging.getLogger(__name__)

HEADER_SETTING = "request_header_timeout_s (HEADRACE_REQUEST_HEADER_TIMEOUT_S)"
IDLE_SETTING = "request_body_idle_timeout_s (HEADRACE_REQUEST_BODY_IDLE_TIMEOUT_S)"
TOTAL_SETTING = "request_body_timeout_s (HEADRACE_REQUEST_BODY_TIMEOUT_S)"


class SlowBody(BaseException):
    """Raised from `receive` when a body is late. A BaseException, so the body parsers' `except
    Exception` (which would answer 400 "error parsing the body") let it through to BodyTimeout."""

    def __init__(self, problem: Problem):
        super().__init__(problem.message)
        self.problem = problem


def _late(what: str, seconds: float, setting: str) -> Problem:
    return Problem(
        f"request timeout: {what} within {seconds:g} s; the connection is closed",
        prefix=False,
        expected=f"a request that arrives within {setting}",
        hint=f"send the request at a steady pace (a slow link needs a larger {setting} on the "
        f"dispatcher); see docs/runbooks/dispatcher-limits.md",
    )


class BodyTimeout:
    """ASGI middleware: 408 and close for a body that stalls or takes too long as a whole."""

    def __init__(self, app: ASGIApp, *, idle_s: float, total_s: float) -> None:
        self.app, self.idle_s, self.total_s = app, idle_s, total_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        first: float | None = None
        complete = False
        started = False

        async def timed_receive() -> Message:
            nonlocal first, complete
            if complete:  # the body is in; what is left to wait for is a disconnect, never late
                return await receive()
            now = loop.time()
            first = now if first is None else first
            left = first + self.total_s - now
            wait = min(self.idle_s, left)
            if wait <= 0:
                raise SlowBody(_late("the body did not arrive", self.total_s, TOTAL_SETTING))
            try:
                message = await asyncio.wait_for(receive(), wait)
            except asyncio.TimeoutError:
                if wait < self.idle_s:
                    raise SlowBody(_late("the body did not arrive", self.total_s, TOTAL_SETTING)) from None
                raise SlowBody(_late("no part of the body arrived", self.idle_s, IDLE_SETTING)) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, tracked_send)
        except SlowBody as exc:
            client = scope.get("client") or ("?", 0)
            log.warning("408 for %s %s from %s: %s", scope["method"], scope["path"], client[0], exc.problem.message)
            if started:
                return  # the answer is under way (a refusal draining the body): let it end as it is
            response = error_response(408, [exc.problem], headers={"Connection": "close"}, request=Request(scope))
            await response(scope, receive, send)


def install(app: Any, settings: Any) -> None:
    """Adds BodyTimeout as the outermost middleware (after security.install), so that every
    layer's reads, a refusal's drain included, are timed."""
    app.add_middleware(
        BodyTimeout, idle_s=float(settings.request_body_idle_timeout_s), total_s=float(settings.request_body_timeout_s)
    )


def _raw_408(seconds: float) -> bytes:
    body = json.dumps(
        {
            "errors": [
                f"request timeout: the request's headers did not arrive within {seconds:g} s; the connection is closed"
            ],
            "hint": f"raise {HEADER_SETTING} for slow links",
        }
    )
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body.encode()
    )


def protocol_class(header_timeout_s: float) -> Any:
    """uvicorn's httptools protocol with a deadline on each request's headers; None (uvicorn's
    default, no header deadline) where httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        log.warning("httptools is not installed: requests whose headers never complete are not timed out")
        return None

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        headrace_timer: asyncio.TimerHandle | None = None

        # uvicorn's signature, which narrows asyncio's BaseTransport to Transport: mypy checks the
        # override against asyncio's protocol too.
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.headrace_arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self.headrace_timer is None:  # from the connection's start, not from each trickled byte
                self.headrace_arm()

        def on_headers_complete(self) -> None:
            self.headrace_disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self.headrace_disarm()
            super().connection_lost(exc)

        def headrace_arm(self) -> None:
            self.headrace_timer = asyncio.get_running_loop().call_later(header_timeout_s, self.headrace_expired)

        def headrace_disarm(self) -> None:
            if self.headrace_timer is not None:
                self.headrace_timer.cancel()
                self.headrace_timer = None

        def headrace_expired(self) -> None:
            self.headrace_timer = None
            if self.transport.is_closing():
                return
            peer = self.transport.get_extra_info("peername") or ("?",)
            log.warning(
                "408 for a connection from %s: its request headers were not complete within %g s",
                peer[0],
                header_timeout_s,
            )
            self.transport.write(_raw_408(header_timeout_s))
            self.transport.close()

    return HeaderDeadlineProtocol


def server_options(settings: Any) -> dict[str, Any]:
    """uvicorn.run keyword arguments for the dispatcher's slow-client bounds."""
    options: dict[str, Any] = {"timeout_keep_alive": 5}
    protocol = protocol_class(float(settings.request_header_timeout_s))
    if protocol is not None:
        options["http"] = protocol
    return options
