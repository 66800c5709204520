"""Composition root of the ResourceManager: settings -> adapters -> loop."""

from __future__ import annotations

import json
import logging
import signal

from services.resourcemanager.fencing import JobManagerFence
from services.resourcemanager.liveness import ConnectionLiveness
from services.resourcemanager.metrics import ResourceManagerMetrics
from services.resourcemanager.service import ResourceManager
from shared import gc_tuning, metrics, streams
from shared.catalog import Catalog
from shared.clock import SystemClock
from shared.leader_epoch import LeaderEpochFence
from shared.log_access import LogGuard
from shared.logs import configure_logging
from shared.message_auth import control_plane_auth
from shared.settings import Settings, load_settings
from shared.transport.redis_streams import RedisStreamsTransport, wait_for_redis

log = logging.getLogger("headrace.resourcemanager")


def run(settings: Settings) -> None:
    configure_logging("resourcemanager", settings.log_level)
    client = wait_for_redis(settings.redis_url)
    catalog = Catalog(settings.catalog)
    catalog.migrate()
    auth = control_plane_auth(settings)
    transport = RedisStreamsTransport(client, sender="resourcemanager", maxlen=settings.stream_maxlen, auth=auth)
    rm_metrics = ResourceManagerMetrics()
    transport.on_refused = rm_metrics.count_refused
    key = auth.sender_key("resourcemanager")  # its logs: to the control plane only
    metrics.serve(
        rm_metrics.registry,
        host=settings.metrics_host,
        port=settings.resourcemanager_metrics_port,
        service="resourcemanager",
        log_file=settings.log_file,
        log_guard=LogGuard(key, key),
    )

    def publish_stats(stats: dict) -> None:
        rm_metrics.record(stats)
        client.set(streams.RM_STATS_KEY, json.dumps(stats), ex=60)

    def announce(session: str) -> None:
        client.set(streams.RM_SESSION_KEY, session, px=int(settings.heartbeat_timeout_s * 1000))

    clock = SystemClock()
    fence = JobManagerFence(LeaderEpochFence.from_redis(client), clock=clock.now)
    rm = ResourceManager(
        settings,
        catalog,
        transport,
        clock,
        ConnectionLiveness(client),
        publish_stats=publish_stats,
        announce=announce,
        fence=fence,
    )

    def stop(*_):
        rm.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    gc_tuning.tune()
    while not rm.stopping:
        try:
            rm.run()
        except Exception:  # survive Redis/catalog outages
            log.exception("ResourceManager loop failed; retrying in 1 s")
            import time

            time.sleep(1)
    log.info("ResourceManager stopped")


if __name__ == "__main__":
    run(load_settings())
