"""Composition root of a TaskManager process.

`run(settings, slots=N)` is one TaskManager, composed of ProcessParts (the benchmarks' simulated
fleets compose theirs in bench/simulated_taskmanagers.py). The process consumes its TaskManager's
Celery queue with a solo-pool worker in the main thread, while the ResourceManager link and the
driver reader threads run beside it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Callable

import redis
from celery import Celery

from services.taskmanager import storage_probe
from services.taskmanager.commands import CommandIntake, register_commands
from services.taskmanager.drivers.process import DriverProcess, remove_driver_dirs
from services.taskmanager.drivers.sandbox import DriverSandbox, start_sandbox, sweep_drivers
from services.taskmanager.drivers.supply import DriverLaunch
from services.taskmanager.drivers.warm_pool import WarmPool
from services.taskmanager.drivers.warmup_tokens import WarmupTokens
from services.taskmanager.metrics import TaskManagerCollector, TaskMetrics
from services.taskmanager.rm_link import ResourceManagerLink
from services.taskmanager.runtime import class_archive
from services.taskmanager.supervisor import TaskSupervisor
from services.taskmanager.tasks.artifact_check import ArtifactChecker
from services.taskmanager.tasks.held_reports import HeldReports
from services.taskmanager.tasks.noop import NoopRunner
from shared import gc_tuning, job_options, metrics, streams
from shared.commands import make_celery
from shared.ids import TaskManagerId, new_taskmanager_id
from shared.jars import MissingJars
from shared.leader_epoch import LeaderEpochFence
from shared.log_access import LogGuard
from shared.log_files import LogFiles
from shared.logs import configure_logging
from shared.message_auth import MissingKey, TaskManagerAuth, taskmanager_auth, taskmanager_sender
from shared.settings import Settings, load_settings
from shared.spark_runtime import SparkRuntime
from shared.transport import kombu_redis
from shared.transport.redis_streams import RedisStreamsTransport, wait_for_redis

log = logging.getLogger("headrace.taskmanager")

SPARK_UI_ENV = "HEADRACE_SPARK_UI"  # read by the driver processes (runtime/runner.py)


class EndpointAnnouncer:
    """Keeps `streams.tm_endpoint_key` of each TaskManager of this process alive: the mark of a
    running TaskManager, by which a newcomer finds the ones whose storage probe to check (the
    dispatcher fetches logs from the address the registration named, services/resourcemanager/
    claims.py). Refreshed every heartbeat interval and expiring after the heartbeat timeout, so
    the key of a TaskManager that died is gone when it is declared lost."""

    def __init__(self, client, taskmanager_ids, *, address: str, main_log: str | None, interval_s: float, ttl_s: float):
        self.client, self.ids, self.interval_s = client, list(taskmanager_ids), interval_s
        self.ttl_ms = max(1000, int(ttl_s * 1000))
        self.value = json.dumps({"address": address, "log": main_log})
        self._stop = threading.Event()

    def start(self) -> "EndpointAnnouncer":
        threading.Thread(target=self._loop, name="endpoint-announcer", daemon=True).start()
        return self

    def _loop(self) -> None:
        while True:
            try:
                pipe = self.client.pipeline(transaction=False)
                for tm in self.ids:
                    pipe.set(streams.tm_endpoint_key(tm), self.value, px=self.ttl_ms)
                pipe.execute()
            except Exception as exc:  # noqa: BLE001 - Redis away: the next round sets it again
                log.debug("could not announce the log endpoint: %s", exc)
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stop.set()
        try:
            self.client.delete(*[streams.tm_endpoint_key(tm) for tm in self.ids])
        except Exception:  # noqa: BLE001 - it expires anyway
            pass


# A TaskManager whose checkpoint directory is not the shared one exits with this code at start.
EXIT_STORAGE_NOT_SHARED = 4
# A TaskManager without keys to sign its reports and check its commands exits with this code.
EXIT_NO_KEYS = 5
# A TaskManager whose jar cache lacks Spark's Kafka connector or Delta Lake exits with this code.
EXIT_NO_JARS = 6


EXECUTOR_KEYS = ("spark.executor.cores", job_options.EXECUTOR_MEMORY)


def executor_overrides(config: dict | None) -> dict[str, str]:
    """The executor settings a job's configuration sets (they fix a driver at its start, so such a
    task gets a driver of its own instead of a warm one)."""
    return {k: str((config or {})[k]).strip() for k in EXECUTOR_KEYS if k in (config or {})}


def driver_engine_args(settings: Settings, config: dict | None = None) -> list[str]:
    """Where the drivers' work runs (runner.py): local[p], or executors of a standalone cluster,
    reaching the driver at this TaskManager's advertised host; executor cores and memory from the
    job's configuration, else the TaskManager's settings. Raises ValueError for a bad value."""
    if settings.spark_master == "local":
        return []
    over = executor_overrides(config)
    cores = over.get("spark.executor.cores", str(settings.spark_executor_cores))
    memory = over.get("spark.executor.memory", settings.spark_executor_memory)
    if not cores.isdigit() or int(cores) < 1:
        raise ValueError(f"spark.executor.cores must be a whole number >= 1, got {cores!r}")
    memory = job_options.spark_executor_memory(memory)  # InvalidSize (a ValueError) names the key
    return [
        "--master",
        settings.spark_master,
        "--executor-cores",
        cores,
        "--executor-memory",
        memory,
        "--executor-timeout",
        str(settings.slot_request_timeout_s),
        "--host",
        settings.advertised_host or "127.0.0.1",
    ]


def start_up_args(settings: Settings, workdir: Path) -> list[str]:
    """The runner's arguments for its Spark runtime (the jars; the class archive, whose build
    starts here in the background if it is missing) and the Python fork server."""
    runtime = SparkRuntime.from_settings(settings)
    if runtime.class_archive_dir is not None:
        class_archive.ensure_started(
            class_archive.archive_path(runtime.class_archive_dir), workdir / "logs" / "class-archive.log"
        )
    args = runtime.cli_args()
    if settings.driver_python_forkserver:
        args.append("--python-forkserver")
    return args


def driver_launch(
    settings: Settings, slots: int, archive_args: list[str], sandbox: DriverSandbox | None
) -> DriverLaunch:
    """How the TaskManager's supervisors start drivers, and their warm pools."""

    def warm_pool(factory: Callable[..., DriverProcess]) -> WarmPool:
        return WarmPool(
            size=settings.warm_drivers,
            parallelism=settings.warm_parallelism or slots,
            factory=factory,
            max_rss_bytes=settings.warm_driver_max_rss_bytes,
            tokens=WarmupTokens.for_machine(settings.warmup_concurrency),
            serves_smaller=settings.spark_master == "local",
        )

    return DriverLaunch(
        driver_memory=settings.driver_memory,
        shuffle_partitions=settings.spark_shuffle_partitions,
        engine_args=lambda config: driver_engine_args(settings, config) + archive_args,
        sandbox=sandbox,
        warm_pool=warm_pool,
        warm_up_query=settings.warm_up_query,
        warm_up_batches=settings.warm_up_batches,
        follow_standby=settings.spark_master != "local" and not settings.warm_parallelism,
    )


