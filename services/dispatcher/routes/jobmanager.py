"""/jobmanager: the cluster's effective settings, who leads, and the leading JobManager's logs
(Flink's paths and shapes; docs/runbooks/logs.md)."""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from services.dispatcher.deps import SettingsDep, TransportDep
from services.dispatcher.errors import ApiError, error_responses
from services.dispatcher.guards.redaction import MASK, mask_url, masked_value  # noqa: F401 - one masking rule
from services.dispatcher.schemas import ConfigEntry, JobManagerLeaderInfo, LogListInfo
from services.dispatcher.views import log_fetch
from shared import streams

router = APIRouter(prefix="/jobmanager", tags=["jobmanager"])

ZOOKEEPER_TIMEOUT_S = 2.0
CONTENDERS_TTL_S = 5.0
_ERRORS = error_responses(400, 404, 502, 503, 504)


def effective_config(settings) -> list[dict[str, str]]:
    """Flink's [{"key", "value"}]: every setting (and the derived locations) as a string."""
    values = settings.model_dump(mode="json")
    values.update(
        {
            "catalog": settings.catalog,
            "checkpoints": str(settings.checkpoints),
            "savepoints": str(settings.savepoints),
            "artifacts": str(settings.artifacts),
        }
    )
    out = []
    for key in sorted(values):
        value = masked_value(key, values[key])
        text = "" if value is None else value if isinstance(value, str) else json.dumps(value)
        out.append({"key": key, "value": text})
    return out


@router.get(
    "/config",
    response_model=list[ConfigEntry],
    summary="The effective cluster settings, secrets masked (Flink's [{key, value}])",
)
def jobmanager_config(settings: SettingsDep) -> list[dict[str, str]]:
    return effective_config(settings)


def _redis(transport):
    client = transport.redis_client
    if client is None:
        raise ApiError.of(503, "this dispatcher has no Redis connection: the leader is not known", prefix=False)
    return client


def _leader_record(client) -> dict | None:
    return log_fetch.announcement(client, streams.JM_LEADER_KEY, "where the leading JobManager announces itself")


def _contenders(settings, state) -> tuple[list[str], str | None]:
    """The contenders' ids in election order (ZooKeeper mode), at most CONTENDERS_TTL_S old: the
    dashboard asks every second, and each fresh answer costs a ZooKeeper session."""
    if settings.high_availability != "zookeeper":
        return [], None
    cached = getattr(state, "jm_contenders", None)
    if cached is not None and time.monotonic() - cached[0] < CONTENDERS_TTL_S:
        return cached[1]
    answer = _read_contenders(settings)
    state.jm_contenders = (time.monotonic(), answer)
    return answer


def _read_contenders(settings) -> tuple[list[str], str | None]:
    from shared.zookeeper import HAUnavailable, LeaderElection

    observer = LeaderElection(
        settings.zookeeper_quorum,
        root=settings.zookeeper_root,
        contender_id="dispatcher-observer",
        connect_timeout_s=ZOOKEEPER_TIMEOUT_S,
    )
    try:
        observer.start()
    except HAUnavailable as exc:
        return [], str(exc)
    try:
        return observer.contenders(), None
    except Exception as exc:  # noqa: BLE001 - the rest of the answer is still worth giving
        return [], f"{type(exc).__name__}: {exc}"
    finally:
        observer.close()


@router.get(
    "/leader",
    response_model=JobManagerLeaderInfo,
    summary="The leading JobManager, the fencing epoch and the HA contenders",
)
def jobmanager_leader(request: Request, settings: SettingsDep, transport: TransportDep) -> dict:
    client = _redis(transport)
    record = _leader_record(client)
    leader = None
    if record is not None:
        leader = {k: record.get(k) for k in ("id", "epoch", "mode", "since", "address")}
    try:
        raw_epoch = client.get(streams.JM_EPOCH_KEY)
    except redis.RedisError as exc:
        raise ApiError.of(503, f"Redis is unavailable: {exc}", prefix=False) from None
    contenders, problem = _contenders(settings, request.app.state)
    out: dict[str, Any] = {"leader": leader, "epoch": int(raw_epoch) if raw_epoch else None, "contenders": contenders}
    if problem:
        out["contendersError"] = problem
    return out


def _leader_endpoint(transport) -> log_fetch.LogSource:
    record = _leader_record(_redis(transport))
    if record is None:
        raise ApiError.of(
            503,
            "no JobManager leads right now, so no JobManager log is served",
            hint=f"GET /jobmanager/leader; see {log_fetch.RUNBOOK}",
            prefix=False,
        )
    who = f"JobManager {record.get('id')} (leader, epoch {record.get('epoch')})"
    if not record.get("address"):
        raise ApiError.of(
            503,
            f"{who} does not serve its logs (jobmanager_metrics_port is -1, or it runs an older version)",
            hint=f"see {log_fetch.RUNBOOK}",
            prefix=False,
        )
    return log_fetch.LogSource.service(transport.auth, "jobmanager", who, str(record["address"]))


@router.get(
    "/logs",
    response_model=LogListInfo,
    responses=_ERRORS,
    summary="The leading JobManager's log files: name, size, mtime (operator)",
)
def jobmanager_logs(transport: TransportDep) -> dict:
    return log_fetch.listing(_leader_endpoint(transport))


@router.get(
    "/logs/{name}",
    response_class=Response,
    responses=_ERRORS,
    summary="One log file of the leading JobManager as text, its last `tail` bytes (operator)",
)
def jobmanager_log_file(
    name: str,
    transport: TransportDep,
    tail: str | None = Query(None, description="bytes from the end; default 256 KiB, at most 4 MiB"),
) -> Response:
    log_fetch.check_name(name)
    size = log_fetch.check_tail(tail)
    return log_fetch.file(_leader_endpoint(transport), name, size)


@router.get(
    "/log",
    response_class=Response,
    responses=_ERRORS,
    summary="The leading JobManager's own log (Flink's path), its last `tail` bytes (operator)",
)
def jobmanager_main_log(
    transport: TransportDep,
    tail: str | None = Query(None, description="bytes from the end; default 256 KiB, at most 4 MiB"),
) -> Response:
    size = log_fetch.check_tail(tail)
    source = _leader_endpoint(transport)
    main = log_fetch.main_log_name(source)
    if not main:
        raise ApiError.of(
            404,
            f"{source.who} has no log file of its own (its output goes to a terminal or a pipe)",
            hint=f"see {log_fetch.RUNBOOK}",
            prefix=False,
        )
    return log_fetch.file(source, main, size)
