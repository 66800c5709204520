"""Composition root of the JobManager: settings -> leadership epoch -> adapters -> loop."""

from __future__ import annotations

import logging
import signal
import time

from shared import streams
from shared.catalog import Catalog
from shared.clock import SystemClock
from shared.commands import CommandGateway, make_celery
from shared.logs import configure_logging
from shared.settings import Settings, load_settings
from shared.transport.redis_streams import RedisStreamsTransport, wait_for_redis
from services.jobmanager.leadership import acquire_standalone_epoch
from services.jobmanager.scheduler import JobMaster

log = logging.getLogger("headrace.jobmanager")


class JobManagerProcess:
    def __init__(self, master: JobMaster, transport):
        self.master, self.transport = master, transport
        self.stopping = False
        self.recovered = False

    OUTBOX_RETRY_S = 1.0

    def run(self) -> None:
        master = self.master
        if not self.recovered:
            with master.unit_of_work():
                master.recover()
            self.recovered = True
        last_replay = -1e9
        while not self.stopping:
            if master.outbox.backlog and time.monotonic() - last_replay >= self.OUTBOX_RETRY_S:
                last_replay = time.monotonic()
                master.outbox.replay()
            due = master.timers.next_due_in()
            block = 100 if due is None else max(1, min(100, int(due * 1000)))
            handled = self.transport.poll(streams.JM_STREAM, streams.JM_GROUP, "jobmanager", master.handle,
                                          count=500, block_ms=block, around_batch=master.unit_of_work)
            self.run_due_timers()
            if not handled:
                master.outbox.forget_sent()

    def run_due_timers(self) -> None:
        """Each due action (a delayed restart) in its own unit of work; one that fails (catalog
        unreachable) is tried again a second later instead of stranding its job in RESTARTING."""
        master = self.master
        while (action := master.timers.pop_due()) is not None:
            try:
                with master.unit_of_work():
                    action()
            except Exception:  # noqa: BLE001
                log.exception("delayed action failed; retrying in 1 s")
                master.timers.call_later(1.0, action)
                return


def run(settings: Settings) -> None:
    configure_logging("jobmanager")
    client = wait_for_redis(settings.redis_url)
    catalog = Catalog(settings.catalog)
    catalog.migrate()
    epoch = acquire_standalone_epoch(client, catalog)
    transport = RedisStreamsTransport(client, sender="jobmanager", epoch=epoch, maxlen=settings.stream_maxlen)
    gateway = CommandGateway(make_celery(settings.redis_url, "headrace-jobmanager"), sender="jobmanager", epoch=epoch)
    master = JobMaster(settings, catalog, transport, gateway, SystemClock(), epoch=epoch)
    proc = JobManagerProcess(master, transport)

    def stop(*_):
        proc.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("JobManager started as leader with epoch %d (standalone)", epoch)
    while not proc.stopping:
        try:
            proc.run()
        except Exception:  # noqa: BLE001 - survive Redis/catalog outages; messages stay pending
            log.exception("JobManager loop failed; retrying in 1 s")
            time.sleep(1)
    log.info("JobManager stopped")


if __name__ == "__main__":
    run(load_settings())