def celery_app(settings: Settings, reports: HeldReports, dead_letter_stream: str) -> Celery:
    """The Celery app whose worker consumes this process's TaskManager queues."""
    app = make_celery(settings.redis_url, "headrace-taskmanager")
    # kombu's Redis transport, but an unreadable queue item is dead-lettered instead of ending
    # the worker (see shared/transport/kombu_redis.py).
    app.conf.broker_transport = "shared.transport.kombu_redis:Transport"
    # Celery's remote control answers inspection only: no `celery control shutdown` stops it.
    app.conf.worker_consumer = "services.taskmanager.remote_control:Consumer"
    # The reports of the commands taken in one read of the queue go out together.
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options,
        kombu_redis.AROUND_READ: lambda: reports.hold(raise_errors=False),
        kombu_redis.DEAD_LETTERS: dead_letter_stream,
    }
    return app


def check_storage(settings: Settings, base_id: str, client: redis.Redis, announcer: EndpointAnnouncer | None) -> None:
    """Exit (EXIT_STORAGE_NOT_SHARED) unless the checkpoint directory is the one shared with
    the other TaskManagers."""
    try:
        checked = storage_probe.check_shared(settings.checkpoints, base_id, client)
    except storage_probe.StorageNotShared as exc:
        log.error("%s", exc)
        if announcer is not None:
            announcer.stop()
        raise SystemExit(EXIT_STORAGE_NOT_SHARED) from None
    log.info(
        "checkpoint directory %s: writable, and shared with %s",
        settings.checkpoints,
        ", ".join(checked) if checked else "no other running TaskManager",
    )


