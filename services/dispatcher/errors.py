"""One JSON error shape for every failure the REST API reports.

Flink answers errors with ``{"errors": ["..."]}``; we keep that list (so Flink clients print it)
and add the first problem in structured form, so a script or the web UI can point at the field::

    {"errors": ["parallelism: must be an integer >= 1, got 0"],
     "field": "parallelism", "expected": "integer >= 1",
     "hint": "...",                       # only when there is something useful to add
     "details": [{"field", "expected", "got", "message"}, ...]}   # when there is more than one problem

`install(app)` makes FastAPI's own validation errors, HTTP errors (404 for unknown routes, 405)
and the errors of shared/errors.py (`STATUS_BY_ERROR`: catalog `NotFound` is a 404) answer in
this shape too, and requests that find the catalog unreachable
(PostgreSQL down, a connection cut, the pool exhausted) answer 503 with `Retry-After`: the
request did not happen and may simply be sent again, which a 500 would not say.

Under /v1/, the prefix Flink's own clients use, errors answer Flink's exact ``{"errors": [...]}``
(the hint appended to each message): Flink's REST client reads any other shape as a malformed
answer and retries until it gives up with a TimeoutException, hiding the message.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.dispatcher.schemas import RESTART_TYPES, ErrorBody
from shared.errors import ConfigError, CoordinationError, HeadraceError, NotFoundError, RequestError

log = logging.getLogger(__name__)

_MISSING = object()

# Extra advice for fields people commonly get wrong, keyed by field name.
FIELD_HINTS = {
    "jarfile": "send the file as the multipart/form-data field 'jarfile', "
    "e.g. curl -X POST -F jarfile=@job.py http://HOST:8081/jars/upload"
}

# How to describe the expectation behind pydantic's built-in error types.
_EXPECTED_BY_TYPE = {
    "missing": "a value (the field is required)",
    "string_type": "string",
    "int_type": "integer",
    "int_parsing": "integer",
    "int_from_float": "integer",
    "float_type": "number",
    "float_parsing": "number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "dict_type": "JSON object",
    "model_type": "JSON object",
    "model_attributes_type": "JSON object",
    "list_type": "JSON array",
    "json_invalid": "a valid JSON document",
    "json_type": "a JSON document",
    "extra_forbidden": "no such field",
}


@dataclass
class Problem:
    """One thing wrong with a request."""

    message: str
    field: str | None = None
    expected: str | None = None
    got: Any = _MISSING
    hint: str | None = None
    extra: dict[str, Any] = dc_field(default_factory=dict)  # more top-level keys, e.g. "line"
    prefix: bool = True  # "field: message" (validation) or the message alone (e.g. "job x not found")

    def text(self) -> str:
        return f"{self.field}: {self.message}" if self.field and self.prefix else self.message

    def as_detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field, "expected": self.expected, "message": self.text()}
        if self.got is not _MISSING:
            out["got"] = self.got
        if self.hint:
            out["hint"] = self.hint
        out.update(self.extra)
        return out


@dataclass
class ApiError(RequestError):
    """Raised by routes; rendered by `install`'s handler in the shared shape."""

    status: int
    problems: list[Problem] = dc_field(default_factory=list)

    @classmethod
    def of(
        cls,
        status: int,
        message: str,
        *,
        field: str | None = None,
        expected: str | None = None,
        got: Any = _MISSING,
        hint: str | None = None,
        prefix: bool = True,
        **extra: Any,
    ) -> "ApiError":
        return cls(
            status, [Problem(message, field=field, expected=expected, got=got, hint=hint, extra=extra, prefix=prefix)]
        )

    def __str__(self) -> str:
        return "; ".join(p.text() for p in self.problems)


def error_body(problems: list[Problem]) -> dict[str, Any]:
    body: dict[str, Any] = {"errors": [p.text() for p in problems]}
    if problems:
        first = problems[0]
        if first.field is not None:
            body["field"] = first.field
        if first.expected is not None:
            body["expected"] = first.expected
        if first.hint:
            body["hint"] = first.hint
        body.update(first.extra)
        if len(problems) > 1:
            body["details"] = [p.as_detail() for p in problems]
    return body


FLINK_CLIENT_PREFIX = "/v1/"


def flink_error_body(problems: list[Problem]) -> dict[str, Any]:
    """Flink's ErrorResponseBody exactly: its REST client (the `flink` CLI) takes a response for
    an error only when "errors" is its one key, and otherwise retries until it times out. The
    hint goes into the message, so the CLI prints it too."""
    return {"errors": [p.text() + (f" (hint: {p.hint})" if p.hint else "") for p in problems]}


