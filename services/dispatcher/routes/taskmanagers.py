"""/taskmanagers: the registered TaskManagers and their slots, as the ResourceManager recorded them,
with the memory figure of the task on each (the TaskManager's own, from Redis), and their log
files, fetched from the TaskManager itself (docs/runbooks/logs.md)."""

from __future__ import annotations

import json
import logging
from typing import Literal

import redis
from fastapi import APIRouter, Query
from fastapi.responses import Response

from services.dispatcher.deps import SessionDep, TransportDep
from services.dispatcher.errors import ApiError, error_responses
from services.dispatcher.schemas import ErrorBody, LogListInfo, TaskManagerDetailsInfo, TaskManagersInfo
from services.dispatcher.views import log_fetch, shapes
from shared import streams
from shared.catalog import repository
from shared.catalog.repository import NotFound
from shared.ids import TaskManagerId

log = logging.getLogger("headrace.dispatcher")
router = APIRouter(prefix="/taskmanagers", tags=["taskmanagers"])


@router.get("", response_model=TaskManagersInfo, summary="Registered TaskManagers (with ?include=lost, lost ones too)")
def list_taskmanagers(
    session: SessionDep,
    include: Literal["lost"] | None = Query(
        None,
        description="lost: also the TaskManagers the ResourceManager declared lost (state LOST, with "
        "last-lost-at and lost-reason), until they register again",
    ),
) -> dict:
    rows = repository.list_taskmanagers(session, include_gone=include == "lost")
    return shapes.taskmanagers([r for r in rows if r.state in ("REGISTERED", "LOST")])


@router.get(
    "/{tmid}",
    response_model=TaskManagerDetailsInfo,
    responses={404: {"model": ErrorBody}},
    summary="One TaskManager (also a lost or unregistered one) with its allocated slots",
)
def taskmanager_details(tmid: str, session: SessionDep, transport: TransportDep) -> dict:
    row = _row(session, tmid)
    return shapes.taskmanager_details(row, memory=_memory(transport, row.id))


def _memory(transport, tmid: str) -> dict | None:
    """The tasks' memory figures the TaskManager keeps in Redis (services/taskmanager/memory/task_memory.py);
    None when Redis does not answer: the slots are the catalog's and still shown."""
    client = transport.redis_client
    if client is None:
        return None
    try:
        raw = client.get(streams.tm_memory_key(tmid))
        figures = json.loads(raw) if raw else None
    except (redis.RedisError, ValueError) as exc:
        log.debug("no memory figures of %s: %s", tmid, exc)
        return None
    return figures if isinstance(figures, dict) else None


def _row(session, tmid: str):
    if not tmid or len(tmid) > 128 or any(ord(c) < 32 for c in tmid):
        row = None
    else:
        try:
            row = repository.get_taskmanager(session, TaskManagerId(tmid))
        except NotFound:
            row = None
    if row is None:
        raise ApiError.of(
            404,
            f"taskmanager {tmid!r} not found",
            field="tmid",
            expected="the id of a TaskManager",
            hint="GET /taskmanagers lists the registered ones",
            prefix=False,
        )
    return row


_LOG_ERRORS = error_responses(400, 404, 502, 503, 504)


def _endpoint(session, transport, tmid: str) -> tuple[log_fetch.LogSource, str | None]:
    """(where and how to fetch, main log name) of a registered TaskManager's logs: the address
    its signed registration named (services/resourcemanager/claims.py), never one it could
    rewrite itself."""
    row = _row(session, tmid)
    who = f"TaskManager {tmid}"
    client = transport.redis_client
    announced = None if client is None else log_fetch.registered_endpoint(client, tmid)
    if row.state != "REGISTERED" or not announced or not announced.get("address"):
        if row.state != "REGISTERED":
            raise ApiError.of(
                404,
                f"{who} is {row.state}"
                + (f" ({row.lost_reason})" if row.lost_reason else "")
                + ": its logs are no longer served; they stay on its host (see the runbook)",
                field="tmid",
                hint=f"see {log_fetch.RUNBOOK}",
                prefix=False,
            )
        raise ApiError.of(
            503,
            f"{who} registered no log endpoint (its metrics port is off, it runs an older "
            f"version, or the one it named was refused: see the dead letters)",
            hint=f"taskmanager_metrics_port must not be -1; see {log_fetch.RUNBOOK}",
            prefix=False,
        )
    return log_fetch.LogSource.taskmanager(transport.auth, tmid, str(announced["address"])), announced.get("log")


@router.get(
    "/{tmid}/logs",
    response_model=LogListInfo,
    responses=_LOG_ERRORS,
    summary="The TaskManager's log files (its own and its Spark drivers'): name, size, mtime (operator)",
)
def taskmanager_logs(tmid: str, session: SessionDep, transport: TransportDep) -> dict:
    source, _main = _endpoint(session, transport, tmid)
    return log_fetch.listing(source)


@router.get(
    "/{tmid}/logs/{name}",
    response_class=Response,
    responses=_LOG_ERRORS,
    summary="One log file of the TaskManager as text, its last `tail` bytes (operator)",
)
def taskmanager_log_file(
    tmid: str,
    name: str,
    session: SessionDep,
    transport: TransportDep,
    tail: str | None = Query(None, description="bytes from the end; default 256 KiB, at most 4 MiB"),
) -> Response:
    log_fetch.check_name(name)
    size = log_fetch.check_tail(tail)
    source, _main = _endpoint(session, transport, tmid)
    return log_fetch.file(source, name, size)


@router.get(
    "/{tmid}/log",
    response_class=Response,
    responses=_LOG_ERRORS,
    summary="The TaskManager's own log (Flink's path), its last `tail` bytes (operator)",
)
def taskmanager_main_log(
    tmid: str,
    session: SessionDep,
    transport: TransportDep,
    tail: str | None = Query(None, description="bytes from the end; default 256 KiB, at most 4 MiB"),
) -> Response:
    size = log_fetch.check_tail(tail)
    source, main = _endpoint(session, transport, tmid)
    main = main or log_fetch.main_log_name(source)
    if not main:
        raise ApiError.of(
            404,
            f"{source.who} has no log file of its own (its output goes to a terminal or a pipe)",
            hint=f"GET /taskmanagers/{tmid}/logs lists its drivers' logs; see {log_fetch.RUNBOOK}",
            prefix=False,
        )
    return log_fetch.file(source, main, size)
