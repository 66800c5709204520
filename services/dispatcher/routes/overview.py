"""Cluster-wide read-only endpoints: /overview, /config, /healthz."""

from __future__ import annotations

import time

from fastapi import APIRouter

from services.dispatcher import views
from services.dispatcher.deps import SessionDep
from services.dispatcher.schemas import ClusterOverview, DashboardConfiguration, Health
from shared.catalog import repository

router = APIRouter(tags=["cluster"])

REFRESH_INTERVAL_MS = 1000  # the dashboard polls once a second


@router.get("/overview", response_model=ClusterOverview, summary="TaskManagers, slots and job counts")
def cluster_overview(session: SessionDep) -> dict:
    return views.cluster_overview(repository.list_taskmanagers(session), repository.count_jobs_by_status(session))


@router.get("/config", response_model=DashboardConfiguration, summary="Settings the web dashboard needs")
def dashboard_config() -> dict:
    now = time.localtime()
    return views.dashboard_config(refresh_interval_ms=REFRESH_INTERVAL_MS, timezone_name=now.tm_zone or "UTC",
                                  timezone_offset_ms=int(now.tm_gmtoff or 0) * 1000)


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
def healthz() -> dict:
    return {"status": "ok"}