def error_response(
    status: int, problems: list[Problem], headers: dict[str, str] | None = None, request: Request | None = None
) -> JSONResponse:
    """The shared shape; under /v1/, where Flink's own clients call, Flink's exact one."""
    flink = request is not None and request.url.path.startswith(FLINK_CLIENT_PREFIX)
    body = flink_error_body(problems) if flink else error_body(problems)
    return JSONResponse(body, status_code=status, headers=headers)


def error_responses(*statuses: int, described: dict[int, str] | None = None) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route that answers these statuses in the shared shape (for /docs),
    with a description where the status alone does not say what happened."""
    out: dict[int | str, dict[str, Any]] = {status: {"model": ErrorBody} for status in statuses}
    for status, description in (described or {}).items():
        out[status] = {"model": ErrorBody, "description": description}
    return out


# --- pydantic / FastAPI validation errors -> Problems ---------------------------------------

_LOC_SOURCES = {"body", "query", "path", "header", "cookie"}


def _field_name(loc: tuple) -> str | None:
    parts = list(loc)
    if parts and parts[0] in _LOC_SOURCES:
        parts = parts[1:]
    # A discriminated union puts the tag in the location ("restartStrategy.fixed-delay.attempts");
    # the user wrote "restartStrategy.attempts", so drop the tag.
    cleaned = [str(p) for i, p in enumerate(parts) if not (i > 0 and p in RESTART_TYPES)]
    return ".".join(cleaned) or None


def short_value(value: Any) -> Any:
    """A value as echoed back in an error: a hostile request may send megabytes, or NaN, which
    the JSON answer cannot hold, or raw bytes (a body that is not text)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and len(value) > 80:
        return value[:77] + "..."
    if isinstance(value, (dict, list)) and len(repr(value)) > 200:
        return f"<{type(value).__name__} of {len(value)} items>"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (dict, list)):
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            return repr(value)
    return value


def describe(err: dict[str, Any]) -> Problem:
    """Turn one pydantic error dict into a Problem with a field, an expectation and a message.

    Custom validators in `schemas` raise `PydanticCustomError`s whose context carries
    `expected` (and optionally `field` and `hint`); built-in errors are described by type."""
    etype = err.get("type", "")
    ctx = err.get("ctx") or {}
    loc = tuple(err.get("loc", ()))
    field = ctx.get("field") or _field_name(loc)
    got = short_value(err["input"]) if "input" in err and etype != "missing" else _MISSING
    if ctx.get("subfield"):  # a model-level check that names one of the model's keys
        sub = str(ctx["subfield"])
        field = f"{field}.{sub}" if field else sub
        raw = err.get("input")
        got = short_value(raw[sub]) if isinstance(raw, dict) and sub in raw else _MISSING
    expected = ctx.get("expected")
    hint = ctx.get("hint") or (FIELD_HINTS.get(field.split(".")[-1]) if field else None)

    if etype == "json_invalid":
        return Problem(
            f"request body is not valid JSON ({ctx.get('error', 'parse error')})",
            field=None,
            expected="a JSON object",
            hint='send Content-Type: application/json with a body such as {"parallelism": 2}',
        )
    if etype == "missing":
        return Problem("field required", field=field, expected=_EXPECTED_BY_TYPE["missing"], hint=hint)
    if etype == "extra_forbidden":
        return Problem(
            "unknown field",
            field=field,
            expected="no such field",
            got=got,
            hint=hint or "remove it or check its spelling; the accepted fields are listed at /docs",
        )
    if etype in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[etype]
        bound = next(iter(v for k, v in ctx.items() if k in ("ge", "gt", "le", "lt")), "?")
        expected = expected or f"number {op} {bound}"
        return Problem(f"must be a {expected}, got {got!r}", field=field, expected=expected, got=got, hint=hint)
    if etype == "literal_error":
        expected = expected or f"one of {ctx.get('expected')}"
        return Problem(f"must be {expected}, got {got!r}", field=field, expected=expected, got=got, hint=hint)
    if etype in ("union_tag_invalid", "union_tag_not_found"):
        tags = ctx.get("expected_tags", "")
        tag_field = f"{field}.{ctx.get('discriminator', 'type').strip(chr(39))}" if field else "type"
        expected = f"one of {tags}"
        if etype == "union_tag_not_found":
            return Problem(f"field required: must be {expected}", field=tag_field, expected=expected, hint=hint)
        return Problem(
            f"must be {expected}, got {ctx.get('tag')!r}",
            field=tag_field,
            expected=expected,
            got=ctx.get("tag"),
            hint=hint,
        )
    if expected is None:
        expected = _EXPECTED_BY_TYPE.get(etype)
    if expected is not None and etype in _EXPECTED_BY_TYPE:
        article = "an" if expected[:1] in "aeiou" else "a"
        message = f"must be {article} {expected}, got {got!r}" if got is not _MISSING else f"must be {expected}"
        return Problem(message, field=field, expected=expected, got=got, hint=hint)
    # Custom errors carry their own message; pydantic prefixes ValueErrors with "Value error, ".
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return Problem(msg, field=field, expected=expected, got=got, hint=hint)


