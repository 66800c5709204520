"""Request size limits, enforced while a body streams in.

An upload above the limit is refused with 413 before it is parsed: the multipart parser would
otherwise spool all of it to a temporary file and the route would read it into memory. The
middleware counts the bytes as they arrive (a Content-Length is not trusted, and chunked bodies
have none) and stops the request at the limit. The refused remainder is read and discarded (up
to DRAIN_MAX_BYTES, never stored) so that a client that sends its whole body before reading the
answer, as httpx and requests do, sees the 413 rather than a broken connection; a client that
asked `Expect: 100-continue` (curl, for bodies over 1 MB) gets the answer before it sends anything.

The limit is the setting `max_upload_bytes` (HEADRACE_MAX_UPLOAD_BYTES: bytes, or a size such as
"500 mb" as Flink spells sizes, shared/sizes.py; 100 MB by default), read through Settings as every
setting is.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.dispatcher.errors import Problem, error_response
from shared import sizes
from shared.settings import Settings

UPLOAD_ENV = "HEADRACE_MAX_UPLOAD_BYTES"
DEFAULT_MAX_UPLOAD_BYTES = 100 * 1024**2
# JSON requests (a run request, a savepoint trigger) are small; 16 MB is far beyond any real one.
MAX_JSON_BODY_BYTES = 16 * 1024**2
# What a multipart body carries besides the file: boundaries, part headers, the file name.
MULTIPART_SLACK_BYTES = 64 * 1024
DRAIN_MAX_BYTES = 1024**3
UPLOAD_PATH = re.compile(r"^(/v1)?/jars/upload/?$")


def upload_limit(settings: Settings) -> int:
    """Raises shared.sizes.InvalidSize (a ValueError) naming the setting."""
    return sizes.parse_bytes(settings.max_upload_bytes, what=UPLOAD_ENV)


def human(size: int) -> str:
    for unit, factor in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if size >= factor:
            value = size / factor
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} bytes"


def upload_too_large(limit: int, *, got: int | None = None) -> Problem:
    seen = f"; it is {human(got)} ({got} bytes)" if got is not None and got > limit else ""
    return Problem(
        f"the upload is larger than the dispatcher's limit of {human(limit)} ({limit} bytes){seen}",
        field="jarfile",
        expected=f"a file of at most {human(limit)}",
        hint=f"an artifact holds code, not data (read data through a source); to raise the limit set "
        f'{UPLOAD_ENV} (e.g. {UPLOAD_ENV}="{human(max(limit * 2, 200 * 1024**2))}") for the dispatcher '
        f"and restart it",
        prefix=False,
    )


def body_too_large(limit: int) -> Problem:
    return Problem(
        f"the request body is larger than {human(limit)}, the dispatcher's limit for JSON requests",
        expected=f"a body of at most {human(limit)}",
        hint="a run request carries options, not data; upload code with POST /jars/upload",
        prefix=False,
    )


class _TooLarge(BaseException):
    """Raised from `receive` once a body passes its limit. A BaseException, so that the body
    parsers' `except Exception` (which would answer 400 "error parsing the body") let it through
    to the middleware."""


class BodyLimit:
    """ASGI middleware: 413 for an upload above `upload_limit` or another body above `json_limit`."""

    def __init__(self, app: ASGIApp, *, upload_limit: int, json_limit: int = MAX_JSON_BODY_BYTES):
        self.app, self.upload_limit, self.json_limit = app, upload_limit, json_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        upload = UPLOAD_PATH.match(scope["path"]) is not None
        limit = self.upload_limit + MULTIPART_SLACK_BYTES if upload else self.json_limit
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        length = _int_or_none(headers.get("content-length"))
        if length is not None and length > limit:
            drain = "100-continue" not in headers.get("expect", "").lower() and length <= DRAIN_MAX_BYTES
            await self._refuse(scope, receive, send, upload=upload, got=length, drain=drain)
            return

        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge()
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except _TooLarge:
            if started:  # cannot happen: routes answer after reading their body
                raise RuntimeError("request body over the limit after the response started") from None
            await self._refuse(scope, receive, send, upload=upload, got=None, drain=True, already=received)

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        upload: bool,
        got: int | None,
        drain: bool,
        already: int = 0,
    ) -> None:
        if drain:
            already = await discard_body(receive, already)
        problem = upload_too_large(self.upload_limit, got=got or already) if upload else body_too_large(self.json_limit)
        response = error_response(413, [problem], headers={"Connection": "close"}, request=Request(scope))
        await response(scope, receive, send)


async def discard_body(receive: Receive, seen: int = 0, limit: int = DRAIN_MAX_BYTES) -> int:
    """Read what is left of a refused body without keeping it, up to `limit` bytes, so the
    client reads the refusal instead of a broken connection. Returns the bytes seen."""
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request":
            break
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return seen


def _int_or_none(raw: str | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None