def keys_or_exit(settings: Settings, base_id: TaskManagerId, ids: list[TaskManagerId]) -> TaskManagerAuth:
    """The keys the process's TaskManagers sign their reports and check their commands with; exits
    (EXIT_NO_KEYS) without them."""
    try:
        return taskmanager_auth(settings, ids)
    except (MissingKey, ValueError) as exc:
        log.error('TaskManager %s cannot start: %s (docs/runbooks/auth.md, "Signed messages")', base_id, exc)
        raise SystemExit(EXIT_NO_KEYS) from None


class ProcessParts:
    """What a TaskManager process is made of, built in this order: its Redis connections (one
    named for its report streams, one whose disappearance the ResourceManager watches), its
    report transport, a supervisor per TaskManager, the Celery app that takes their commands,
    its metrics and log endpoint, its ResourceManager link and the worker. `run` composes one
    TaskManager from them; bench/simulated_taskmanagers.py composes a fleet of no-op ones for
    the control-plane benchmarks."""

    def __init__(
        self, settings: Settings, base_id: TaskManagerId, ids: list[TaskManagerId], slots: int, auth: TaskManagerAuth
    ) -> None:
        self.settings, self.base_id, self.ids, self.slots, self.auth = settings, base_id, ids, slots, auth
        # Named, so the ResourceManager finds this process's report streams (streams.reporter_name).
        self.client = wait_for_redis(settings.redis_url, client_name=streams.reporter_name(base_id))
        process_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.liveness_name = streams.liveness_name(process_id)
        # A dedicated named connection: the ResourceManager watches for it to vanish.
        self.liveness = redis.Redis.from_url(settings.redis_url, client_name=self.liveness_name)
        self.liveness.ping()
        # What it reports goes to streams of its own (shared/streams.py), the only ones its user may write.
        self.routes = streams.taskmanager_routes(base_id)
        self.transport = RedisStreamsTransport(
            self.client, sender=f"taskmanager:{base_id}", maxlen=settings.stream_maxlen, auth=auth, route=self.routes
        )
        self.workdir = settings.workdir / "taskmanagers" / base_id

    def supervise(self, drivers: Callable[[], DriverLaunch | None]) -> None:
        """A TaskSupervisor per TaskManager, starting its drivers with what `drivers()` returns
        (None: no-op tasks only)."""
        settings = self.settings
        remove_driver_dirs(self.workdir / "drivers")  # leftovers of a killed predecessor
        noop = NoopRunner()
        self.reports = HeldReports(self.transport)
        if settings.spark_ui:
            # The drivers inherit this process's environment: a setting given in the YAML file
            # reaches them this way too.
            os.environ[SPARK_UI_ENV] = "true"
        self.task_metrics = TaskMetrics(self.client, advertised_host=metrics.advertised_host(settings))
        launch = drivers()
        self.supervisors = {
            tm: TaskSupervisor(
                taskmanager_id=tm,
                slots=self.slots,
                transport=self.transport,
                workdir=self.workdir,
                cancel_timeout_s=settings.task_cancel_timeout_s,
                noop=noop,
                drivers=launch,
                startup_timeout_s=settings.task_startup_timeout_s,
                reports=self.reports,
                metrics=self.task_metrics,
            )
            for tm in self.ids
        }

    def commands(self, artifacts: ArtifactChecker | None) -> Celery:
        """The Celery app whose commands go to the supervisors (an artifact checked by `artifacts`)."""
        app = celery_app(self.settings, self.reports, self.routes[streams.DLQ_STREAM])
        intake = CommandIntake(
            supervisors=self.supervisors,
            fence=LeaderEpochFence.from_redis(self.client),
            transport=self.transport,
            dead_letter_client=self.client,
            auth=self.auth,
            dead_letter_stream=self.routes[streams.DLQ_STREAM],
            artifacts=artifacts,
        )
        register_commands(app, intake)
        self.task_metrics.registry.register(TaskManagerCollector(self.supervisors, self.client))
        return app

    def serve_metrics(self, guard: LogGuard | None) -> str | None:
        """Serve the metrics and the logs (to requests `guard` lets through); the advertised address."""
        # Its own log file and its drivers' (DriverProcess writes them to <workdir>/logs), served only
        # to the dispatcher's requests signed with this TaskManager's command key (shared/log_access.py).
        self.logs = LogFiles.of_this_process(self.workdir / "logs", main=self.settings.log_file)
        service = f"taskmanager {self.base_id}"
        metrics.serve(
            self.task_metrics.registry,
            host=self.settings.metrics_host,
            port=self.settings.taskmanager_metrics_port,
            service=service,
            logs=self.logs,
            log_guard=guard,
        )
        return metrics.advertised_url(service, self.settings)

    def link(
        self, *, queue_of: Callable[[str], str], log_endpoint: str | None, simulated: bool = False
    ) -> ResourceManagerLink:
        settings = self.settings
        return ResourceManagerLink(
            client=self.client,
            transport=self.transport,
            supervisors=self.supervisors,
            slots=self.slots,
            cores=settings.taskmanager_cores,
            memory_bytes=settings.taskmanager_memory_bytes,
            interval_s=settings.heartbeat_interval_s,
            timeout_s=settings.heartbeat_timeout_s,
            liveness_name=self.liveness_name,
            simulated=simulated,
            queue_of=queue_of,
            liveness=self.liveness,
            log_endpoint=log_endpoint,
            main_log=self.logs.main_name,
        )

    def work(
        self,
        app: Celery,
        link: ResourceManagerLink,
        queues: list[str],
        *,
        started: str = "",
        without_heartbeat: bool = False,
        announcer: EndpointAnnouncer | None = None,
        sandbox: DriverSandbox | None = None,
    ) -> None:
        """Start the link and the supervisors, consume `queues` until the worker stops, then stop
        everything (`announcer`'s keys, the link, the supervisors and what `sandbox` left)."""
        base_id, settings = self.base_id, self.settings
        link.start()
        for sup in self.supervisors.values():
            sup.start()
        log.info("TaskManager %s started: %d slots%s", base_id, self.slots, started)
        gc_tuning.tune()
        worker = app.Worker(
            queues=queues,
            pool="solo",
            concurrency=1,
            hostname=f"{base_id}@{socket.gethostname()}",
            without_gossip=True,
            without_mingle=True,
            without_heartbeat=without_heartbeat,
            loglevel=settings.log_level.upper(),
            quiet=True,
        )
        try:
            worker.start()
        finally:
            log.info("TaskManager %s stopping", base_id)
            if announcer is not None:
                announcer.stop()
            link.stop(unregister=True)
            for sup in self.supervisors.values():
                sup.shutdown()
            if sandbox is not None:  # what left its driver's session and cgroup-less tracking missed
                sweep_drivers(settings, base_id, self.workdir)
            remove_driver_dirs(self.workdir / "drivers")
            self.liveness.close()


