"""Cluster-wide read-only endpoints: /overview, /config, /healthz."""

from __future__ import annotations

import json
import time

import redis
from fastapi import APIRouter

from services.dispatcher.deps import SessionDep, SettingsDep, TransportDep
from services.dispatcher.schemas import ClusterOverview, DashboardConfiguration, Health
from services.dispatcher.views import shapes
from shared import streams
from shared.catalog import repository

router = APIRouter(tags=["cluster"])

REFRESH_INTERVAL_MS = 1000  # the dashboard polls once a second


@router.get("/overview", response_model=ClusterOverview, summary="TaskManagers, slots, job counts and the leader")
def cluster_overview(session: SessionDep, transport: TransportDep) -> dict:
    out = shapes.cluster_overview(repository.list_taskmanagers(session), repository.count_jobs_by_status(session))
    out["jobmanager"] = _leader(transport)
    return out


def _leader(transport) -> dict | None:
    """What the leading JobManager announces in Redis; None if nobody does (or Redis is away)."""
    client = transport.redis_client
    if client is None:
        return None
    try:
        raw = client.get(streams.JM_LEADER_KEY)
        return json.loads(raw) if raw else None
    except (redis.RedisError, ValueError):
        return None


@router.get("/config", response_model=DashboardConfiguration, summary="Settings the web dashboard needs")
def dashboard_config(settings: SettingsDep) -> dict:
    now = time.localtime()
    return shapes.dashboard_config(
        refresh_interval_ms=REFRESH_INTERVAL_MS,
        timezone_name=now.tm_zone or "UTC",
        timezone_offset_ms=int(now.tm_gmtoff or 0) * 1000,
        spark_master=settings.spark_master,
        spark_master_ui=settings.spark_master_ui,
        kafka_bootstrap_servers=settings.pipeline_kafka_bootstrap_servers,
    )


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
def healthz() -> dict:
    return {"status": "ok"}