def problems_from_validation(errors: list[dict[str, Any]]) -> list[Problem]:
    out: list[Problem] = []
    seen: set[str] = set()
    for err in errors:
        p = describe(err)
        if p.text() not in seen:  # unions report the same problem once per member
            seen.add(p.text())
            out.append(p)
    return out


# --- handlers --------------------------------------------------------------------------------


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette types every handler for Exception; install() registers each for its own kind.
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.problems, request=request)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # 400, as Flink answers a malformed request; the body names every offending field.
    return error_response(400, problems_from_validation(list(exc.errors())), request=request)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404 and exc.detail in (None, "Not Found"):
        message = f"Not found: {request.url.path} (no such resource; the API is described at /docs)"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, [Problem(message)], headers=getattr(exc, "headers", None), request=request)


# The status of every error of shared/errors.py that reaches the REST layer without a route
# turning it into an ApiError of its own: the first row the error is an instance of answers.
# A route that knows the field or a hint raises ApiError instead (400 with field and expected).
STATUS_BY_ERROR: tuple[tuple[type[HeadraceError], int], ...] = (
    (NotFoundError, 404),  # shared.catalog.repository.NotFound: "job ... not found"
    (ConfigError, 400),  # a value the request carried that Headrace cannot use
    (CoordinationError, 503),  # no leader or ZooKeeper away: the request may be sent again
    (HeadraceError, 500),
)


def status_of(exc: HeadraceError) -> int:
    return next(status for kind, status in STATUS_BY_ERROR if isinstance(exc, kind))


async def _headrace_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HeadraceError)
    status = status_of(exc)
    if status >= 500:
        return await _unexpected(request, exc)
    return error_response(status, [Problem(str(exc))], request=request)


# How long a client should wait before trying again while the catalog is away: PostgreSQL
# restarts in seconds, and the dashboard polls every second anyway.
CATALOG_RETRY_AFTER_S = 5
# Errors that mean "the catalog cannot be reached now", not "this request is wrong": a refused or
# broken connection, a server shutting down, a full pool, SQLite's lock timeout.
CATALOG_UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError, sa_exc.DisconnectionError)


def _catalog_where(request: Request) -> str:
    catalog = getattr(request.app.state, "catalog", None)
    url = getattr(catalog, "url", "") or ""
    return url.split("@")[-1]  # never the credentials


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0][:300] if text else type(orig).__name__


async def _catalog_unavailable(request: Request, exc: Exception) -> JSONResponse:
    reason = _first_line(exc)
    log.warning("catalog unavailable on %s %s: %s", request.method, request.url.path, reason)
    problem = Problem(
        f"the catalog ({_catalog_where(request)}) is unavailable: {reason}; the request was not carried out, "
        f"try again in {CATALOG_RETRY_AFTER_S} s",
        expected="a reachable catalog",
        hint="running jobs keep running meanwhile; see docs/runbooks/catalog-outage.md",
        prefix=False,
    )
    return error_response(503, [problem], headers={"Retry-After": str(CATALOG_RETRY_AFTER_S)}, request=request)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, [Problem(f"Internal server error: {type(exc).__name__}: {exc}")], request=request)


def _document_400_not_422(app: FastAPI) -> None:
    """FastAPI documents request validation failures as 422 with its own body; ours answer 400
    in the shared shape, so say that in the OpenAPI schema (/docs)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        for operations in schema.get("paths", {}).values():
            for op in operations.values():
                responses = op.get("responses", {})
                if responses.pop("422", None) is not None:
                    responses.setdefault(
                        "400",
                        {
                            "description": "Bad Request: the body names the field, what is expected and how to fix it",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                        },
                    )
        components = schema.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def install(app: FastAPI) -> None:
    _document_400_not_422(app)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(HeadraceError, _headrace_error)
    for kind in CATALOG_UNAVAILABLE:
        app.add_exception_handler(kind, _catalog_unavailable)
    app.add_exception_handler(Exception, _unexpected)
