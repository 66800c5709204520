"""Fetches a process's log listing or one log file from the endpoint it serves them on (its
metrics port, shared/metrics.py), for /taskmanagers/{id}/logs and /jobmanager/logs.

Each request is signed for the process asked, and only an answer signed by that process is
forwarded (shared/log_access.py): an address that points elsewhere gets the request, and the
caller gets a 502 without a byte of what answered there. Redirects are not followed.

Every failure becomes an ApiError that says which process and address did not answer and what to
check, within FETCH_TIMEOUT_S: a TaskManager that died or hangs never hangs a request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import redis
from fastapi.responses import Response

from services.dispatcher.errors import ApiError
from shared import log_access, log_files, streams
from shared.message_auth import ClusterAuth, taskmanager_sender

FETCH_TIMEOUT_S = 2.0
RUNBOOK = "docs/runbooks/logs.md"


def check_name(name: str) -> str:
    if not log_files.valid_name(name):
        raise ApiError.of(
            400,
            f"not a log file name: {name[:80]!r}",
            field="name",
            expected="a file name from the logs listing (letters, digits, '.', '_', '-')",
            got=name[:80],
            hint="GET the logs listing for the names",
            prefix=False,
        )
    return name


def check_tail(raw: str | None) -> int:
    try:
        return log_files.parse_tail(raw)
    except ValueError as exc:
        raise ApiError.of(
            400, str(exc), field="tail", expected=f"bytes, 1 to {log_files.MAX_TAIL_BYTES}", got=raw, prefix=False
        ) from None


@dataclass(frozen=True)
class LogSource:
    """A process serving its logs: who it is, where, and the keys its requests are signed with and
    its answers checked with."""

    who: str
    address: str
    request_key: bytes
    answer_key: bytes

    @classmethod
    def taskmanager(cls, auth: ClusterAuth, taskmanager_id: str, address: str) -> "LogSource":
        return cls(
            f"TaskManager {taskmanager_id}",
            address,
            auth.command_key(taskmanager_id),
            auth.sender_key(taskmanager_sender(taskmanager_id)),
        )

    @classmethod
    def service(cls, auth: ClusterAuth, service: str, who: str, address: str) -> "LogSource":
        key = auth.sender_key(service)
        return cls(who, address, key, key)


def _get(source: LogSource, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
    who, address = source.who, source.address
    problem = log_access.endpoint_problem(address)
    if problem is not None:
        raise ApiError.of(
            502,
            f"{who} names a log endpoint the dispatcher does not fetch from: {problem}",
            hint=f"see {RUNBOOK}",
            prefix=False,
        )
    target = path + (f"?{urlencode(params)}" if params else "")
    header = log_access.sign_request(source.request_key, "GET", target)
    try:
        with httpx.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=False) as client:
            r = client.get(address.rstrip("/") + target, headers={log_access.HEADER: header})
    except httpx.TimeoutException:
        raise ApiError.of(
            504,
            f"{who} did not answer within {FETCH_TIMEOUT_S:g} s at {address}",
            hint=f"it may be frozen or overloaded; see {RUNBOOK}",
            prefix=False,
        ) from None
    except httpx.HTTPError as exc:
        raise ApiError.of(
            502,
            f"{who} is unreachable at {address}: {type(exc).__name__}: {exc}",
            hint=f"it may have died or its metrics port may be blocked; see {RUNBOOK}",
            prefix=False,
        ) from None
    if not log_access.answer_checks(
        source.answer_key, header, r.status_code, r.content, r.headers.get(log_access.ANSWER_HEADER)
    ):
        raise ApiError.of(
            502,
            f"what answers at {address} did not prove to be {who}'s log server (HTTP "
            f"{r.status_code}, no valid answer signature); its answer is not forwarded",
            hint=f"an older version, another server at that address, or a TaskManager whose keys "
            f"are not its id's; see {RUNBOOK}",
            prefix=False,
        )
    return r


def _refused(who: str, r: httpx.Response, name: str | None) -> ApiError:
    try:
        message = "; ".join(r.json().get("errors") or []) or r.text[:200]
    except ValueError:
        message = r.text[:200]
    if r.status_code == 404 and name is not None:
        return ApiError.of(
            404,
            f"{who} has no log file {name!r} ({message})",
            field="name",
            hint="GET the logs listing for the names",
            prefix=False,
        )
    if r.status_code == 400:
        return ApiError.of(400, f"{who} refused the request: {message}", prefix=False)
    return ApiError.of(
        502,
        f"{who} answered {r.status_code}: {message}",
        hint=f"an older process without log serving answers the metrics page instead; see {RUNBOOK}",
        prefix=False,
    )


def listing(source: LogSource) -> dict:
    """{"logs": [{"name", "size", "mtime"}]} as the process serves it."""
    who, address = source.who, source.address
    r = _get(source, "/logs")
    if r.status_code != 200:
        raise _refused(who, r, None)
    try:
        body = r.json()
        return {
            "logs": [{"name": str(f["name"]), "size": int(f["size"]), "mtime": int(f["mtime"])} for f in body["logs"]]
        }
    except (ValueError, KeyError, TypeError):
        raise ApiError.of(
            502,
            f"{who} at {address} did not answer a log listing",
            hint=f"is that address a Headrace metrics endpoint? see {RUNBOOK}",
            prefix=False,
        ) from None


def main_log_name(source: LogSource) -> str | None:
    r = _get(source, "/logs")
    if r.status_code != 200:
        raise _refused(source.who, r, None)
    try:
        return r.json().get("main")
    except ValueError:
        return None


def file(source: LogSource, name: str, tail: int) -> Response:
    """The file's last `tail` bytes as text/plain."""
    r = _get(source, f"/logs/{name}", {"tail": tail})
    if r.status_code != 200:
        raise _refused(source.who, r, name)
    return Response(content=r.content, media_type="text/plain; charset=utf-8", headers={"Cache-Control": "no-store"})


def announcement(client, key: str, where: str) -> dict | None:
    """The JSON record a service keeps under `key` in Redis (its address, for one), or None when
    there is none or it does not parse; 503 saying `where` when Redis does not answer."""
    try:
        raw = client.get(key)
    except redis.RedisError as exc:
        raise ApiError.of(503, f"Redis, {where}, is unavailable: {exc}", hint=f"see {RUNBOOK}", prefix=False) from None
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def registered_endpoint(client, taskmanager_id: str) -> dict | None:
    """{"address", "log"} of a TaskManager as its registration named them (streams.RM_TM_ENDPOINTS_KEY),
    or None; 503 when Redis does not answer."""
    try:
        raw = client.hget(streams.RM_TM_ENDPOINTS_KEY, taskmanager_id)
    except redis.RedisError as exc:
        raise ApiError.of(
            503,
            f"Redis, where the ResourceManager keeps the TaskManagers' log endpoints, is unavailable: {exc}",
            hint=f"see {RUNBOOK}",
            prefix=False,
        ) from None
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
