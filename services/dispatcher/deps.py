"""Typed dependencies. Everything comes from `app.state`, filled by `create_app` from what the
entry point built; nothing is created at import time.

The ones that only read `app.state` and that GET /jobs/overview takes are `async`: FastAPI runs a
plain function dependency in a worker thread, a round trip per dependency per request that cost
more than answering the overview from its cache."""

from __future__ import annotations

import time
from typing import Annotated, Callable, Iterator

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from services.dispatcher.guards.archive_bounds import ArtifactLimits
from services.dispatcher.submission.warm_planner import WarmPlanner
from services.dispatcher.views.overview_cache import OverviewCache
from shared.catalog import Catalog
from shared.settings import Settings
from shared.transport.base import Transport


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_catalog(request: Request) -> Catalog:
    return request.app.state.catalog


def get_transport(request: Request) -> Transport:
    return request.app.state.transport


async def get_overview_cache(request: Request) -> OverviewCache:
    return request.app.state.overview_cache


def get_default_restart_strategy(request: Request) -> dict:
    """The cluster's restart strategy (settings.restart_strategy, normalised at start-up)."""
    return dict(request.app.state.default_restart_strategy)


def get_session(catalog: Annotated[Catalog, Depends(get_catalog)]) -> Iterator[Session]:
    """One read transaction per request (routes that write open their own, so they can commit
    before publishing)."""
    with catalog.session() as s:
        yield s


async def get_clock(request: Request) -> Callable[[], int]:
    return getattr(request.app.state, "clock_ms", None) or (lambda: int(time.time() * 1000))


def get_now_ms(clock: Annotated[Callable[[], int], Depends(get_clock)]) -> int:
    return clock()


SettingsDep = Annotated[Settings, Depends(get_settings)]
CatalogDep = Annotated[Catalog, Depends(get_catalog)]
TransportDep = Annotated[Transport, Depends(get_transport)]
SessionDep = Annotated[Session, Depends(get_session)]
DefaultRestartDep = Annotated[dict, Depends(get_default_restart_strategy)]
NowMsDep = Annotated[int, Depends(get_now_ms)]
ClockDep = Annotated[Callable[[], int], Depends(get_clock)]
OverviewCacheDep = Annotated[OverviewCache, Depends(get_overview_cache)]


def get_max_upload_bytes(request: Request) -> int:
    return request.app.state.max_upload_bytes


MaxUploadDep = Annotated[int, Depends(get_max_upload_bytes)]


def get_artifact_limits(request: Request) -> ArtifactLimits:
    return request.app.state.artifact_limits


ArtifactLimitsDep = Annotated[ArtifactLimits, Depends(get_artifact_limits)]


def get_warm_planner(request: Request) -> WarmPlanner | None:
    return request.app.state.warm_planner


WarmPlannerDep = Annotated[WarmPlanner | None, Depends(get_warm_planner)]
