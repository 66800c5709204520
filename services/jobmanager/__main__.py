"""Composition root of the JobManager: settings -> leadership (standalone, or elected through
ZooKeeper) -> adapters -> loop."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from typing import Callable

import redis

from services.jobmanager import leader_sessions
from services.jobmanager.autoscaler import Autoscaler
from services.jobmanager.checkpoint_store import CheckpointStore, ZooKeeperStore
from services.jobmanager.deployment_reconciler import DeploymentReconciler
from services.jobmanager.job_master import JobMaster
from services.jobmanager.leader_liveness import LeaderConnection
from services.jobmanager.leadership import acquire_standalone_epoch, newest_catalog_epoch
from services.jobmanager.metrics import JobManagerMetrics
from services.jobmanager.pipeline_redis_users import PipelineRedisUsers
from services.jobmanager.schedule_beat import ScheduleBeat
from services.jobmanager.unit_of_work import LeadershipLost
from shared import gc_tuning, leader_epoch, metrics, streams
from shared.catalog import Catalog
from shared.clock import SystemClock, WallClock
from shared.commands import CommandGateway, make_celery
from shared.errors import ConfigError
from shared.log_access import LogGuard
from shared.logs import configure_logging
from shared.message_auth import control_plane_auth, load_secret
from shared.settings import Settings, load_settings
from shared.transport.redis_streams import RedisStreamsTransport, wait_for_redis
from shared.zookeeper import HAUnavailable, LeaderElection, ZooKeeperCheckpointStore

log = logging.getLogger("headrace.jobmanager")


class JobManagerProcess:
    """One leadership term: the loop of a JobMaster that leads with one epoch. It ends when the
    process is asked to stop or (ZooKeeper mode) when its leadership is revoked."""

    def __init__(
        self,
        master: JobMaster,
        transport,
        should_stop: Callable[[], bool],
        announce: Callable[[], None] = lambda: None,
        beat: ScheduleBeat | None = None,
        deployments: DeploymentReconciler | None = None,
        autoscaler: Autoscaler | None = None,
    ):
        self.master, self.transport = master, transport
        self.should_stop, self.announce = should_stop, announce
        self.redis_ok_at = time.monotonic()  # the last poll of the stream that Redis answered
        # Scheduled submissions tick only here, in the leader's loop: a standby has no beat.
        self.beat = beat
        self.deployments = deployments  # likewise: only a leader reconciles deployments
        self.autoscaler = autoscaler  # and scales them
        self.recovered = False

    OUTBOX_RETRY_S = 1.0
    ANNOUNCE_S = 2.0

    def run(self) -> None:
        master = self.master
        if not self.recovered:
            with master.unit_of_work():
                master.recover()
            self.recovered = True
        last_replay = last_announce = -1e9
        while not self.should_stop():
            if time.monotonic() - last_announce >= self.ANNOUNCE_S:
                last_announce = time.monotonic()
                self.announce()
            if master.outbox.backlog and time.monotonic() - last_replay >= self.OUTBOX_RETRY_S:
                last_replay = time.monotonic()
                master.outbox.replay()
            due = master.timers.next_due_in()
            block = 100 if due is None else max(1, min(100, int(due * 1000)))
            # Its own stream and every TaskManager's reports, in one blocking read.
            handled = self.transport.poll(
                streams.JM_STREAM,
                streams.JM_GROUP,
                "jobmanager",
                master.handle,
                count=500,
                block_ms=block,
                around_batch=master.unit_of_work,
                also=master.uow.report_streams(),
            )
            self.redis_ok_at = time.monotonic()
            self.run_due_timers()
            if master.checkpoints.due():
                with master.unit_of_work():
                    master.checkpoints.tick()
            if master.slot_watch.due():
                with master.unit_of_work():
                    master.slot_watch.tick()
            if self.beat is not None and self.beat.due():
                self.beat.tick()
            if self.deployments is not None and self.deployments.due():
                self.deployments.tick()
            if self.autoscaler is not None and self.autoscaler.due():
                self.autoscaler.tick()
            users = master.deployment.pipeline_users
            if users is not None and users.sweep_due():
                with master.unit_of_work(), master.uow.tx() as s:
                    live = master.deployment.live_lineages(s)
                users.sweep(live)
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
            except Exception:
                log.exception("delayed action failed; retrying in 1 s")
                master.timers.call_later(1.0, action)
                return


def lead(
    settings: Settings,
    client: redis.Redis,
    catalog: Catalog,
    epoch: int,
    should_stop: Callable[[], bool],
    leader_id: str,
    checkpoint_store: CheckpointStore | None = None,
    still_leading: Callable[[], bool] = lambda: True,
    jm_metrics: JobManagerMetrics | None = None,
    resign_unreachable_after_s: float | None = None,
) -> bool:
    """Act as the leader with `epoch` until `should_stop()`; survive Redis/catalog outages.
    `checkpoint_store`: checkpoint ids and pointers (ZooKeeper in HA mode; default the catalog).
    `still_leading`: checked before every commit (the ZooKeeper lease). Returns False when it
    found itself deposed (a newer epoch holds the catalog's leadership row).
    `resign_unreachable_after_s` (ZooKeeper mode): give the leadership up when Redis stays
    unreachable that long, so a standby that does reach it can lead (a leader cut off from Redis
    but not from ZooKeeper would otherwise hold its lease and do nothing)."""
    auth = control_plane_auth(settings)
    transport = RedisStreamsTransport(
        client, sender="jobmanager", epoch=epoch, maxlen=settings.stream_maxlen, auth=auth
    )
    # Each running lineage's own Redis user (services/jobmanager/pipeline_redis_users.py).
    pipeline_users = PipelineRedisUsers.for_cluster(
        client, load_secret(settings, create=True), settings.redis_url, settings.pipeline_redis_url
    )
    gateway = CommandGateway(
        make_celery(settings.redis_url, "headrace-jobmanager"), sender="jobmanager", epoch=epoch, auth=auth
    )
    master = JobMaster(
        settings,
        catalog,
        transport,
        gateway,
        SystemClock(),
        epoch=epoch,
        checkpoint_store=checkpoint_store,
        leader_id=leader_id,
        still_leading=still_leading,
        restart_clock=WallClock(),
        pipeline_users=pipeline_users,
    )
    if jm_metrics is not None:
        jm_metrics.leading(master, epoch)
        transport.on_refused = jm_metrics.count_refused
    leader = json.dumps(
        {
            "id": leader_id,
            "epoch": epoch,
            "mode": settings.high_availability,
            "since": int(time.time() * 1000),
            "address": metrics.advertised_url("jobmanager", settings),
        }
    )

    def announce() -> None:
        # The epoch too: a Redis that restarted empty learns the leader's epoch back within
        # seconds (receivers accept only that epoch). It only rises: a deposed leader's
        # announce cannot lower it.
        leader_epoch.publish(client, epoch)
        client.set(streams.JM_LEADER_KEY, leader, px=streams.JM_LEADER_TTL_MS)

    proc = JobManagerProcess(
        master,
        transport,
        should_stop,
        announce=announce,
        beat=ScheduleBeat(master, WallClock()),
        deployments=DeploymentReconciler(master, settings, WallClock()),
        autoscaler=Autoscaler(master, client, settings, WallClock()),
    )
    redis_lost = False
    while not should_stop():
        try:
            proc.run()
        except LeadershipLost as exc:
            log.warning("deposed: %s", exc)
            if jm_metrics is not None:
                jm_metrics.stopped_leading()
            return False
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Redis restarting: reconnect soon, so a standby does not take this leader's
            # missing connection for a dead process (services/jobmanager/leader_liveness.py).
            silent_s = time.monotonic() - proc.redis_ok_at
            if resign_unreachable_after_s is not None and silent_s >= resign_unreachable_after_s:
                log.warning(
                    "Redis unreachable for %.0f s (%s): giving up the leadership so a JobManager that "
                    "reaches it can lead",
                    silent_s,
                    exc,
                )
                redis_lost = True
                break
            log.warning("Redis unreachable (%s); retrying in 0.2 s", exc)
            time.sleep(0.2)
            continue
        except Exception as exc:  # messages stay pending and are redelivered
            if leader_sessions.is_lock_timeout(exc):
                # A row held past the lock timeout: by an older leader's session that survived the
                # takeover (it woke and stopped again), or by someone else's; the unit is retried.
                log.warning(
                    "a catalog row stayed locked for %.0f s; ending older leaders' sessions and retrying",
                    leader_sessions.LOCK_TIMEOUT_S,
                )
                leader_sessions.end_older_leaders(catalog, epoch)
                continue
            log.exception("JobManager loop failed; retrying in 1 s")
            time.sleep(1)
    try:
        master.outbox.forget_sent()  # what was sent need not be sent again by the next leader
        # Without Redis the leader key cannot be cleared: it expires within JM_LEADER_TTL_MS.
        if not redis_lost and json.loads(client.get(streams.JM_LEADER_KEY) or "{}").get("epoch") == epoch:
            client.delete(streams.JM_LEADER_KEY)
    except Exception:  # the next leader re-sends it (harmless); the key expires
        log.warning("could not clear the sent outbox entries or the leader key", exc_info=True)
    if jm_metrics is not None:
        jm_metrics.stopped_leading()
    return True


REDIS_SOCKET_TIMEOUT_S = 5.0


def contender_id() -> str:
    return f"jobmanager@{socket.gethostname()}:{os.getpid()}"


def named_client(url: str, contender: str) -> redis.Redis:
    """Every connection of this process carries its liveness name (redis-py sets it again on
    each reconnect), so its death is visible in CLIENT LIST at once."""
    return redis.Redis(
        connection_pool=redis.ConnectionPool.from_url(
            url,
            client_name=streams.jm_liveness_name(contender),
            # A silent network (a partition, not a closed port) must raise, not block forever: the
            # longest blocking read is 0.1 s (XREADGROUP BLOCK in the loop).
            socket_timeout=REDIS_SOCKET_TIMEOUT_S,
            socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S,
        )
    )


def run_with_zookeeper(
    settings: Settings,
    client: redis.Redis,
    catalog: Catalog,
    stopping: threading.Event,
    jm_metrics: JobManagerMetrics | None = None,
) -> None:
    """Contend for leadership; lead while elected; back to standby when revoked."""
    contender = contender_id()
    leader_connection = LeaderConnection(client)
    if settings.zookeeper_quorum is None:  # Settings refuses high_availability 'zookeeper' without one
        raise ConfigError("high_availability 'zookeeper' needs zookeeper_quorum (HEADRACE_ZOOKEEPER_QUORUM)")
    election = LeaderElection(
        settings.zookeeper_quorum,
        root=settings.zookeeper_root,
        contender_id=contender,
        session_timeout_s=settings.zookeeper_session_timeout_s,
    )
    if catalog.is_sqlite:
        log.warning(
            "ZooKeeper mode on an SQLite catalog: a leader stopped inside a write transaction keeps the file "
            "locked and no standby can take over until it wakes; use a PostgreSQL catalog "
            "(docs/runbooks/jobmanager-restart.md)"
        )
    while not stopping.is_set():
        try:
            election.start()
            break
        except HAUnavailable as exc:
            log.warning("%s; still trying", exc)  # a standby waits for ZooKeeper, it does not exit
    try:
        while not stopping.is_set():
            log.info("%s is standby: waiting for leadership (ZooKeeper %s)", contender, settings.zookeeper_quorum)
            try:
                # Above every epoch anyone has seen, even if ZooKeeper lost its data or the
                # cluster ran standalone before (its epochs count in Redis): receivers fence
                # older ones.
                lease = election.campaign(
                    stop=stopping.is_set,
                    epoch_floor=lambda: max(newest_catalog_epoch(catalog), int(client.get(streams.JM_EPOCH_KEY) or 0)),
                    leader_dead=leader_connection.dead,
                )
                if lease is None:
                    break
                leader_epoch.publish(client, lease.epoch)
            except Exception:  # catalog, Redis or ZooKeeper failed while winning
                log.exception("taking leadership failed; contending again in 1 s")
                election.resign()
                stopping.wait(1.0)
                continue
            log.info("JobManager %s started as leader with epoch %d (ZooKeeper)", contender, lease.epoch)
            take_catalog(catalog, contender, lease.epoch)
            # The lambdas below are called only inside lead(), within this iteration's lease.
            lead(
                settings,
                client,
                catalog,
                lease.epoch,
                should_stop=lambda: stopping.is_set() or lease.revoked.is_set(),  # noqa: B023
                leader_id=contender,
                checkpoint_store=ZooKeeperStore(ZooKeeperCheckpointStore(election.zk, settings.zookeeper_root)),
                still_leading=lambda: not lease.revoked.is_set(),  # noqa: B023
                jm_metrics=jm_metrics,
                resign_unreachable_after_s=settings.heartbeat_timeout_s,
            )
            if lease.revoked.is_set() and not stopping.is_set():
                log.warning("leadership with epoch %d revoked (%s); back to standby", lease.epoch, lease.reason)
            election.resign()
            leader_sessions.name_sessions(catalog, contender)
    finally:
        election.close()


def take_catalog(catalog: Catalog, contender: str, epoch: int) -> None:
    """Before a new leader's first unit of work: its sessions named for its epoch, and the sessions
    of older leaders ended, with whatever rows their open transactions hold (leader_sessions.py)."""
    leader_sessions.name_sessions(catalog, contender, epoch)
    leader_sessions.end_older_leaders(catalog, epoch)


def run(settings: Settings) -> None:
    configure_logging("jobmanager", settings.log_level)
    wait_for_redis(settings.redis_url).close()
    client = named_client(settings.redis_url, contender_id())
    catalog = Catalog(settings.catalog)
    catalog.migrate()
    leader_sessions.name_sessions(catalog, contender_id())  # after migrating: a migration may take long
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    jm_metrics = JobManagerMetrics()
    key = control_plane_auth(settings).sender_key("jobmanager")  # its logs: to the control plane only
    metrics.serve(
        jm_metrics.registry,
        host=settings.metrics_host,
        port=settings.jobmanager_metrics_port,
        service="jobmanager",
        log_file=settings.log_file,
        log_guard=LogGuard(key, key),
    )
    gc_tuning.tune()
    if settings.high_availability == "zookeeper":
        run_with_zookeeper(settings, client, catalog, stopping, jm_metrics)
    else:
        epoch = acquire_standalone_epoch(client, catalog)
        log.info("JobManager started as leader with epoch %d (standalone)", epoch)
        take_catalog(catalog, contender_id(), epoch)
        if not lead(
            settings,
            client,
            catalog,
            epoch,
            should_stop=stopping.is_set,
            leader_id=contender_id(),
            jm_metrics=jm_metrics,
        ):
            # Another standalone JobManager took over the catalog: two would only depose each
            # other in turn. Exit non-zero so whoever supervises this one sees it.
            log.error("another JobManager leads this catalog with a newer epoch; exiting")
            raise SystemExit(3)
    log.info("JobManager stopped")


if __name__ == "__main__":
    run(load_settings())
