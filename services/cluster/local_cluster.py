"""A whole Headrace cluster as local child processes: `headrace up` and `headrace demo`.

Starts a redis-server on a free port (unless a Redis URL is configured), in ZooKeeper mode a
PostgreSQL catalog server (unless a catalog URL is configured: services/cluster/catalog_server.py),
migrates the catalog, then one JobManager (or, in ZooKeeper mode, a ZooKeeper server unless a quorum
is configured and several JobManagers that elect a leader), one ResourceManager, N TaskManagers and the
dispatcher, each a separate process in its own process group with its log under the run
directory (services/cluster/child_processes.py). Stopping ends supervision, then sends SIGTERM to
every group (the TaskManagers stop their Spark drivers), waits, then SIGKILLs what is left: no
orphan JVMs.

The redis-server it starts keeps its data in $HEADRACE_HOME/redis (AOF, fsync every second), so
streams, consumer groups with their pending entries and the dead letters survive a restart of
it. Unless `redis_auth` is off it requires a password, and each service connects as its own
ACL user (services/cluster/redis_auth.py): the children read <run>/<service>.yaml (0600), the admin URL
is in <run>/config.yaml and `LocalCluster.redis_url`, and nothing prints a password.

With `kafka` on, a Kafka broker (services/cluster/kafka_broker.py) runs beside them on
`kafka_port`, its data in $HEADRACE_HOME/kafka, and every service's configuration names it as
`pipeline_kafka_bootstrap_servers`, which the JobManager hands to each task.

`supervise()` (as `headrace up` does) restarts any child that exits, with a
backoff (services/cluster/process_supervisor.py); the infrastructure children (redis, postgres,
zookeeper, spark-*, kafka) come back on the same data directories.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from services.cluster import (
    catalog_server,
    child_processes,
    infrastructure,
    kafka_broker,
    readiness,
    redis_auth,
    spark_standalone,
    taskmanager_credentials,
)
from services.cluster.child_processes import Child
from services.cluster.infrastructure import ClusterError
from services.cluster.pinned_ports import PinnedPorts, role_of
from services.cluster.pipeline_database import local_directory
from services.cluster.process_supervisor import RestartPolicy, Supervisor
from services.taskmanager.drivers import task_processes
from shared.catalog import Catalog
from shared.jars import MissingJars
from shared.message_auth import load_secret
from shared.pipeline_databases import database_path, sqlite_url
from shared.ports import free_port
from shared.settings import Settings
from shared.spark_runtime import SparkRuntime

SQLITE_WITH_HA = (
    "high availability needs a catalog that a paused JobManager cannot lock up, and an SQLite catalog "
    "stays locked while a JobManager stopped inside a write transaction sleeps, so no standby can take "
    "over: unset HEADRACE_CATALOG_URL (headrace up --ha then runs a PostgreSQL catalog of its own) or "
    "set it to a PostgreSQL URL"
)


@dataclass
class LocalCluster:
    settings: Settings
    taskmanagers: int = 2
    slots: int | None = None
    jobmanagers: int = 1
    ha: bool = False  # ZooKeeper mode even if the settings say standalone
    # Addresses the private redis-server listens on (besides loopback: one that TaskManagers on
    # other hosts reach; it always requires a password unless redis_auth is off).
    redis_bind: tuple[str, ...] = ("127.0.0.1",)
    zookeeper_bind: str = "127.0.0.1"  # 0.0.0.0: JobManagers on other hosts reach the private ZooKeeper
    spark_workers: int = 0  # >0: a Spark standalone master and this many workers run the tasks' executors
    spark_worker_cores: int = 1
    spark_worker_memory: str = "1g"
    kafka: bool = False  # a Kafka broker beside the cluster, its address the pipelines' default
    # Ports otherwise chosen free at each start (`headrace up --redis-port`, `--zookeeper-port`,
    # `--metrics-port-base`): fixed ones for firewalls, and for shared hosts where each cluster
    # keeps its own.
    redis_port: int | None = None
    zookeeper_port: int | None = None
    metrics_port_base: int | None = None
    run_dir: Path | None = None
    children: list[Child] = field(default_factory=list)
    redis_url: str = ""
    dispatcher_url: str = ""
    zookeeper_quorum: str | None = None
    spark_master: spark_standalone.MasterAddress | None = None
    kafka_spec: kafka_broker.BrokerSpec | None = None  # set by start() when kafka is on
    catalog_url: str = field(default="", repr=False)  # set by start(): the configured one or its own server's
    service_redis_urls: dict = field(default_factory=dict, repr=False)  # role -> URL with its user
    metrics_urls: dict = field(default_factory=dict)  # child name -> its Prometheus endpoint
    supervisor: Supervisor | None = None
    _env: dict = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)  # guards children
    _describing: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def runs_catalog_server(self) -> bool:
        """ZooKeeper mode without a configured catalog: a PostgreSQL server of its own
        (services/cluster/catalog_server.py says why not the SQLite file)."""
        return self.high_availability and "catalog_url" not in self.settings.model_fields_set

    @property
    def high_availability(self) -> bool:
        return self.ha or self.settings.high_availability == "zookeeper"

    @property
    def pipeline_databases(self) -> Path | None:
        """The directory of the lineages' own SQLite databases, or None when the pipelines'
        database is configured (`pipeline_catalog_url`)."""
        return local_directory(self.settings)

    def pipeline_database_url(self, lineage: str) -> str:
        """The database a job of `lineage` writes (a fresh job's lineage is its id): the configured
        one, else the lineage's own SQLite file."""
        directory = self.pipeline_databases
        if directory is None:
            return self.settings.pipeline_catalog_url or ""
        return sqlite_url(database_path(directory, lineage))

    def planned_children(self) -> list[str]:
        """The processes start() runs for these settings, by name (the compose stack is checked
        against this list: tests/integration/test_compose_topology.py)."""
        s = self.settings
        names = [] if "redis_url" in s.model_fields_set else ["redis"]
        if self.runs_catalog_server:
            names.append(catalog_server.CHILD)
        if self.high_availability and not s.zookeeper_quorum:
            names.append("zookeeper")
        if self.spark_workers > 0:
            names += ["spark-master", *(f"spark-worker-{i + 1}" for i in range(self.spark_workers))]
        if self.kafka:
            names.append("kafka")
        names.append("resourcemanager")
        names += ["jobmanager" if i == 0 else f"jobmanager-{i + 1}" for i in range(self.jobmanagers)]
        names += [f"taskmanager-{i + 1}" for i in range(self.taskmanagers)]
        return names + ["dispatcher"]

    def start(self, *, wait_s: float = 60.0, echo=print) -> "LocalCluster":
        s = self.settings
        if self.high_availability and not self.runs_catalog_server and s.catalog.startswith("sqlite"):
            raise ClusterError(SQLITE_WITH_HA)
        try:  # before anything starts: a TaskManager would exit for the same reason, less visibly
            SparkRuntime.from_settings(s).check()
        except MissingJars as exc:
            raise ClusterError(str(exc)) from None
        broker = infrastructure.kafka_spec(s) if self.kafka else None
        if broker is not None:
            infrastructure.check_kafka(s, broker)
        infrastructure.check_pinned_ports(self.pinned_ports())
        self.run_dir = self.run_dir or s.home / "runs" / time.strftime("%Y%m%d-%H%M%S")
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if "redis_url" in s.model_fields_set:
            self.redis_url = s.redis_url  # the user's Redis: its persistence and ACLs are theirs to set
            self.service_redis_urls = dict.fromkeys(redis_auth.SERVICES, s.redis_url)
        else:
            urls = infrastructure.start_redis(
                s, self._spawn, env, taskmanager_ids=self._taskmanager_ids(), bind=self.redis_bind, port=self.redis_port
            )
            self.redis_url, self.service_redis_urls = urls.admin, urls.by_user
        self.catalog_url = s.catalog
        if self.runs_catalog_server:
            server, child = catalog_server.start(s, self._spawn, env)
            self.catalog_url = catalog_server.wait_until_ready(
                server, alive=lambda: child.proc.poll() is None, log=child.log
            )
        config = s.model_dump(mode="json") | {"redis_url": self.redis_url, "catalog_url": self.catalog_url}
        if self.pipeline_databases is not None:
            config["pipeline_databases_dir"] = str(self.pipeline_databases)
        if redis_auth.PIPELINE in self.service_redis_urls:
            config["pipeline_redis_url"] = self.service_redis_urls[redis_auth.PIPELINE]
        if self.high_availability:
            self.zookeeper_quorum = s.zookeeper_quorum or infrastructure.start_zookeeper(
                self._spawn, env, self.run_path / "zookeeper", self.zookeeper_bind, port=self.zookeeper_port
            )
            config |= {"high_availability": "zookeeper", "zookeeper_quorum": self.zookeeper_quorum}
        if self.spark_workers > 0:
            master = self.spark_master = infrastructure.start_spark(
                self._spawn,
                env,
                self.run_path,
                workers=self.spark_workers,
                worker_cores=self.spark_worker_cores,
                worker_memory=self.spark_worker_memory,
            )
            config |= {"spark_master": master.url, "spark_master_ui": master.webui}
        broker_child = None
        if broker is not None:  # waited for below, while the services start
            broker_child = infrastructure.start_kafka(s, broker, self._spawn, env)
            self.kafka_spec = broker
            config["pipeline_kafka_bootstrap_servers"] = broker.bootstrap
        write_service_configs(
            self.run_dir,
            config,
            self.service_redis_urls,
            self._taskmanager_ids(),
            self.redis_url,
            load_secret(s, create=True),
        )
        self._env = env = children_env(env, self.run_dir / "config.yaml")
        Catalog(self.catalog_url).migrate()
        py = [sys.executable, "-m", "services.cli"]
        self._spawn("resourcemanager", py + ["resourcemanager"], self._metrics_env("resourcemanager", env))
        for i in range(self.jobmanagers):
            name = "jobmanager" if i == 0 else f"jobmanager-{i + 1}"
            self._spawn(name, py + ["jobmanager"], self._metrics_env(name, env))
        slots = self.slots or s.taskmanager_slots
        for i in range(self.taskmanagers):
            name = f"taskmanager-{i + 1}"
            self._spawn(
                name, py + ["taskmanager", "--slots", str(slots), "--id", f"tm-{i + 1}"], self._metrics_env(name, env)
            )
        self._spawn("dispatcher", py + ["dispatcher"], env)
        self.dispatcher_url = f"http://{s.dispatcher_host}:{s.dispatcher_port}"
        self.metrics_urls["dispatcher"] = f"{self.dispatcher_url}/metrics"
        problem = readiness.wait_until_ready(
            self.dispatcher_url, self.children, self.taskmanagers, self.catalog_url, wait_s, self.run_dir / "logs"
        )
        if problem is not None:
            raise ClusterError(problem)
        if broker is not None and broker_child is not None:
            infrastructure.wait_kafka(broker, broker_child)
        self.write_description()
        return self

    @property
    def kafka_bootstrap(self) -> str | None:
        """The broker's address (host:port) once start() started one."""
        return self.kafka_spec.bootstrap if self.kafka_spec is not None else None

    @property
    def run_path(self) -> Path:
        """The run's directory (configs, logs, cluster.json): chosen by start()."""
        if self.run_dir is None:
            raise ClusterError("the cluster has not been started: it has no run directory yet")
        return self.run_dir

    def _taskmanager_ids(self) -> list[str]:
        return [f"tm-{i + 1}" for i in range(self.taskmanagers)]

    def pinned_ports(self) -> dict[str, int]:
        """The ports fixed instead of chosen free, by what will listen there."""
        return self._ports().all()

    def _ports(self) -> PinnedPorts:
        return PinnedPorts(
            self.settings, tuple(self.planned_children()), self.redis_port, self.zookeeper_port, self.metrics_port_base
        )

    def _metrics_env(self, name: str, env: dict) -> dict:
        """Several members of one role run on this host: each gets its own metrics port, pinned or
        free (kept across respawns, which reuse the child's environment), unless metrics are off."""
        role = role_of(name)
        key = f"{role}_metrics_port"
        if getattr(self.settings, key) == -1:
            return env
        port = self._ports().metrics().get(name) or free_port()
        self.metrics_urls[name] = f"http://{self.settings.metrics_host}:{port}/metrics"
        return env | {f"HEADRACE_{key.upper()}": str(port)}

    def describe(self) -> dict:
        """What cluster.json says: where each part listens, the processes, the supervision."""
        with self._lock:
            out = describe(self)
        if self.supervisor is not None:
            out["supervision"] = self.supervisor.view()
        return out

    def write_description(self) -> None:
        text = json.dumps(self.describe(), indent=2)
        with self._describing:  # the supervisor's thread writes it too
            redis_auth.write_private(self.run_path / "cluster.json", text)

    def supervise(self, *, policy: RestartPolicy | None = None, notify=None) -> Supervisor:
        """From now on restart every child that exits, until stop()."""
        if self.supervisor is None:
            self.supervisor = Supervisor(self, policy=policy, notify=notify).start()
            self.write_description()
        return self.supervisor

    # --- what the supervisor sees (process_supervisor.Supervised) ---

    def live_children(self) -> dict[str, tuple[int, int | None, Path]]:
        with self._lock:
            return {c.name: (c.proc.pid, c.proc.poll(), c.log) for c in self.children}

    def restart(self, name: str) -> None:
        self.respawn(name)

    def supervision_changed(self) -> None:
        try:
            self.write_description()
        except OSError:
            pass  # cluster.json is informative; a full disk must not stop supervision

    def respawn(self, name: str) -> Child:
        """Start a stopped (or killed) member again with the same command and environment."""
        with self._lock:
            old = self.child(name)
            if old.proc.poll() is None:
                raise ClusterError(f"{name} is still running (pid {old.proc.pid})")
            child_processes.prepare_respawn(old)
            self.children.remove(old)
            new = self._spawn(name, old.cmd, old.env or self._env)
        new.shutdown_signal = old.shutdown_signal
        return new

    def _spawn(self, name: str, cmd: list[str], env: dict) -> Child:
        child = child_processes.spawn(name, cmd, env, self.run_path)
        with self._lock:
            self.children.append(child)
        return child

    def child(self, name: str) -> Child:
        with self._lock:
            return next(c for c in self.children if c.name == name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        os.killpg(self.child(name).proc.pid, sig)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()  # first: nothing may be restarted while the cluster stops
        with self._lock:
            children = list(self.children)
        child_processes.stop_in_order(children, timeout_s, after_taskmanagers=self._sweep_task_processes)

    def _sweep_task_processes(self) -> None:
        """What a pipeline started outside its driver's session ends with the TaskManagers."""
        workdir = self.settings.workdir
        task_processes.sweep(workdir, task_processes.cluster_cgroups(workdir))

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def write_service_configs(
    run_dir: Path,
    config: dict,
    service_redis_urls: dict[str, str],
    taskmanager_ids: list[str],
    admin_redis_url: str,
    secret: bytes,
) -> None:
    """config.yaml (the operator's: the admin Redis URL), one file per service with its own Redis
    user, and one per TaskManager with only its own credentials, never the cluster secret. Every
    file holds a Redis password once auth is on: owner-only, like the credentials."""
    redis_auth.write_private(run_dir / "config.yaml", yaml.safe_dump(config))
    for role in redis_auth.SERVICES:
        redis_auth.write_private(
            run_dir / f"{role}.yaml", yaml.safe_dump(config | {"redis_url": service_redis_urls[role]})
        )
    for tm in taskmanager_ids:
        tm_config = taskmanager_credentials.taskmanager_config(
            config, tm, service_redis_urls.get(tm, admin_redis_url), secret
        )
        redis_auth.write_private(run_dir / f"{tm}.yaml", yaml.safe_dump(tm_config))


def children_env(env: dict[str, str], config_path: Path) -> dict[str, str]:
    """The services' environment: they read `config_path`; inherited HEADRACE_ overrides that
    would contradict it are dropped (the log level stays)."""
    kept = {k: v for k, v in env.items() if not k.startswith("HEADRACE_") or k == "HEADRACE_LOG_LEVEL"}
    return kept | {"HEADRACE_CONFIG": str(config_path)}


def describe(cluster: LocalCluster) -> dict:
    """Where each part of `cluster` listens and its processes (the caller holds its lock)."""
    out = {
        "dispatcher": cluster.dispatcher_url,
        "redis": redis_auth.masked(cluster.redis_url),
        "redis_port": urlsplit(cluster.redis_url).port,
        "catalog": redis_auth.masked(cluster.catalog_url or cluster.settings.catalog),
        "zookeeper": cluster.zookeeper_quorum,
        "pipeline_databases": str(cluster.pipeline_databases) if cluster.pipeline_databases else None,
        "run_dir": str(cluster.run_dir),
        "processes": {c.name: c.proc.pid for c in cluster.children},
        "metrics": dict(cluster.metrics_urls),
    }
    if cluster.spark_master is not None:
        out["spark"] = {
            "master": cluster.spark_master.url,
            "ui": cluster.spark_master.webui,
            "workers": cluster.spark_workers,
        }
    if cluster.kafka_spec is not None:
        out["kafka"] = {"bootstrap": cluster.kafka_spec.bootstrap, "data_dir": str(cluster.kafka_spec.data_dir)}
    return out
