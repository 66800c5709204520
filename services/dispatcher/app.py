"""Assembles the FastAPI application from what the entry point built; nothing else."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import AsyncIterator, Callable

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from services.dispatcher import errors
from services.dispatcher.guards import auth, limits, openapi_security, security, slow_clients
from services.dispatcher.guards.archive_bounds import ArtifactLimits
from services.dispatcher.routes import (
    checkpoints,
    deployments,
    jars,
    job_metrics,
    jobmanager,
    jobs,
    overview,
    savepoints,
    schedules,
    taskmanagers,
    ui,
    whoami,
)
from services.dispatcher.schemas import normalise_restart_strategy
from services.dispatcher.submission.warm_planner import WarmPlanner
from services.dispatcher.views import metrics
from services.dispatcher.views.overview_cache import OverviewCache
from services.dispatcher.views.shapes import FLINK_VERSION
from shared import warm_pools
from shared.catalog import Catalog, repository
from shared.settings import Settings
from shared.spark_runtime import SparkRuntime
from shared.transport.base import Transport

# The dashboard is package data: in a checkout web_ui links to the repository's web-ui/, in an
# installed wheel it is a copy (pyproject.toml, package-data).
DEFAULT_WEB_DIR = (Path(__file__).parent / "web_ui").resolve()
API_VERSION_PREFIX = "/v1"


class NoCacheStatic(StaticFiles):
    """The dashboard's scripts are revalidated on each load (ETag: cheap), so an upgraded
    index.html is never paired with a browser's cached older scripts."""

    def file_response(self, *args, **kwargs):
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"
        return response


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    if app.state.warm_planner is not None:
        # A spare planner from the start, so that the first upgrade is checked as quickly as the
        # next ones; started once the dispatcher is up, at the lowest CPU priority (submission/warm_planner.py).
        app.state.warm_planner.keep_ready()
    yield
    if app.state.warm_planner is not None:  # its spare planner's JVM goes with the dispatcher
        app.state.warm_planner.close()


def _no_urgent_warm_up(transport: Transport, catalog: Catalog) -> Callable[[], bool]:
    """Whether no registered TaskManager starts a driver at its full priority, from the pools they
    publish in Redis; always, without Redis (an in-memory transport has no TaskManagers to wait for)."""
    client = transport.redis_client
    if client is None:
        return lambda: True

    def ask() -> bool:
        with catalog.session() as session:
            ids = [row.id for row in repository.list_taskmanagers(session)]
        return warm_pools.no_urgent_warm_up(client, ids)

    return ask


def create_app(
    settings: Settings,
    catalog: Catalog,
    transport: Transport,
    *,
    web_dir: Path | None = DEFAULT_WEB_DIR,
    clock_ms: Callable[[], int] | None = None,
    max_upload_bytes: int | None = None,
) -> FastAPI:
    app = FastAPI(
        lifespan=_lifespan,
        title="Headrace dispatcher",
        version=FLINK_VERSION,
        description="Flink REST v1 paths and JSON shapes for PySpark pipelines. Every error answers "
        '{"errors": [...], "field", "expected", "hint", "details"}.',
    )
    app.state.settings = settings
    app.state.catalog = catalog
    app.state.transport = transport
    app.state.clock_ms = clock_ms
    # Validated once at start-up: a bad cluster default fails here, not on the first submission.
    app.state.default_restart_strategy = normalise_restart_strategy(settings.restart_strategy)
    app.state.web_dir = web_dir if web_dir is not None and web_dir.is_dir() else None
    app.state.max_upload_bytes = max_upload_bytes or limits.upload_limit(settings)
    app.state.artifact_limits = ArtifactLimits.from_settings(settings)
    # GET /jobs/overview's encoded answer, rebuilt at most every overview_cache_ms (views/overview_cache.py).
    app.state.overview_cache = OverviewCache(settings.overview_cache_ms / 1000)
    app.state.warm_planner = None
    if settings.warm_planner:
        warm = WarmPlanner(
            python=sys.executable,
            run_as=settings.driver_user,
            catalog_url=settings.pipeline_catalog_url,
            redis_url=settings.pipeline_redis_url or settings.redis_url,
            runtime=SparkRuntime.from_settings(settings),
            users=settings.driver_users,
            lake_dir=str(settings.lake.absolute()),
            no_urgent_warm_up=_no_urgent_warm_up(transport, catalog),
        )
        app.state.warm_planner = warm

    errors.install(app)
    app.add_middleware(limits.BodyLimit, upload_limit=app.state.max_upload_bytes)
    # Outermost last: the guard, then the token check, run before a body is read (auth.md).
    app.state.auth_required = auth.auth_required(settings)
    auth.log.info("%s", auth.describe_mode(settings))
    app.add_middleware(auth.RequireToken, enabled=app.state.auth_required)
    security.install(app, auth_on=app.state.auth_required)
    slow_clients.install(app, settings)  # outside the guard: a refusal's drain is timed too
    app.state.metrics_registry = metrics.registry_for(catalog, transport.redis_client)
    app.include_router(metrics.router)  # Prometheus scrapes /metrics only, never /v1/metrics
    # schedules before jobs: /jobs/schedules must not be taken for /jobs/{jobid}.
    api = (overview, jars, schedules, jobs, job_metrics, checkpoints, savepoints, taskmanagers, jobmanager, deployments)
    for module in (*api, whoami, ui):
        app.include_router(module.router)
    # Flink's clients (the `flink` CLI among them) call every endpoint under /v1/.
    for module in api:
        app.include_router(module.router, prefix=API_VERSION_PREFIX, include_in_schema=False)
    openapi_security.install(app)
    if app.state.web_dir is not None:
        app.mount("/web", NoCacheStatic(directory=app.state.web_dir), name="web")
    return app
