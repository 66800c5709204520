"""Composition root: `python -m services.dispatcher` (settings from HEADRACE_* / HEADRACE_CONFIG)."""

from __future__ import annotations

import logging

import uvicorn

from services.dispatcher.app import create_app
from services.dispatcher.guards import limits, slow_clients
from shared.catalog import Catalog
from shared.message_auth import control_plane_auth
from shared.settings import Settings, load_settings
from shared.transport import RedisStreamsTransport

log = logging.getLogger("services.dispatcher")


def run(settings: Settings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        max_upload_bytes = limits.upload_limit(settings)
    except ValueError as exc:
        raise SystemExit(f"error: invalid settings: {exc}") from None
    catalog = Catalog(settings.catalog)
    catalog.migrate()
    settings.artifacts.mkdir(parents=True, exist_ok=True)
    transport = RedisStreamsTransport.from_url(
        settings.redis_url, sender="dispatcher", maxlen=settings.stream_maxlen, auth=control_plane_auth(settings)
    )
    app = create_app(settings, catalog, transport, max_upload_bytes=max_upload_bytes)
    log.info(
        "dispatcher on http://%s:%d (catalog %s, artifacts %s, uploads up to %s)",
        settings.dispatcher_host,
        settings.dispatcher_port,
        catalog.url.split("@")[-1],
        settings.artifacts,
        limits.human(app.state.max_upload_bytes),
    )
    try:
        uvicorn.run(
            app,
            host=settings.dispatcher_host,
            port=settings.dispatcher_port,
            log_level="info",
            **slow_clients.server_options(settings),
        )
    finally:
        transport.close()
        catalog.dispose()


if __name__ == "__main__":
    run(load_settings())