def run(settings: Settings, *, slots: int | None = None, taskmanager_id: str | None = None) -> None:
    configure_logging("taskmanager", settings.log_level)
    slots = slots or settings.taskmanager_slots
    base_id = TaskManagerId(taskmanager_id) if taskmanager_id else new_taskmanager_id()
    auth = keys_or_exit(settings, base_id, [base_id])
    try:
        SparkRuntime.from_settings(settings).check()
    except MissingJars as exc:
        log.error("TaskManager %s cannot start: %s", base_id, exc)
        raise SystemExit(EXIT_NO_JARS) from None
    parts = ProcessParts(settings, base_id, [base_id], slots, auth)
    workdir = parts.workdir
    # The drivers' user, cgroups, memory limit and log cap; exits here if they cannot be had.
    sandbox = start_sandbox(settings, base_id, workdir)
    parts.supervise(lambda: driver_launch(settings, slots, start_up_args(settings, workdir), sandbox))
    app = parts.commands(ArtifactChecker(settings.artifacts))
    address = parts.serve_metrics(
        LogGuard(request_key=auth.command_key(base_id), answer_key=auth.sender_key(taskmanager_sender(base_id)))
    )
    link = parts.link(queue_of=streams.tm_queue, log_endpoint=address)
    announcer = None
    if address is not None:
        announcer = EndpointAnnouncer(
            parts.client,
            [base_id],
            address=address,
            main_log=parts.logs.main_name,
            interval_s=settings.heartbeat_interval_s,
            ttl_s=settings.heartbeat_timeout_s,
        ).start()
    check_storage(settings, base_id, parts.client, announcer)
    parts.work(app, link, [streams.tm_queue(base_id)], announcer=announcer, sandbox=sandbox)


if __name__ == "__main__":
    run(load_settings())
